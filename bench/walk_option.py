"""How a config option travels from the command line to the code that uses it: the
stack of mule's own frames when `mule run train --set train.epochs=N` constructs the
joint training's Trainer, with the files, the calls, the floors (rooms) it passes and
the closures and dynamic imports on the way. Runs `mule` in this process on a fresh
workdir at the tests' tiny sizes (the whole pipeline, 1-2 minutes on 2 cores), so it
measures any checkout, an old commit's included (`python bench/walk_option.py --repo /tmp/before`).

    python bench/walk_option.py [--repo CHECKOUT] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TINY = {"data.train_images": 48, "data.val_images": 16, "data.test_images": 24, "data.image_size": 48,
        "features.input_size": 32, "vectors.fasttext_epochs": 3, "text.word_dim": 64, "pretrain.epochs": 2,
        "train.epochs": 3, "model.lstm_dim": 32, "model.joint_dim": 32, "model.mule_dim": 32}  # fmt: skip


@dataclass
class Frame:
    filename: str
    lineno: int
    name: str


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]), help="the checkout to walk")
    parser.add_argument("--workdir", default="", help="default: a new temporary folder")
    args = parser.parse_args()
    repo = Path(args.repo).resolve()
    os.environ.setdefault("MULE_PREFECT_EARLY_START", "1")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="mule-walk-"))
    import importlib

    from mule.commands.main import main as mule  # the installed mule: point it at --repo with an editable install

    # the class the train stage builds: JointTrainer since 2026-12-06, else the checkout's
    # Trainer (in training.py before 2026-11-27)
    if (repo / "mule_core" / "training" / "joint.py").exists():  # mule_core/training/ since 2026-12-07
        Trainer = importlib.import_module("mule.mule_core.training.joint").JointTrainer
    elif (repo / "mule_core" / "joint_training.py").exists():
        Trainer = importlib.import_module("mule.mule_core.joint_training").JointTrainer
    else:
        name = "trainer" if (repo / "mule_core" / "trainer.py").exists() else "training"
        Trainer = importlib.import_module(f"mule.mule_core.{name}").Trainer
    walks: list[list[Frame]] = []
    original = Trainer.__init__

    def spying(self, *a, **k):
        stack, frame = [], sys._getframe(1)
        while frame is not None:  # (file, line, qualified name): a closure's name says where it was made
            stack.append(Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_qualname))
            frame = frame.f_back
        stack.reverse()
        if any(f.filename.endswith(("/stages/train.py", "/tasks/train.py")) for f in stack):
            walks.append(stack)
        return original(self, *a, **k)

    Trainer.__init__ = spying
    sets = [x for k, v in TINY.items() for x in ("--set", f"{k}={v}")]
    code = mule(["run", "all", "--workdir", str(workdir), *sets])
    Trainer.__init__ = original
    assert code == 0 and walks, f"mule run ended {code}; Trainer for train seen {len(walks)} times"
    stack = walks[0][next(i for i, f in enumerate(walks[0]) if f.filename.endswith("commands/main.py")):]
    frames = [f for f in stack if f.filename.startswith(str(repo)) and "site-packages" not in f.filename]
    libraries = len(stack) - len(frames)
    files = list(dict.fromkeys(str(Path(f.filename).relative_to(repo)) for f in frames))
    rooms = [Path(f.filename).relative_to(repo).parts[0] for f in frames]
    changes = [r for i, r in enumerate(rooms) if i == 0 or r != rooms[i - 1]]
    closures = [f"{Path(f.filename).relative_to(repo)}:{f.name}" for f in frames if "<locals>" in f.name]
    print(f"{repo}: train.epochs from `mule run` to the Trainer")
    print(f"  {len(frames)} of mule's calls in {len(files)} files (and {libraries} of Prefect's); rooms in order: "
          f"{' -> '.join(changes)}")  # fmt: skip
    print(f"  closures and callbacks on the way: {', '.join(closures) or 'none'}")
    for f in frames:
        print(f"    {Path(f.filename).relative_to(repo)}:{f.lineno} {f.name}")


if __name__ == "__main__":
    main()
