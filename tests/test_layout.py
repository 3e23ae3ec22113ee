"""The project's shape, checked: the floors import only downwards, SQL over the catalog
lives in data_catalog, and the README's stage table is the declaration's."""

import re
import tomllib

from mule.data_catalog.code_digests import REPO, _imports_in, _stamp
from mule.pipeline.declaration import keys_table, markdown_table

# Each package, and the packages it may import (below it).
FLOORS = {
    "mule_core": set(),
    "data_catalog": {"mule_core"},
    "clients": {"mule_core"},
    # the stages compute; they never publish (experiments) nor serve
    "tasks": {"clients", "data_catalog", "mule_core"},
    "experiments": {"data_catalog", "mule_core"},
    # the model in use: never the stages, so never Prefect
    # the front door: a trained model, from a workdir, a file or an MLflow URI
    "api": {"experiments", "data_catalog", "mule_core"},
    "serving": {"api", "experiments", "data_catalog", "mule_core"},
    "pipeline": {"tasks", "serving", "api", "experiments", "clients", "data_catalog", "mule_core"},
    "flows": {"pipeline", "serving", "api", "tasks", "experiments", "clients", "data_catalog", "mule_core"},
    # the command line: commands that run stages (through flows), and those that read
    "commands": {"flows", "pipeline", "serving", "api", "experiments", "data_catalog", "mule_core"},
}


def _modules(package: str):
    for path in sorted((REPO / package).rglob("*.py")):
        name = ".".join(("mule", *path.relative_to(REPO).with_suffix("").parts)).removesuffix(".__init__")
        yield path, name


def _folder(imported: str) -> str:
    """mule.tasks.train -> tasks (the folder); a library's top-level name as it is."""
    parts = imported.split(".")
    return parts[1] if parts[0] == "mule" and len(parts) > 1 else parts[0]


def test_each_floor_imports_only_the_floors_below_it():
    upward = []
    for package, allowed in FLOORS.items():
        for path, name in _modules(package):
            for imported in _imports_in(_stamp(path), name, path.name == "__init__.py"):
                top = _folder(imported)
                if top in FLOORS and top != package and top not in allowed:
                    upward.append(f"{path.relative_to(REPO)} imports {imported}")
    assert not upward, upward


def test_mule_core_knows_nothing_of_prefect_mlflow_or_the_catalog():
    for path, name in _modules("mule_core"):
        tops = {_folder(i) for i in _imports_in(_stamp(path), name, path.name == "__init__.py")}
        assert not tops & {"prefect", "mlflow", "duckdb", "data_catalog"}, path


def test_no_sql_over_the_catalog_outside_data_catalog():
    sql = re.compile(r"\bSELECT\b.{0,400}?\bFROM\s+(images|captions|rejects|word_vectors|subword_vectors|translations|features)\b", re.S)
    offenders = [str(p.relative_to(REPO)) for package in FLOORS if package != "data_catalog"
                 for p, _ in _modules(package) if sql.search(p.read_text())]  # fmt: skip
    assert not offenders, offenders


def test_the_readme_stage_table_is_the_declarations():
    readme = (REPO / "README.md").read_text()
    table = re.search(r"<!-- stages: python -m mule.pipeline.declaration -->\n(.*?)<!-- /stages -->", readme, re.S)
    assert table, "README.md lost its stage table markers"
    assert table.group(1) == markdown_table(), "README's stage table is stale: python -m mule.pipeline.declaration"


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


def test_one_rebuild_body():
    """The command (without Prefect when nothing has to run) and the rebuild flow both call
    pipeline.rebuild.run; no other module walks the stages and decides what to reuse."""
    callers = {str(p.relative_to(REPO)) for package in FLOORS for p, _ in _modules(package)
               if re.search(r"\brebuild\.run\(", p.read_text())}  # fmt: skip
    assert callers == {"commands/run.py", "flows/stages.py"}, callers
    deciders = {str(p.relative_to(REPO)) for package in FLOORS for p, _ in _modules(package)
                if re.search(r"\breuse\.decide\(", p.read_text())}  # fmt: skip
    # the rebuild's body, a single stage's runner, and the sweeps' per-model steps
    assert deciders == {"pipeline/rebuild.py", "pipeline/runner.py", "pipeline/sweeps.py"}, deciders


def test_a_trained_model_is_used_through_the_front_door():
    """Outside the stages (which hold the model they train), a trained model is opened by
    mule.api.load: mule search, mule serve and the pyfunc model never open model files
    themselves."""
    opening = {str(p.relative_to(REPO)) for package in ("serving", "commands", "flows", "pipeline")
               for p, _ in _modules(package) if re.search(r"\bopen_embedder\b|data_catalog\.models import[^\n]*\bload_model\b", p.read_text())}  # fmt: skip
    assert not opening, opening
    loading = {str(p.relative_to(REPO)) for p, _ in _modules("serving") if "api.load(" in p.read_text()}
    assert loading == {"serving/search.py", "serving/mlflow_model.py"}, loading


def test_a_missing_table_names_the_stage_the_declaration_says_writes_it():
    """The catalog's own map (it cannot import the declaration above it) is the declaration's."""
    from mule.data_catalog.catalog import PRODUCED_BY
    from mule.data_catalog.entries import TABLE_ENTRIES
    from mule.pipeline.declaration import writer_of

    assert PRODUCED_BY == {table: writer_of(entry) for table, entry in TABLE_ENTRIES.items() if writer_of(entry)}


def test_no_two_modules_import_each_other():
    """No circle of imports between mule's modules, deferred (in-function) and type-only
    imports included: each module can be read, and moved, after the ones it uses."""
    graph: dict[str, set[str]] = {}
    for package in FLOORS:
        for path, name in _modules(package):
            graph[name] = set(_imports_in(_stamp(path), name, path.name == "__init__.py"))
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
