"""The package's shape in figures: rooms (top-level folders) and every folder's share, imports
that point up a floor (type-only and in-function imports counted, and modules reached
through `sys.modules`), import circles among modules, the largest modules, module names
used twice, functions over 80 lines or over 10 parameters, the config classes, and the
code that handles a stop (its lines and rooms). Reads source only (never imports mule), so it measures any
checkout, an old commit's included:

    python bench/architecture_figures.py               # this checkout
    git worktree add /tmp/before <commit> && python bench/architecture_figures.py /tmp/before

The floors are the checkout's own: the FLOORS dict of its tests/test_layout.py.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections import Counter, defaultdict
from pathlib import Path


def floors_of(repo: Path) -> dict[str, set[str]]:
    """The module's top-level assignments run in order up to FLOORS (plain data: sets of names)."""
    tree = ast.parse((repo / "tests" / "test_layout.py").read_text())
    namespace: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            exec(compile(ast.Module([node], []), "test_layout.py", "exec"), namespace)  # noqa: S102 - our own literals
            if "FLOORS" in namespace:
                return namespace["FLOORS"]
    raise SystemExit(f"{repo}/tests/test_layout.py has no FLOORS")


def modules(repo: Path, rooms) -> dict[Path, str]:
    found = {}
    for room in rooms:
        for path in sorted((repo / room).rglob("*.py")):
            name = ".".join(("mule", *path.relative_to(repo).with_suffix("").parts)).removesuffix(".__init__")
            found[path] = name
    return found


def imports(path: Path, name: str) -> set[str]:
    """Every module name an import statement in the file names: at the top, in functions,
    and under `if TYPE_CHECKING:` alike (storage.code_digests.written_imports' rule, written
    here again so that an old checkout is measured without importing any mule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            names.add(source)
    return names


# A function (or class body outside functions) handles a stop when its source names one of these.
STOP_WORDS = ("KeyboardInterrupt", "Interrupted", "is_stop", "on_stop", "signal.", "SIGINT", "SIGTERM",
              "interrupt_main", "os._exit", "set_wakeup_fd")  # fmt: skip


def long_functions(path: Path, limit: int = 80) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit:
            found.append((node.name, node.end_lineno - node.lineno + 1))
    return found


def many_parameters(path: Path, limit: int = 10) -> list[tuple[str, int]]:
    """Functions taking more than `limit` parameters (self and cls not counted)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)] + \
                [x.arg for x in (a.vararg, a.kwarg) if x is not None]  # fmt: skip
            n = len([x for x in names if x not in ("self", "cls")])
            if n > limit:
                found.append((node.name, n))
    return found


REACH = re.compile(r"""sys\.modules(?:\.get\(|\[)\s*["'](mule\.[\w.]+)""")


def reaches(path: Path) -> set[str]:
    """Modules found among those already imported (`sys.modules.get("mule...")`): imports by another name."""
    return set(REACH.findall(path.read_text()))


def top_level_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The mule modules a module imports when it is imported (not inside functions, not
    type-only): the edges an import circle is made of."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_bytes())
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            continue
        for inner in ([node] if not isinstance(node, (ast.Try, ast.If)) else ast.walk(node)):
            if isinstance(inner, ast.Import):
                found.update(a.name for a in inner.names)
            elif isinstance(inner, ast.ImportFrom):
                if inner.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - inner.level + 1])
                    source = f"{base}.{inner.module}" if inner.module else base
                else:
                    source = inner.module or ""
                found.add(source)
                found.update(f"{source}.{a.name}" for a in inner.names)
    return {m for m in found if m in known}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def config_classes(path: Path) -> list[str]:
    return [n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef) and n.name.endswith("Config")]


def stop_lines(path: Path) -> int:
    """Lines of the outermost functions whose source names a stop (STOP_WORDS), and of the
    module's other statements that do."""
    text = path.read_text()
    tree = ast.parse(text)
    count = 0

    def visit(nodes) -> None:
        nonlocal count
        for node in nodes:
            source = ast.get_source_segment(text, node) or ""
            if isinstance(node, ast.ClassDef):
                visit(node.body)
            elif any(word in source for word in STOP_WORDS):
                count += node.end_lineno - node.lineno + 1

    visit(tree.body)
    return count


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "mule" and len(parts) > 1 else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    repo = Path(parser.parse_args().repo)
    floors = floors_of(repo)
    found = modules(repo, floors)
    lines = {p: len(p.read_text().splitlines()) for p in found}
    total = sum(lines.values())
    print(f"{repo}: {len(found)} modules, {total} lines in {len(floors)} rooms\n")
    print("| room | files | lines | share |\n|---|---|---|---|")
    per_room = defaultdict(list)
    for path, name in found.items():
        per_room[room_of(name)].append(path)
    for room, paths in sorted(per_room.items(), key=lambda kv: -sum(lines[p] for p in kv[1])):
        n = sum(lines[p] for p in paths)
        print(f"| {room} | {len(paths)} | {n} | {100 * n / total:.0f}% |")
    per_folder = defaultdict(list)
    for path in found:
        per_folder[str(path.parent.relative_to(repo))].append(path)
    shares = {folder: sum(lines[p] for p in paths) for folder, paths in per_folder.items()}
    largest = max(shares, key=shares.get)
    over = [f for f, n in shares.items() if n > total / 5]
    print(f"\nfolders (a room's subfolders apart): {len(shares)}; the largest {largest}, {shares[largest]} lines, "
          f"{100 * shares[largest] / total:.0f}%; over a fifth of the package: {len(over)}")  # fmt: skip
    upward = []
    for path, name in found.items():
        room = room_of(name)
        for imported in imports(path, name):
            other = room_of(imported)
            if other in floors and other != room and other not in floors[room]:
                upward.append(f"{path.relative_to(repo)} -> {imported}")
    for path, name in found.items():
        room = room_of(name)
        for reached in reaches(path):
            other = room_of(reached)
            if other in floors and other != room and other not in floors[room]:
                upward.append(f"{path.relative_to(repo)} -> {reached} (through sys.modules)")
    print(f"\nimports pointing up a floor (type-only and in-function counted, and reaches through sys.modules): "
          f"{len(upward)}")  # fmt: skip
    for line in sorted(upward):
        print(f"  {line}")
    known = set(found.values())
    edges = {name: top_level_imports(path, name, known) - {name} for path, name in found.items()}
    loops = circles(edges)
    print(f"\nimport circles among modules (imports run when a module is imported): {len(loops)}")
    for loop in loops:
        print("  " + " <-> ".join(loop))
    print("\nlargest modules:")
    for path in sorted(lines, key=lambda p: -lines[p])[:6]:
        print(f"  {lines[path]:>4}  {path.relative_to(repo)}")
    longs = [(path, name, n) for path in found for name, n in long_functions(path)]
    print(f"\nfunctions over 80 lines: {len(longs)}")
    for path, name, n in sorted(longs, key=lambda x: -x[2]):
        print(f"  {n:>4}  {path.relative_to(repo)}: {name}")
    many = [(path, name, n) for path in found for name, n in many_parameters(path)]
    print(f"\nfunctions over 10 parameters: {len(many)}")
    for path, name, n in sorted(many, key=lambda x: -x[2]):
        print(f"  {n:>4}  {path.relative_to(repo)}: {name}")
    print(f"modules over 450 lines: {sum(1 for n in lines.values() if n > 450)}")
    configs = Counter(c for path in found for c in config_classes(path))
    print(f"\nconfig classes: {sum(configs.values())} ({len(configs)} names"
          f"{', defined more than once: ' + ', '.join(sorted(c for c, n in configs.items() if n > 1)) if any(n > 1 for n in configs.values()) else ''})")
    stops = {p: stop_lines(p) for p in found}
    stop_rooms = Counter()
    for p, n in stops.items():
        if n:
            stop_rooms[room_of(found[p])] += n
    print(f"\ncode that handles a stop (functions naming {', '.join(STOP_WORDS[:4])}, ...): {sum(stops.values())} lines "
          f"in {sum(1 for n in stops.values() if n)} modules of {len(stop_rooms)} rooms")
    for room, n in stop_rooms.most_common():
        print(f"  {n:>4}  {room}")
    stems = Counter(p.stem for p in found if p.name != "__init__.py")
    twins = sorted(s for s, n in stems.items() if n > 1 and s not in ("__main__",))
    print(f"\nmodule names used more than once: {len(twins)}")
    for stem in twins:
        print(f"  {stem}: " + ", ".join(str(p.relative_to(repo)) for p in found if p.stem == stem))


if __name__ == "__main__":
    main()
