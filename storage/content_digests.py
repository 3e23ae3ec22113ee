"""Content digests of files, folders and tables: what stage keys are made of.

Hashing every image of a dataset on every rebuild would cost minutes at COCO's size, so a
file's SHA-256 is cached against its (size, mtime in ns, inode); a file whose stat
changed is hashed again. The digest is always of the bytes: a file rewritten with the
same bytes keeps its digest, whatever its timestamp says (as git's index does).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from pathlib import Path

import pyarrow as pa

from mule.storage.atomic import read_json_cache, write_json_atomic, write_json_cache
from mule.storage.workdir import Workdir

CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def combine(parts: dict[str, str | None]) -> str:
    """One digest for named digests (order-independent)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def ids_digest(ids) -> str:
    """Which items (in any order), e.g. a split's images: what makes two validation scores comparable."""
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:16]


def arrow_digest(table: pa.Table) -> str:
    """The digest of a table's content (column names, types and values), not of its file."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks())
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def _files_under(root: Path):
    """(name relative to root, path as a string) of every non-hidden file under root, in
    name order, following linked folders except those that lead back to a folder on the
    way down. Strings, not Paths: a no-change rebuild walks every photo of a dataset, and
    a Path per file was half of that walk."""

    def walk(folder: str, prefix: str, ancestors: frozenset):
        try:
            with os.scandir(folder) as found:
                entries = sorted(found, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):  # a dangling link: nothing under it
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir():  # links followed
                stat = entry.stat()
                identity = (stat.st_dev, stat.st_ino)
                if identity not in ancestors:  # else a loop: a link to a folder above
                    yield from walk(entry.path, f"{prefix}{entry.name}/", ancestors | {identity})
            elif entry.is_file():
                yield f"{prefix}{entry.name}", entry.path

    stat = root.stat()
    yield from walk(str(root), "", frozenset({(stat.st_dev, stat.st_ino)}))


class FileHasher:
    """SHA-256 of files with a stat cache kept in the workdir (state/file_hashes.json)."""

    def __init__(self, workdir: Workdir):
        self.path = workdir.state_dir / "file_hashes.json"
        # path -> [size, mtime, inode, digest]; a derived value's name -> its text (any other entry: computed again)
        found = read_json_cache(self.path, lambda v: isinstance(v, dict)) or {}
        self.cache: dict[str, list | str | None] = {k: v for k, v in found.items() if v is None or isinstance(v, str) or (
            isinstance(v, list) and len(v) == 4 and all(isinstance(x, int) for x in v[:3]) and isinstance(v[3], str))}
        self.changed = False

    def digest(self, path: Path | str) -> str | None:
        """The file's SHA-256, or None when it does not exist."""
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return None
        stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        cached = self.cache.get(str(path))
        if cached and cached[:3] == stamp:
            return cached[3]
        digest = sha256_file(path)
        self.cache[str(path)] = [*stamp, digest]
        self.changed = True
        return digest

    def derived(self, kind: str, file_digest: str, compute) -> str | None:
        """A digest computed from a file's content (a model's weights), remembered by the
        file's digest: compute() runs once per content."""
        key = f"{kind}:{file_digest}"
        if key not in self.cache:
            self.cache[key] = compute()
            self.changed = True
        return self.cache[key]

    def tree(self, root: Path, exclude: tuple[str, ...] = ()) -> str | None:
        """One digest over every file under root (names relative to root, and contents);
        hidden files and names matching `exclude` are left out. None when root is absent.

        Linked folders are followed (`images -> /data/flickr30k-images` is how real
        collections are laid out: an image replaced there is a change of the dataset); a
        link back to a folder it sits in is a loop, and is not followed."""
        if not root.exists():
            return None
        if root.is_file():
            return self.digest(root)
        parts: dict[str, str | None] = {}
        for relative, path in _files_under(Path(root)):
            if exclude and any(fnmatch.fnmatch(relative.rpartition("/")[2], pattern) for pattern in exclude):
                continue
            parts[relative] = self.digest(path)
        return combine(parts)

    def save(self) -> None:
        """Writes the cache back (atomically) when a file was hashed."""
        if not self.changed:
            return
        # forget deleted files (derived digests: those of files that still exist)
        digests = {v[3] for k, v in self.cache.items() if isinstance(v, list) and os.path.exists(k)}
        existing = {k: v for k, v in self.cache.items()
                    if (os.path.exists(k) if isinstance(v, list) else k.partition(":")[2] in digests)}  # fmt: skip
        write_json_cache(existing, self.path)
        self.changed = False


def restamp_outputs(workdir: Workdir, rewritten: dict[Path, str]) -> int:
    """After a move rewrote the paths inside some tables (catalog/images; path -> digest
    before), the stage records that list them get their new digests: the content that
    matters did not change, so the stage that wrote them must not run again. A table
    that was not the one recorded (damaged or edited before the move) keeps its old
    digest, and its stage runs again. Returns the records updated."""
    names = {str(Path(p).relative_to(workdir.root)): digest for p, digest in rewritten.items()}
    updated = 0
    for record_path in sorted((workdir.state_dir / "stages").glob("*/*.json")):
        try:
            record = json.loads(record_path.read_text())
            outputs = record.get("outputs", {})
        except (OSError, ValueError, AttributeError):
            continue
        moved = [name for name in outputs if name in names and outputs[name] == names[name]]
        if not moved:
            continue
        for name in moved:
            outputs[name] = sha256_file(workdir.root / name)
        write_json_atomic(record, record_path, crash_point=False)
        updated += 1
    return updated
