"""The package's shape in figures: rooms (top-level folders) and their share, imports that
point up a floor (type-only and in-function imports counted), the largest modules,
module names used twice, functions over 80 lines, the config classes, and the code that
handles a stop (its lines and rooms). Reads source only (never imports mule), so it measures any
checkout, an old commit's included:

    python bench/architecture_figures.py               # this checkout
    git worktree add /tmp/before <commit> && python bench/architecture_figures.py /tmp/before

The floors are the checkout's own: the FLOORS dict of its tests/test_layout.py.
"""

from __future__ import annotations

import argparse
import ast
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
    upward = []
    for path, name in found.items():
        room = room_of(name)
        for imported in imports(path, name):
            other = room_of(imported)
            if other in floors and other != room and other not in floors[room]:
                upward.append(f"{path.relative_to(repo)} -> {imported}")
    print(f"\nimports pointing up a floor (type-only and in-function counted): {len(upward)}")
    for line in sorted(upward):
        print(f"  {line}")
    print("\nlargest modules:")
    for path in sorted(lines, key=lambda p: -lines[p])[:6]:
        print(f"  {lines[path]:>4}  {path.relative_to(repo)}")
    longs = [(path, name, n) for path in found for name, n in long_functions(path)]
    print(f"\nfunctions over 80 lines: {len(longs)}")
    for path, name, n in sorted(longs, key=lambda x: -x[2]):
        print(f"  {n:>4}  {path.relative_to(repo)}: {name}")
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
