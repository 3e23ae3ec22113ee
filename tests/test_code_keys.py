"""A stage's code is what its task module imports, followed through the repository: never
a hand list. Edits are made in a copy of the repository."""

import hashlib
import json
from pathlib import Path

import pytest

from mule.pipeline.declaration import BY_NAME, REBUILD
from mule.storage.code_digests import REPO, closure, code_digest, code_parts
from tests.conftest import edit


def reached(module: str, repo: Path = REPO) -> set[str]:
    return {str(p.relative_to(repo)) for p in closure(module, repo)[0].values()}


def test_train_reaches_what_it_imports_indirectly_and_not_the_rest():
    files = reached(BY_NAME["train"].module)
    # tasks/train.py -> data_catalog/splits.py -> mule_core/vocabulary.py (Vocab, pad_batch); the
    # config through data_catalog/model_files.py: both missing from the old hand list.
    assert {"tasks/train.py", "data_catalog/splits.py", "mule_core/vocabulary.py", "mule_core/settings.py"} <= files
    assert {"tasks/__init__.py", "mule_core/__init__.py"} <= files  # packages run their __init__ first
    assert not files & {"tasks/translate.py", "clients/googletrans.py", "serving/retrieval.py", "flows/stages.py"}
    # nor what turns images into vectors (the features stage's business), nor the model as a
    # function (serving's)
    assert not files & {"tasks/shared/extraction.py", "mule_core/backbones.py", "mule_core/embedder.py"}


def test_no_stage_s_code_reaches_publishing_tracking_or_orchestration():
    """Plots, reports, the registry, MLflow and Prefect follow a stage's computation; none
    of them is part of what computes it, so none of them is part of its key."""
    for stage in BY_NAME.values():
        if not stage.keyed:
            continue
        modules, outside = closure(stage.module)
        packages = {name.split(".")[1] for name in modules if name != "mule"}
        computing = {"tasks", "config", "clients", "datasets", "data_catalog", "generators", "storage", "words",
                     "mule_core"}
        assert packages <= computing, (stage.name, packages - computing)
        assert not outside & {"prefect", "mlflow", "matplotlib", "pandas", "fastapi", "uvicorn"}, (stage.name, outside)


def test_relative_and_lazy_imports_count(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nfrom .sub import b\nfrom . import c\n\n"
                                  "if TYPE_CHECKING:\n    from . import unused\nelse:\n    import json\n\n"
                                  "def f():\n    from mule.pkg.sub.d import g\n")
    (package / "sub" / "b.py").write_text("import numpy\n")
    (package / "c.py").write_text("from .sub.b import x\n")
    (package / "sub" / "d.py").write_text("import os\n")
    (package / "unused.py").write_text("")
    modules, outside = closure("mule.pkg.a", tmp_path)  # the folder pkg, installed as mule.pkg
    # pkg.unused is imported for annotations only (under TYPE_CHECKING): it never runs
    assert set(modules) == {"mule.pkg", "mule.pkg.a", "mule.pkg.sub", "mule.pkg.sub.b", "mule.pkg.c", "mule.pkg.sub.d"}
    assert "json" in outside and "mule" not in outside  # the namespace is the repository, not a library
    assert "numpy" in outside and "library numpy" in code_parts("mule.pkg.a", tmp_path)


def test_an_edit_reruns_the_stages_that_reach_it_and_no_other(repo_copy):
    before = {stage: code_digest(BY_NAME[stage].module, repo_copy) for stage in REBUILD}
    code_parts.cache_clear()
    edit(repo_copy / "mule_core" / "vocabulary.py")  # train reaches it through the model files
    after = {stage: code_digest(BY_NAME[stage].module, repo_copy) for stage in REBUILD}
    changed = {stage for stage in REBUILD if before[stage] != after[stage]}
    assert "train" in changed and "evaluate" in changed and "pretrain" in changed
    assert "features" not in changed  # tasks/features.py never imports the tokenisers

    code_parts.cache_clear()
    edit(repo_copy / "clients" / "googletrans.py")  # the translate stage's network client
    again = {stage: code_digest(BY_NAME[stage].module, repo_copy) for stage in REBUILD}
    assert {stage for stage in REBUILD if again[stage] != after[stage]} == {"translate"}
    code_parts.cache_clear()


def test_a_comment_a_docstring_or_the_layout_reruns_nothing_and_code_does(repo_copy):
    """The key is the code Python runs: a docstring edit to a package's __init__ must not
    extract 7,478 photos again."""
    path = repo_copy / "data_catalog" / "__init__.py"
    original = path.read_text()
    before = code_digest(BY_NAME["features"].module, repo_copy)
    for edited in ('"""Another docstring."""\n' + original.split('"""', 2)[2],  # the module's docstring
                   original + "\n\n# a comment\n\n",
                   original + "\ndef f(x):\n    \"\"\"What f does.\"\"\"\n    return x\n"):
        path.write_text(edited)
        code_parts.cache_clear()
        if "def f" not in edited:
            assert code_digest(BY_NAME["features"].module, repo_copy) == before, edited[:60]
    code_parts.cache_clear()
    with_f = code_digest(BY_NAME["features"].module, repo_copy)
    path.write_text(original + "\ndef f(x):\n    return x\n")  # the same code, no docstring
    code_parts.cache_clear()
    assert code_digest(BY_NAME["features"].module, repo_copy) == with_f != before
    path.write_text(original + "\ndef f(x):\n    return x + 1\n")
    code_parts.cache_clear()
    assert code_digest(BY_NAME["features"].module, repo_copy) != with_f
    path.write_text(original)
    code_parts.cache_clear()


def test_library_versions_are_part_of_the_key_but_not_the_runners():
    parts = code_parts(BY_NAME["train"].module)
    assert "library torch" in parts and "library numpy" in parts
    assert not [p for p in parts if p in ("library prefect", "library mlflow", "library mlflow-skinny")]


@pytest.mark.slow
def test_library_versions_come_from_the_user_s_cache_while_the_same_distributions_are_installed(tmp_path, monkeypatch):
    """Versions read from METADATA files once per set of installed distributions: an
    upgrade is a new dist-info folder (its name carries the version), so a new cache."""
    import numpy

    from mule.storage import code_digests
    from mule.storage.atomic import read_json_cache, write_json_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    code_digests.forget()
    try:
        assert code_digests.libraries({"numpy"}) == {"numpy": numpy.__version__}
        code_digests._installed_cache().save()
        (cache,) = (tmp_path / "mule").glob("installed-*.json")
        held = read_json_cache(cache, lambda value: True)
        assert held["versions"]["numpy"] == numpy.__version__ and held["names"]["numpy"] == ["numpy"]
        held["versions"]["numpy"] = "0.0-from-the-cache"  # what the cache, written whole by mule, says is used
        write_json_cache(held, cache)
        code_digests.forget()
        assert code_digests.libraries({"numpy"}) == {"numpy": "0.0-from-the-cache"}
        sealed = json.loads(cache.read_text())
        sealed["value"]["versions"]["numpy"] = "9.9-edited-by-hand"  # its digest no longer matches: read again
        cache.write_text(json.dumps(sealed))
        code_digests.forget()
        assert code_digests.libraries({"numpy"}) == {"numpy": numpy.__version__}
        write_json_cache(held, cache)
        code_digests.forget()
        monkeypatch.setattr(code_digests, "_installed_signature", lambda: "another-install")
        code_digests.forget()  # another set of distributions: read from their metadata again
        assert code_digests.libraries({"numpy"}) == {"numpy": numpy.__version__}
        assert code_digests.libraries({"no_such_module_anywhere"}) == {}
    finally:
        monkeypatch.undo()
        code_digests.forget()


@pytest.mark.parametrize("held", ["[]", "null", '"text"', "7", '{"numpy": 7}', '{"names": {"torch": 7}}',
                                  '{"names": {}, "versions": {"numpy": ["1"]}}', "{not json", b"\xff\xfe"])  # fmt: skip
@pytest.mark.slow
def test_a_cache_file_of_any_shape_is_computed_again_never_a_crash(tmp_path, monkeypatch, held):
    """mule's files in the user's cache (imports, installed libraries, packages) and the
    workdir's digest cache, edited by hand or written by another version: each is read as
    missing, the keys come out as with no cache at all, and the file is written afresh."""
    from mule.storage import code_digests
    from mule.storage.content_digests import FileHasher
    from mule.storage.workdir import Workdir

    def fresh() -> None:
        code_digests.forget()
        for cached in (code_digests._import_cache, code_digests._imports_in, code_digests._packages_distributions):
            cached.cache_clear()

    module = BY_NAME["train"].module
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "clean"))
    fresh()
    # importlib's reading of every distribution's RECORD (2 s) once: what the cases check is
    # what mule does with the file it left, which each case still reads, validates and rewrites
    read_once = code_digests.packages_distributions()
    monkeypatch.setattr(code_digests, "packages_distributions", lambda: {k: list(v) for k, v in read_once.items()})
    try:
        expected, packages = code_parts(module), code_digests.installed_packages()
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "bad"))
        folder = tmp_path / "bad" / "mule"
        folder.mkdir(parents=True)
        signature = code_digests._installed_signature()
        names = ("imports.json", f"installed-{signature}.json", f"packages-{signature}.json")
        for name in names:
            (folder / name).write_bytes(held if isinstance(held, bytes) else held.encode())
        fresh()
        assert code_parts(module) == expected and code_digests.installed_packages() == packages
        for name in ("imports.json", f"installed-{signature}.json"):  # written again, of the right shape
            assert isinstance(json.loads((folder / name).read_text()), dict), name
    finally:
        monkeypatch.undo()
        fresh()
    wd = Workdir.at(tmp_path / "work")
    wd.state_dir.mkdir(parents=True, exist_ok=True)
    (wd.state_dir / "file_hashes.json").write_bytes(held if isinstance(held, bytes) else held.encode())
    some = tmp_path / "some.txt"
    some.write_text("text")
    hasher = FileHasher(wd)
    assert hasher.digest(some) == hashlib.sha256(b"text").hexdigest()
    hasher.save()
    assert FileHasher(wd).digest(some) == hasher.digest(some)


def _random_json(rng, depth: int = 0):
    """A JSON value of any shape: what a crash, another program or a hand may leave."""
    kind = rng.randrange(7 if depth < 4 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False, 0, -1, 2.5, 10**30])
    if kind == 2:
        return "".join(rng.choice("abc:/é0 \\\"") for _ in range(rng.randrange(8)))
    if kind == 3:
        return []
    if kind == 4:
        return {}
    if kind == 5:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {_random_json(rng, 5) if rng.random() < 0.2 else f"code:{rng.randrange(99)}": _random_json(rng, depth + 1)
            for _ in range(rng.randrange(4))}  # fmt: skip


@pytest.mark.slow
def test_every_cache_mule_keeps_is_computed_again_from_whatever_is_left_there(tmp_path, monkeypatch):
    """A fuzz test over the caches' files (the user cache's imports, installed libraries and
    packages; the workdir's file digests and extractor weights' files): random JSON, mule's
    own file cut at random points, nesting past what JSON reads, a sealed file holding an
    entry of the wrong content (`"code:<digest>": []`, which crashed every command), and
    bytes that are no text. Each is read as missing or cleaned, the answers are those of no
    cache at all, and no command sees a traceback."""
    import random

    from mule.config.sections import FeaturesConfig
    from mule.data_catalog.entries import weights_file
    from mule.storage import code_digests
    from mule.storage.atomic import write_json_cache
    from mule.storage.content_digests import FileHasher
    from mule.storage.workdir import Workdir

    def fresh() -> None:
        code_digests.forget()
        for cached in (code_digests._import_cache, code_digests._imports_in, code_digests._packages_distributions,
                       code_digests._code_digest):  # fmt: skip
            cached.cache_clear()

    module = BY_NAME["evaluate"].module
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "mule"
    wd = Workdir.at(tmp_path / "work")
    some = tmp_path / "some.txt"
    some.write_text("text")
    features = FeaturesConfig(arch="resnet18")
    fresh()
    # importlib's reading of every distribution's RECORD (2 s) once: what the cases check is
    # what mule does with the file it left, which each case still reads, validates and rewrites
    read_once = code_digests.packages_distributions()
    monkeypatch.setattr(code_digests, "packages_distributions", lambda: {k: list(v) for k, v in read_once.items()})
    try:
        expected, packages = code_parts(module), code_digests.installed_packages()
        hasher = FileHasher(wd)
        hasher.digest(some)
        hasher.save()
        weights = weights_file(wd, features)
        signature = code_digests._installed_signature()
        files = [folder / "imports.json", folder / f"installed-{signature}.json", folder / f"packages-{signature}.json",
                 wd.state_dir / "file_hashes.json", wd.state_dir / "weights_files.json"]  # fmt: skip
        written = {path: path.read_bytes() for path in files}
        rng = random.Random(20261207)
        lefts = [b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe\x00", b""]
        lefts += [json.dumps(_random_json(rng)).encode() for _ in range(12)]
        for path in files:
            lefts += [written[path][: rng.randrange(1, len(written[path]))] for _ in range(3)]
        stale = json.loads(written[files[0]])["value"]
        stale[next(k for k in stale if k.startswith("code:"))] = []  # sealed whole, the wrong content inside
        for left in lefts + ["sealed"]:
            for path in files:
                if left == "sealed":
                    write_json_cache(stale if path == files[0] else json.loads(written[path])["value"], path)
                else:
                    path.write_bytes(left)
            fresh()
            assert code_parts(module) == expected, left[:40]
            assert code_digests.installed_packages() == packages
            assert FileHasher(wd).digest(some) == hashlib.sha256(b"text").hexdigest()
            assert weights_file(wd, features) == weights
    finally:
        monkeypatch.undo()
        fresh()
