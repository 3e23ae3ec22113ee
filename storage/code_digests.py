"""What code made something: the repository files a module really imports, read from
their source, and the versions of the libraries those files import.

Three things are keyed by code: a stage (pipeline.decisions: the import closure of the
module that computes it), the image features (the code that turns an image into a
vector: tasks/features.py) and the generated datasets and their ceiling
(embedded). A hand list of "the code train depends on" drifts as soon as
someone adds an import; the import closure cannot.

Imports are found by parsing (never by importing), inside functions too, so a lazily
imported module counts like any other; an import under `if TYPE_CHECKING:` never runs
and does not count. The closure is deliberately generous: a module that is imported
but does not change the output still reruns what reaches it when edited, which costs
time; the other way round would cost a stale model.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import sys
from importlib.metadata import PackageNotFoundError, distribution, distributions, packages_distributions, version
from pathlib import Path

from mule.storage.atomic import is_map_of, is_strings, read_json_cache, write_json_cache

REPO = Path(__file__).resolve().parents[1]

# Libraries that run and record a stage but do not compute what it writes: upgrading
# Prefect or MLflow must not retrain a model. (The computing modules do not import them;
# this keeps it so if one ever does.)
RUNNERS = frozenset({"prefect", "prefect_dask", "mlflow", "dask", "distributed"})


NAMESPACE = "mule"  # installed, the repository's folders are mule.<folder> (pyproject.toml)


@functools.cache
def module_path(module: str, repo: Path = REPO) -> Path | None:
    """The file of a repository module (a package is its __init__.py); None when the
    module is not in the repository (and for the `mule` namespace itself, which has no file)."""
    parts = module.split(".")
    if parts[0] != NAMESPACE or len(parts) == 1:
        return None
    base = repo.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _stamp(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path), stat.st_mtime_ns, stat.st_size


@functools.cache
def _digest(stamp: tuple[str, int, int]) -> str:
    """A file's digest, read once per content (stages share most files)."""
    return hashlib.sha256(Path(stamp[0]).read_bytes()).hexdigest()[:16]


def _without_docstrings(tree: ast.AST) -> ast.AST:
    # A body of a docstring alone becomes `pass`, a module's too: so an empty file and one
    # holding only a docstring differ (datasets/__init__.py is empty). Kept so on purpose:
    # making them equal would give the image features of every workdir a new identity once
    # (datasets/ is in the extractor's code), and extracting 7,478 photos again takes 10 min.
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):  # fmt: skip
            node.body = body[1:] or [ast.Pass()]
    return tree


@functools.cache
def _code_digest(stamp: tuple[str, int, int]) -> str:
    """A file's code as Python runs it: its syntax tree without docstrings, so an edit to a
    comment, a docstring or the layout reruns nothing (a new Python whose trees print
    otherwise reruns everything once). Kept in the user's cache by the file's content."""
    cache, key = _import_cache(), f"code:{_digest(stamp)}"
    if key not in cache.entries:
        tree = _without_docstrings(ast.parse(Path(stamp[0]).read_bytes(), filename=stamp[0]))
        cache.entries[key] = [hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]]  # a list, as imports are
        cache.changed = True
    return cache.entries[key][0]


@functools.cache
def _parsed(stamp: tuple[str, int, int]) -> ast.AST:
    return ast.parse(Path(stamp[0]).read_bytes(), filename=stamp[0])


def cache_dir() -> Path:
    """mule's folder in the user's cache (XDG_CACHE_HOME, else ~/.cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mule"


def _write_cache(path: Path, value) -> bool:
    """`value` as a cache file at `path` in the user's cache (storage.atomic.write_json_cache:
    sealed by its digest); False when the cache is not writable (what it holds is computed
    again next time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_cache(value, path)
        return True
    except OSError:
        return False


class _ImportCache:
    """File digest, module -> the names its imports load, and "code:" file digest -> its
    code's digest, kept in the user's cache: parsing every file a stage reaches costs a
    second on a busy machine, and the answer depends only on the file's content (and where
    it sits)."""

    MAX = 5000

    def __init__(self) -> None:
        self.path = cache_dir() / "imports.json"
        found = read_json_cache(self.path, lambda v: is_map_of(v, is_strings)) or {}
        # a code digest is one string: an entry of any other content is computed again
        self.entries: dict[str, list[str]] = {k: v for k, v in found.items() if not k.startswith("code:") or len(v) == 1}
        self.changed = False

    def save(self) -> None:
        if not self.changed:
            return
        if len(self.entries) > self.MAX:  # old edits' entries: keep the newest
            self.entries = dict(list(self.entries.items())[-self.MAX // 2 :])
        if _write_cache(self.path, self.entries):  # else parsed again next time
            self.changed = False


@functools.cache
def _import_cache() -> _ImportCache:
    return _ImportCache()


def _imported_names(path: Path, module: str, is_package: bool) -> set[str]:
    return _imports_in(_stamp(path), module, is_package)


def _type_checking_only(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or typing.TYPE_CHECKING): imported for annotations, never run."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST):
    for child in ast.iter_child_nodes(node):
        if _type_checking_only(child):
            for orelse in child.orelse:  # the else branch of `if TYPE_CHECKING:` does run
                yield from _import_nodes_in(orelse)
            continue
        yield from _import_nodes_in(child)


def _import_nodes_in(node: ast.AST):
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _import_nodes(node)


@functools.cache
def _imports_in(stamp: tuple[str, int, int], module: str, is_package: bool) -> frozenset[str]:
    """Every module name an import statement in the file may load (absolute names)."""
    cache, key = _import_cache(), f"{_digest(stamp)}:{module}:{int(is_package)}"
    if key in cache.entries:
        return frozenset(cache.entries[key])
    names = _parse_imports(stamp, module, is_package)
    cache.entries[key] = sorted(names)
    cache.changed = True
    return names


def written_imports(path: Path, module: str, is_package: bool) -> frozenset[str]:
    """Every module an import statement in the file names, type-only ones included: what a
    reader follows (the layout test's floors), where the keys count only what runs."""
    return _parse_imports(_stamp(path), module, is_package, type_only=True)


def _parse_imports(stamp: tuple[str, int, int], module: str, is_package: bool,
                   type_only: bool = False) -> frozenset[str]:  # fmt: skip
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    tree = _parsed(stamp)
    found = (n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)) if type_only \
        else _import_nodes(tree)  # fmt: skip
    for node in found:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        else:
            if node.level:  # from . import x, from ..a import b
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
    return frozenset(names)


def _with_parents(module: str) -> list[str]:
    """Importing a.b.c runs a/__init__.py and a/b/__init__.py first."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def closure(module: str | tuple[str, ...], repo: Path = REPO) -> tuple[dict[str, Path], set[str]]:
    """(repository modules reached from `module` (or from each of several), by name ->
    file; top-level names of the other modules they import)."""
    reached: dict[str, Path] = {}
    outside: set[str] = set()
    todo = [module] if isinstance(module, str) else list(module)
    while todo:
        name = todo.pop()
        for candidate in _with_parents(name):
            if candidate in reached:
                continue
            path = module_path(candidate, repo)
            if path is None:
                if candidate.split(".")[0] != NAMESPACE:
                    outside.add(candidate.split(".")[0])
                continue  # `from pkg import function`: pkg.function is not a module
            reached[candidate] = path
            todo.extend(_imported_names(path, candidate, path.name == "__init__.py"))
    return reached, outside


@functools.cache
def _top_level_names() -> dict[str, tuple]:
    """Import name -> distributions, from the distributions' top_level.txt (a few ms;
    importlib's packages_distributions() also reads every RECORD: 2 s here)."""
    found: dict[str, list] = {}
    for dist in distributions():
        for name in (dist.read_text("top_level.txt") or "").split():
            found.setdefault(name, []).append(dist)
    return {name: tuple(dists) for name, dists in found.items()}


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    """importlib's packages_distributions(), which reads every distribution's RECORD (2 s on
    an idle machine, 5 beside a busy one), remembered in the user's cache for as long as
    the same distributions are installed (their dist-info folders, listed in milliseconds)."""
    signature = _installed_signature()
    cache = cache_dir() / f"packages-{signature}.json"
    found = read_json_cache(cache, lambda v: is_map_of(v, is_strings))
    if found is not None:
        return found
    found = packages_distributions()
    _write_cache(cache, found)
    return found


def installed_packages() -> dict[str, list[str]]:
    """Import name -> the distributions that provide it (importlib's
    packages_distributions()), from the user's cache while the installed distributions
    stay the same."""
    return {name: list(dists) for name, dists in _packages_distributions().items()}


def _installed_signature() -> str:
    """Which distributions are installed where (their metadata folders), as a digest."""
    value = hashlib.sha256(sys.prefix.encode())
    for entry in sorted({p for p in sys.path if p}):
        try:
            names = sorted(e.name for e in os.scandir(entry) if e.name.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
        if names:  # a folder without distributions (the working directory) changes nothing
            value.update(f"{entry}\0{chr(0).join(names)}\n".encode())
    return value.hexdigest()[:16]


class _InstalledCache:
    """Import name -> its distributions, and distribution -> version, kept in the user's
    cache for one set of installed distributions (_installed_signature: their dist-info
    folders, whose names carry the versions). Reading them from the distributions'
    METADATA files costs a tenth of a second on every no-change rebuild; a new or upgraded
    library is a new signature, so a new cache."""

    def __init__(self) -> None:
        self.path = cache_dir() / f"installed-{_installed_signature()}.json"
        found = read_json_cache(self.path, lambda v: isinstance(v, dict) and set(v) == {"names", "versions"}
                                and is_map_of(v["names"], is_strings)
                                and is_map_of(v["versions"], lambda x: x is None or isinstance(x, str)))  # fmt: skip
        self.names: dict[str, list[str]] = found["names"] if found else {}
        self.versions: dict[str, str | None] = found["versions"] if found else {}
        self.changed = False

    def save(self) -> None:
        if not self.changed:
            return
        if _write_cache(self.path, {"names": self.names, "versions": self.versions}):
            self.changed = False


@functools.cache
def _installed_cache() -> _InstalledCache:
    return _InstalledCache()


def _distributions_of(name: str) -> tuple[str, ...]:
    cache = _installed_cache()
    if name not in cache.names:
        cache.names[name] = list(_read_distributions_of(name))
        cache.changed = True
    return tuple(cache.names[name])


def _read_distributions_of(name: str) -> tuple[str, ...]:
    if name in _top_level_names():
        return tuple(dist.metadata["Name"] for dist in _top_level_names()[name])
    try:
        return (distribution(name).metadata["Name"],)  # most import names are their distribution's
    except PackageNotFoundError:
        pass
    # a wheel without top_level.txt whose import name is not its name (faiss: faiss-cpu):
    # every RECORD read once (2 s), only when it comes to that
    return tuple(_packages_distributions().get(name, ()))


def installed_version(dist: str) -> str:
    """An installed distribution's version (tests replace this to simulate an upgrade)."""
    cache = _installed_cache()
    if dist not in cache.versions:
        try:
            cache.versions[dist] = version(dist)
        except PackageNotFoundError:
            cache.versions[dist] = None
        cache.changed = True
    if cache.versions[dist] is None:
        raise PackageNotFoundError(dist)
    return cache.versions[dist]


def libraries(top_level_names: set[str]) -> dict[str, str]:
    """Installed distribution -> version for the third-party modules named (the standard
    library and the runners left out)."""
    found: dict[str, str] = {}
    for name in sorted(top_level_names - set(sys.stdlib_module_names) - RUNNERS):
        for dist in _distributions_of(name):
            try:
                found[dist] = installed_version(dist)
            except PackageNotFoundError:
                pass
    return found


@functools.cache
def code_parts(module: str | tuple[str, ...], repo: Path = REPO) -> dict[str, str]:
    """What a change of code means for what `module` (or several) computes: each reached
    file's code digest ("file tasks/train.py"), each library's version ("library torch")."""
    reached, outside = closure(module, repo)
    parts = {f"file {path.relative_to(repo)}": _code_digest(_stamp(path)) for path in sorted(reached.values())}
    parts |= {f"library {name}": v for name, v in libraries(outside).items()}
    _import_cache().save()
    _installed_cache().save()
    return parts


def digest(parts: dict[str, str]) -> str:
    value = hashlib.sha256()
    for name, part in sorted(parts.items()):
        value.update(f"{name}={part}\n".encode())
    return value.hexdigest()[:16]


def code_digest(module: str | tuple[str, ...], repo: Path = REPO) -> str:
    return digest(code_parts(module, repo))


def forget() -> None:
    """Forgets the keys read so far (after an edit, an install, in tests and long-lived processes)."""
    code_parts.cache_clear()
    _installed_cache.cache_clear()
