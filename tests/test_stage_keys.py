"""What reruns a stage, generated from the declaration (pipeline.declaration) for every
stage of the rebuild, on a copy of the repository and of the tiny rebuilt workdir:

- rerun: an edit to its computing module, an edit to a module it reaches only
  indirectly, a change of a config option it reads, a new version of a library its code
  imports (simulated);
- no rerun: an edit to a publishing module (its publisher, the plots, the registry), an
  edit to another stage's computing module, a change of a config option it does not
  read, a new Prefect or MLflow (simulated).

The sweeps' steps are keyed by the same code (tests/test_ablation_flow.py retrains an
ablation model after an edit its training reaches)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

from mule.config.overrides import apply_overrides
from mule.config.resolution import resolve
from mule.config.sections import flatten
from mule.mule_core.settings import ConfigError
from mule.pipeline import decisions
from mule.pipeline.declaration import BY_NAME, REBUILD
from mule.storage import code_digests
from mule.storage.code_digests import closure
from tests.conftest import REBUILT_TINY

PUBLISHING = ("pipeline/publish.py", "experiments/plots.py", "experiments/registry.py", "experiments/report.py",
              "experiments/tracking.py")  # fmt: skip


@pytest.fixture(scope="module")
def workdir(rebuilt_as_built, tmp_path_factory):
    """A copy of the rebuilt workdir (deciding keeps a cache of file digests in it)."""
    from mule.experiments.relocation import adopt
    from mule.storage.workdir import Workdir

    copy = tmp_path_factory.mktemp("keys") / "work"
    shutil.copytree(rebuilt_as_built[0].root, copy)
    wd = Workdir.at(copy)
    adopt(wd)
    return wd


@contextmanager
def edited(repo: Path, relative: str):
    """The file with one more line, for the time of the block; the keys forget what they read."""
    path = repo / relative
    original = path.read_bytes()
    path.write_bytes(original + b"\nEDITED = True  # an edit\n")
    code_digests.forget()
    try:
        yield
    finally:
        path.write_bytes(original)
        code_digests.forget()


@contextmanager
def upgraded(monkeypatch, *distributions: str):
    """These distributions report a new version, for the time of the block."""
    real = code_digests.installed_version
    monkeypatch.setattr(code_digests, "installed_version",
                        lambda dist: "999.0" if dist.lower() in distributions else real(dist))  # fmt: skip
    code_digests.forget()
    try:
        yield
    finally:
        monkeypatch.setattr(code_digests, "installed_version", real)
        code_digests.forget()


def _mutated(value):
    """Another valid-looking value of the same type (None for types left alone)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 if value else 0.5
    return None


def _options(cfg, reads: bool, stage) -> list[tuple[str, object]]:
    """(option, new value) for the options the stage reads (or does not), each mutation
    valid under the config's checks."""
    excluded = stage.operational | stage.ignores
    found = []
    for key in sorted(flatten(cfg)):
        section, _, name = key.partition(".")
        if not name:
            continue
        if key == "train.threads":  # keyed by the count it resolves to: its own test, below
            continue
        read = key not in excluded and any(key == w or (w.endswith(".") and key.startswith(w)) for w in stage.config)
        new = _mutated(getattr(getattr(cfg, section), name))
        if read != reads or new is None:
            continue
        try:
            apply_overrides(cfg, {key: new})
        except ConfigError:
            continue
        found.append((key, new))
    return found


def _first_per_section(options: list[tuple[str, object]]) -> list[tuple[str, object]]:
    seen: dict[str, tuple[str, object]] = {}
    for key, value in options:
        seen.setdefault(key.partition(".")[0], (key, value))
    return list(seen.values())


def _repo_file(module: str) -> str:
    return str(code_digests.module_path(module).relative_to(code_digests.REPO))


@pytest.mark.parametrize("name", REBUILD)
def test_what_reruns_a_stage_and_what_does_not(name, workdir, repo_copy, monkeypatch):
    stage, cfg = BY_NAME[name], resolve("demo", REBUILT_TINY)

    def decide(config=cfg) -> decisions.Decision:
        return decisions.decide(workdir, config, name, repo=repo_copy)

    assert not decide().run, decide().reason  # as built: reused

    # Its own computing code, and a module it reaches only through others.
    own = _repo_file(stage.module)
    with edited(repo_copy, own):
        assert decide().reason == f"code {own} changed"
    modules = closure(stage.module, repo_copy)[0]
    direct = code_digests._imported_names(modules[stage.module], stage.module, False)
    indirect = sorted(str(path.relative_to(repo_copy)) for module, path in modules.items()
                      if module not in direct and module != stage.module and path.name != "__init__.py")  # fmt: skip
    assert indirect, f"{name} reaches nothing indirectly?"
    deep = next((f for f in indirect if f.startswith("mule_core/")), indirect[0])  # the model library, if reached
    with edited(repo_copy, deep):
        assert decide().reason == f"code {deep} changed"

    # An option it reads (one per section it reads), and options it does not (one per section).
    read, unread = _first_per_section(_options(cfg, True, stage)), _first_per_section(_options(cfg, False, stage))
    assert read and unread
    for key, value in read:
        assert decide(apply_overrides(cfg, {key: value})).reason.startswith(f"{key} "), key
    for key, value in unread:
        assert not decide(apply_overrides(cfg, {key: value})).run, key

    # A library its code imports, upgraded; Prefect and MLflow upgraded.
    parts = decisions.code_parts(stage, repo_copy)
    libraries = sorted(k.removeprefix("code library ") for k in parts if k.startswith("code library "))
    library = "torch" if "torch" in libraries else libraries[0]
    with upgraded(monkeypatch, library.lower()):
        assert decide().reason == f"code library {library} {parts[f'code library {library}']} -> 999.0"
    with upgraded(monkeypatch, "prefect", "mlflow", "mlflow-skinny", "prefect-dask", "dask", "distributed"):
        assert not decide().run
    assert not any(k.startswith(("code library prefect", "code library mlflow")) for k in parts)

    # Publishing, and another stage's code.
    for publishing in PUBLISHING:
        with edited(repo_copy, publishing):
            assert not decide().run, publishing
    others = [_repo_file(BY_NAME[s].module) for s in REBUILD
              if s != name and BY_NAME[s].module not in modules]  # fmt: skip
    assert others
    for other in others:
        with edited(repo_copy, other):
            assert not decide().run, other


def test_the_features_identity_is_the_extraction_code_not_the_stage_s(workdir, repo_copy):
    """An edit to how the features stage plans and records its work reruns the stage; only
    an edit to the code that turns an image into a vector (or new weights, or a library)
    makes other vectors, under another identity."""
    from mule.tasks.shared import extraction

    identity = code_digests.code_digest(extraction.__name__, repo_copy)
    with edited(repo_copy, "tasks/features.py"):
        assert code_digests.code_digest(extraction.__name__, repo_copy) == identity
    with edited(repo_copy, "mule_core/backbones.py"):
        assert code_digests.code_digest(extraction.__name__, repo_copy) != identity
    with edited(repo_copy, "storage/atomic.py"):  # how tables are written: not how vectors are made
        assert code_digests.code_digest(extraction.__name__, repo_copy) == identity
    # the identity's name changes with the setting, the weights and the code
    from mule.mule_core.extractor_names import identity_name

    f = resolve("demo").features
    name = identity_name(f, {"weights_digest": "a", "code": {"file x": "1"}})
    assert identity_name(f, {"weights_digest": "b", "code": {"file x": "1"}}) != name
    assert identity_name(f, {"weights_digest": "a", "code": {"file x": "2"}}) != name
    assert identity_name(dataclasses.replace(f, crops=10), {"weights_digest": "a", "code": {"file x": "1"}}) != name
    # and with the arithmetic: bfloat16 autocast on CUDA, float32 by PyTorch and by ONNX
    # Runtime on the CPU (within 1e-4 of each other, tests/test_backbones.py: not the same)
    import torch

    from mule.mule_core.backbones import numerics
    from mule.tasks.features import extractor_identity

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    made_in = [numerics(cpu, "torch"), numerics(cpu, "onnxruntime"), numerics(cuda, "torch")]
    assert made_in == ["float32-torch", "float32-onnxruntime", "bfloat16-autocast"]
    weights = {"weights": "imagenet", "sha256": "a"}
    assert len({extractor_identity(f, weights, arithmetic)[0] for arithmetic in made_in}) == 3


def test_a_stage_s_cpu_seconds_count_the_processes_it_waited_for():
    """The text stage trains fastText in processes of its own: their CPU-seconds are the
    stage's too, though they are not this process's."""
    import subprocess
    import sys
    import time

    from mule.pipeline.runner import cpu_time

    before, own_before = cpu_time(), time.process_time()
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"],
                   check=True)  # fmt: skip
    assert time.process_time() - own_before < 0.2  # this process only waited
    assert cpu_time() - before >= 0.5


def test_keys_name_the_device_and_arithmetic_a_model_trains_in_not_the_machine_s_threads(workdir, monkeypatch):
    """A workdir copied to a bigger machine, taskset or a container's CPU limit change the
    threads torch takes: nothing retrains. Training on CUDA (in float16 autocast, or in
    float32 with train.amp off) instead of the CPU makes another model: its stages run."""
    from mule.mule_core.devices import cpu_threads

    cfg = resolve("demo", REBUILT_TINY)
    used = cpu_threads(0)
    monkeypatch.setenv("OMP_NUM_THREADS", str(used + 1))
    for name in ("pretrain", "train", "text", "evaluate"):
        assert not decisions.decide(workdir, cfg, name).run, name
    assert not decisions.decide(workdir, apply_overrides(cfg, {"train.threads": used + 2}), "train").run
    record = decisions.read_record(workdir, cfg, "train")
    assert record["cpu_threads"] == used  # recorded, not keyed
    # its CPU-seconds beside its seconds: at most every core busy all along
    assert 0 < record["cpu_seconds"] <= record["seconds"] * os.cpu_count() + 1.0
    on_gpu = apply_overrides(cfg, {"train.device": "cuda"})
    for name in ("pretrain", "train"):
        assert decisions.decide(workdir, on_gpu, name).reason == "runtime arithmetic cpu float32 -> cuda float16-autocast"
    assert decisions.decide(workdir, apply_overrides(on_gpu, {"train.amp": False}), "train").reason.endswith(
        "-> cuda float32")  # fmt: skip
    assert not decisions.decide(workdir, on_gpu, "evaluate").run  # evaluating on a GPU measures the same model
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # auto, with no GPU to see: the CPU, as before
    assert not decisions.decide(workdir, apply_overrides(cfg, {"train.device": "auto"}), "train").run


@pytest.mark.slow
def test_one_and_two_threads_train_the_same_model_within_rounding(workdir, tmp_path):
    """What the thread count changes, now that it is not keyed: a parallel sum split in two
    adds in another order, and training carries the rounding on. The tiny rebuilt workdir's
    joint training on 1 and on 2 threads, against another seed on 1: the threads move every
    weight tensor a fraction of what a seed moves it, and validation mR by less than 2
    (docs/operations.md has the measured figures)."""
    import shutil

    from mule.data_catalog.model_files import load_model
    from mule.pipeline.runner import run_alone
    from mule.storage.workdir import Workdir

    trained = {}
    for label, settings in (("1 thread", {"train.threads": 1}), ("2 threads", {"train.threads": 2}),
                            ("another seed", {"train.threads": 1, "train.seed": 1})):  # fmt: skip
        copy = Workdir.at(shutil.copytree(workdir.root, tmp_path / label.replace(" ", "-")))
        cfg = apply_overrides(resolve("demo", REBUILT_TINY), settings)
        if "train.seed" in settings:
            run_alone(copy, cfg, "pretrain")  # a seed's own LP model
        result = run_alone(copy, cfg, "train")
        trained[label] = (load_model(copy.model_path("embedded", "model"))[0].state_dict(), result["val_mean_mR"])

    def distance(a: str, b: str) -> float:
        one, two = trained[a][0], trained[b][0]
        return max(((one[k].float() - two[k].float()).norm() / (one[k].float().norm() + 1e-12)).item() for k in one)

    threads, seed = distance("1 thread", "2 threads"), distance("1 thread", "another seed")
    print(f"1 vs 2 threads: largest relative change {threads:.4f}, val mR {trained['1 thread'][1]:.2f} vs "
          f"{trained['2 threads'][1]:.2f}; another seed: {seed:.4f}, val mR {trained['another seed'][1]:.2f}")
    assert threads < seed / 4, (threads, seed)
    assert abs(trained["1 thread"][1] - trained["2 threads"][1]) < 2.0
