"""The project's shape, checked: the floors import only downwards, SQL over the catalog
lives in data_catalog, and the stage table (docs/operations.md) is the declaration's."""

import re
import tomllib

import pytest

from mule.pipeline.declaration import keys_table, markdown_table
from mule.storage.code_digests import REPO, _imports_in, _stamp, written_imports
from mule.storage.workdir import Workdir

# Each room (a folder, installed as mule.<folder>), and the rooms it may import: those
# below it. Type-only imports (under `if TYPE_CHECKING:`) count like any other.
_STORE = {"storage", "mule_core"}
_DATA = {"datasets", "data_catalog", "generators", *_STORE}
FLOORS = {
    "mule_core": set(),  # the model library: torch and numpy
    "storage": {"mule_core"},  # the workdir's machinery: paths, atomic writes, locks, digests
    "stopping": set(),  # signal handling, for the commands, the flows and mule serve alike
    "data_catalog": _STORE,  # tables, their SQL, the named entries, model and index files
    "generators": _STORE,  # the generated datasets' generators
    "datasets": {"data_catalog", "generators", *_STORE},  # formats: readers and their registry, word-vector files
    "config": _DATA,  # the one typed config: its sections sit below every stage
    "clients": {"mule_core"},
    # words across languages: e5's reader and cache, centres, translation tables, aligned starts
    "words": _STORE,
    # the stages compute; they never publish (experiments) nor serve
    "tasks": {"config", "clients", "words", *_DATA},
    "experiments": {"config", "stopping", *_DATA},
    # the front door: a trained model, from a workdir, a file or an MLflow URI
    "api": {"experiments", "config", *_DATA},
    # the model in use: never the stages, so never Prefect
    "serving": {"api", "experiments", "stopping", "config", *_DATA},
    "pipeline": {"tasks", "serving", "api", "experiments", "clients", "stopping", "config", "words", *_DATA},
    "flows": {"pipeline", "serving", "api", "tasks", "experiments", "clients", "stopping", "config", "words", *_DATA},
    # the command line: commands that run stages (through flows), and those that read
    "commands": {"flows", "pipeline", "serving", "api", "experiments", "stopping", "config", "words", *_DATA},
}


def _modules(package: str):
    for path in sorted((REPO / package).rglob("*.py")):
        name = ".".join(("mule", *path.relative_to(REPO).with_suffix("").parts)).removesuffix(".__init__")
        yield path, name


def _folder(imported: str) -> str:
    """mule.tasks.train -> tasks (the folder); a library's top-level name as it is."""
    parts = imported.split(".")
    return parts[1] if parts[0] == "mule" and len(parts) > 1 else parts[0]


def _written_imports(path, name: str) -> frozenset[str]:
    return written_imports(path, name, path.name == "__init__.py")


@pytest.mark.slow
def test_each_floor_imports_only_the_floors_below_it():
    upward = []
    for package, allowed in FLOORS.items():
        for path, name in _modules(package):
            for imported in _written_imports(path, name):
                top = _folder(imported)
                if top in FLOORS and top != package and top not in allowed:
                    upward.append(f"{path.relative_to(REPO)} imports {imported}")
    assert not upward, upward


def test_no_room_reaches_a_higher_one_at_run_time_either():
    """A module found among those already imported (`sys.modules.get("mule.flows...")`) is
    an import by another name: it counts against the floors like any other."""
    reach = re.compile(r"""sys\.modules(?:\.get\(|\[)\s*["']mule\.(\w+)""")
    upward = []
    for package, allowed in FLOORS.items():
        for path, _ in _modules(package):
            for top in reach.findall(path.read_text()):
                if top in FLOORS and top != package and top not in allowed:
                    upward.append(f"{path.relative_to(REPO)} reaches mule.{top} through sys.modules")
    assert not upward, upward


def test_mule_core_knows_nothing_of_prefect_mlflow_or_the_catalog():
    for path, name in _modules("mule_core"):
        tops = {_folder(i) for i in _written_imports(path, name)}
        assert not tops & {"prefect", "mlflow", "duckdb", *(set(FLOORS) - {"mule_core"})}, path


def test_an_import_that_points_up_is_caught_even_when_type_only(tmp_path):
    """The rule this file enforces, on a module written for it."""
    module = tmp_path / "stages_like.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mule.pipeline.runner import Runner\n")
    assert "mule.pipeline.runner" in _written_imports(module, "mule.data_catalog.stages_like")


def test_no_sql_over_the_catalog_outside_data_catalog():
    sql = re.compile(r"\bSELECT\b.{0,400}?\bFROM\s+(images|captions|rejects|word_vectors|subword_vectors|translations|features)\b", re.S)
    offenders = [str(p.relative_to(REPO)) for package in FLOORS if package != "data_catalog"
                 for p, _ in _modules(package) if sql.search(p.read_text())]  # fmt: skip
    assert not offenders, offenders


def test_the_stage_table_is_the_declarations():
    page = (REPO / "docs" / "operations.md").read_text()
    table = re.search(r"<!-- stages: python -m mule.pipeline.declaration -->\n(.*?)<!-- /stages -->", page, re.S)
    assert table, "docs/operations.md lost its stage table markers"
    assert table.group(1) == markdown_table(), "docs/operations.md's stage table is stale: python -m mule.pipeline.declaration"


def test_the_architecture_page_s_key_table_is_the_code_s():
    page = (REPO / "docs" / "architecture.md").read_text()
    table = re.search(r"<!-- keys: python -m mule.pipeline.declaration keys -->\n(.*?)<!-- /keys -->", page, re.S)
    assert table, "docs/architecture.md lost its key table markers"
    assert table.group(1) == keys_table(), "docs/architecture.md's key table is stale: python -m mule.pipeline.declaration keys"


def test_installed_mule_is_one_namespace():
    """Every package folder is installed as mule.<folder>, and nothing imports a folder by
    its bare name (which works from the checkout and breaks once installed)."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = sorted(".".join(p.parent.relative_to(REPO).parts) for package in FLOORS
                     for p in (REPO / package).rglob("__init__.py"))  # fmt: skip
    assert sorted(setuptools["packages"]) == sorted(f"mule.{f}" for f in folders)
    assert setuptools["package-dir"] == {f"mule.{f}": f for f in FLOORS}
    bare = []
    for path in [*(p for package in FLOORS for p, _ in _modules(package)), *sorted((REPO / "tests").glob("*.py")),
                 *sorted((REPO / "bench").glob("*.py"))]:  # fmt: skip
        for imported in _imports_in(_stamp(path), "x.y", False):
            if imported.split(".")[0] in FLOORS:
                bare.append(f"{path.relative_to(REPO)} imports {imported}")
    assert not bare, bare


def test_one_rebuild_body_and_a_runner_that_knows_no_hook_by_name():
    """The command and the rebuild flow both go through pipeline.rebuild; only it, the
    runner and the sweeps decide; the runner names no tracking, publishing or Prefect."""
    callers = {str(p.relative_to(REPO)) for package in FLOORS for p, _ in _modules(package)
               if re.search(r"\brebuild\.(run|plan)\(", p.read_text())}  # fmt: skip
    assert callers - {"pipeline/rebuild.py"} == {"commands/run.py", "flows/stages.py"}, callers  # (its own docstring)
    deciders = {str(p.relative_to(REPO)) for package in FLOORS for p, _ in _modules(package)
                if re.search(r"\bdecisions\.decide\(", p.read_text())}  # fmt: skip
    # the rebuild's body (ahead of the flow), a single stage's runner, and the sweeps' per-model steps
    assert deciders == {"pipeline/rebuild.py", "pipeline/runner.py", "pipeline/sweeps.py"}, deciders
    runner = (REPO / "pipeline" / "runner.py").read_text()
    code = runner.split("def untracked", 1)[0]  # the helper below it picks the untracked hooks
    for name in ("tracking", "mlflow", "publish", "prefect", "Tracker", "flows"):
        assert not re.search(rf"\b{name}\b", code.split('"""', 2)[2]), name


def test_a_trained_model_is_used_through_the_front_door():
    """Outside the stages (which hold the model they train), a trained model is opened by
    mule.api.load: mule search, mule serve and the pyfunc model never open model files
    themselves."""
    opening = {str(p.relative_to(REPO)) for package in ("serving", "commands", "flows", "pipeline")
               for p, _ in _modules(package) if re.search(r"\bopen_embedder\b|data_catalog\.models import[^\n]*\bload_model\b", p.read_text())}  # fmt: skip
    assert not opening, opening
    loading = {str(p.relative_to(REPO)) for p, _ in _modules("serving") if "api.load(" in p.read_text()}
    assert loading == {"serving/retrieval.py", "serving/mlflow_model.py"}, loading


def test_the_registries_and_the_declaration_hold_together():
    """One map of who writes what (data_catalog.writers), read by the declaration and the
    catalog's errors alike; every entry a stage reads or writes is declared where it
    lives; every stage's computation, preparation and publisher can be found; every
    dataset format has its reader, and the config accepts exactly those."""
    from mule.config.resolution import resolve
    from mule.data_catalog.entries import ENTRIES
    from mule.data_catalog.table_access import missing_table_error
    from mule.data_catalog.writers import TABLE_ENTRIES, WRITTEN_BY
    from mule.datasets.formats import FORMATS
    from mule.mule_core.settings import ConfigError
    from mule.pipeline.declaration import STAGES, writer_of

    names = {s.name for s in STAGES}
    assert set(WRITTEN_BY) <= set(ENTRIES) and set(TABLE_ENTRIES.values()) <= set(WRITTEN_BY)
    assert all(set(writers) <= names for writers in WRITTEN_BY.values())
    inputs = set(ENTRIES) - set(WRITTEN_BY)
    assert inputs == {"raw files", "lexicons", "extractor weights", "vector files", "base model", "caption files"}, inputs
    for stage in STAGES:
        assert {r if isinstance(r, str) else r.entry for r in stage.reads} <= set(ENTRIES), stage.name
        if stage.keyed:
            assert callable(stage.load_task()) and stage.writes, stage.name
            assert stage.publish is None or callable(stage.load_publish()), stage.name
            assert stage.prepare is None or callable(stage.load_prepare()), stage.name
        else:
            assert set(stage.steps) <= names and stage.load_sweep(), stage.name
    assert writer_of("model") == "train" and writer_of("features") == "features"
    assert "mule run ingest" in str(missing_table_error("captions", Workdir.at("/tmp/w")))
    for name, fmt in FORMATS.items():
        assert fmt.name == name and callable(fmt.read)
        assert resolve(None, {"data.dataset": "mine", "data.format": name}).data.format == name
    with pytest.raises(ConfigError, match="data.format must be one of"):
        resolve(None, {"data.dataset": "mine", "data.format": "mystery"})


def test_no_two_modules_import_each_other():
    """No circle of imports between mule's modules, deferred (in-function) and type-only
    imports included: each module can be read, and moved, after the ones it uses."""
    graph: dict[str, set[str]] = {}
    for package in FLOORS:
        for path, name in _modules(package):
            graph[name] = set(written_imports(path, name, path.name == "__init__.py"))  # type-only ones too
    for name, imported in graph.items():
        graph[name] = {i for i in imported if i in graph and i != name and not name.startswith(i + ".")}
    circles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not circles, circles


def test_the_slow_mark_sits_on_tests():
    """`-m "not slow"` deselects what carries the mark: on a helper function it marks
    nothing, and the end-to-end test it was meant for stays in the quick run (the crash
    test's did, until 2026-11-29)."""
    import ast

    misplaced = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("test_"):
                if any(ast.unparse(d) == "pytest.mark.slow" for d in node.decorator_list):
                    misplaced.append(f"{path.name}: {node.name}")
    assert not misplaced, misplaced


def test_every_environment_switch_the_code_reads_is_in_the_operations_table():
    """docs/operations.md, "Environment switches": one place for every MULE_* variable."""
    text = (REPO / "docs" / "operations.md").read_text()
    table = text[text.index("## Environment switches") :].split("\n## ", 1)[0]
    listed = set(re.findall(r"MULE_[A-Z_]+", table))
    read = set()
    for folder in FLOORS:
        for path, _ in _modules(folder):
            read |= set(re.findall(r"MULE_[A-Z_]+", path.read_text()))
    assert read and read <= listed, sorted(read - listed)


def test_a_passing_test_leaves_no_temporary_folder_and_a_failing_one_keeps_its_own(tmp_path):
    """The suite writes about 3 GB of workdirs; under this project's pytest settings a test's
    folder goes when it passes and stays when it fails (to be read), so repeated runs never
    fill the disk."""
    import subprocess
    import sys

    (tmp_path / "test_writes.py").write_text(
        "def test_passes(tmp_path):\n    (tmp_path / 'big').write_bytes(b'0' * 1000)\n\n"
        "def test_fails(tmp_path):\n    (tmp_path / 'kept').write_text('read me')\n    assert False\n"
    )
    base = tmp_path / "base"
    run = subprocess.run([sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "-n", "0",
                          "-p", "no:cacheprovider", f"--basetemp={base}", str(tmp_path / "test_writes.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "1 failed, 1 passed" in run.stdout, run.stdout[-2000:]
    left = sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())
    assert left == ["test_fails0/kept"], left
