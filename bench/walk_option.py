"""How a config option travels from the command line to the code that uses it: the
stack of mule's own frames when `mule run train --set train.epochs=N` constructs the
joint training's Trainer, or, with `--option add.words`, when `mule run add-language
--lang cs --set add.words=N` hands the words of the aligned start to `aligned_start`
(`train.add_words` in checkouts before the `add` section), with the files, the calls,
the floors (rooms) it passes and the closures on the way. Runs `mule` in this process on
a fresh workdir at the tests' tiny sizes (the whole pipeline, 1-2 minutes on 2 cores;
the addition another 1-2), so it measures any checkout, an old commit's included
(`python bench/walk_option.py --repo /tmp/before`).

    python bench/walk_option.py [--repo CHECKOUT] [--workdir DIR] [--option train.epochs|add.words]
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
    parser.add_argument("--option", default="train.epochs", choices=("train.epochs", "add.words"))
    args = parser.parse_args()
    repo = Path(args.repo).resolve()
    os.environ.setdefault("MULE_PREFECT_EARLY_START", "1")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="mule-walk-"))
    import importlib

    from mule.commands.main import main as mule  # the installed mule: point it at --repo with an editable install

    walks: list[list[Frame]] = []

    def stack_here() -> list[Frame]:
        stack, frame = [], sys._getframe(2)
        while frame is not None:  # (file, line, qualified name): a closure's name says where it was made
            stack.append(Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_qualname))
            frame = frame.f_back
        return stack[::-1]

    sections = (repo / "config" / "sections.py").read_text()
    old_names = {} if "class VectorsConfig" in sections else {"vectors.fasttext_epochs": "text.fasttext_epochs"}
    sets = [x for k, v in TINY.items() for x in ("--set", f"{old_names.get(k, k)}={v}")]
    if args.option == "train.epochs":
        Trainer = _trainer_class(repo, importlib)
        original = Trainer.__init__

        def spying(self, *a, **k):
            stack = stack_here()
            if any(f.filename.endswith(("/stages/train.py", "/tasks/train.py")) for f in stack):
                walks.append(stack)
            return original(self, *a, **k)

        Trainer.__init__ = spying
        code = mule(["run", "all", "--workdir", str(workdir), *sets])
        Trainer.__init__ = original
        target = "the Trainer"
    else:
        import subprocess  # a command's temporary Prefect server is one a process: the rebuild in its own

        subprocess.run([sys.executable, "-m", "mule.commands.main", "run", "all", "--workdir", str(workdir), *sets],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        extend = importlib.import_module("mule.tasks.extend")  # calls aligned_start by the name it imported
        original = extend.aligned_start

        def spying(*a, **k):
            walks.append(stack_here())
            return original(*a, **k)

        extend.aligned_start = spying
        name = "add.words" if "class AddConfig" in sections else "train.add_words"
        code = mule(["run", "add-language", "--lang", "cs", "--workdir", str(workdir), *sets, "--set", f"{name}=2000"])
        extend.aligned_start = original
        target = f"aligned_start (as {name})"
    assert code == 0 and walks, f"mule run ended {code}; {target} seen {len(walks)} times"
    stack = walks[0][next(i for i, f in enumerate(walks[0]) if f.filename.endswith("commands/main.py")):]
    frames = [f for f in stack if f.filename.startswith(str(repo)) and "site-packages" not in f.filename]
    libraries = len(stack) - len(frames)
    files = list(dict.fromkeys(str(Path(f.filename).relative_to(repo)) for f in frames))
    rooms = [Path(f.filename).relative_to(repo).parts[0] for f in frames]
    changes = [r for i, r in enumerate(rooms) if i == 0 or r != rooms[i - 1]]
    closures = [f"{Path(f.filename).relative_to(repo)}:{f.name}" for f in frames if "<locals>" in f.name]
    print(f"{repo}: {args.option} from `mule run` to {target}")
    print(f"  {len(frames)} of mule's calls in {len(files)} files (and {libraries} of Prefect's); rooms in order: "
          f"{' -> '.join(changes)}")  # fmt: skip
    print(f"  closures and callbacks on the way: {', '.join(closures) or 'none'}")
    for f in frames:
        print(f"    {Path(f.filename).relative_to(repo)}:{f.lineno} {f.name}")


def _trainer_class(repo: Path, importlib):
    """The class the train stage builds: JointTrainer in mule_core/training/ (since
    2026-12-07) or mule_core/joint_training.py, else the checkout's Trainer (in
    training.py before 2026-11-27)."""
    if (repo / "mule_core" / "training" / "joint.py").exists():
        return importlib.import_module("mule.mule_core.training.joint").JointTrainer
    if (repo / "mule_core" / "joint_training.py").exists():
        return importlib.import_module("mule.mule_core.joint_training").JointTrainer
    name = "trainer" if (repo / "mule_core" / "trainer.py").exists() else "training"
    return importlib.import_module(f"mule.mule_core.{name}").Trainer


if __name__ == "__main__":
    main()
