"""What every dataset reader shares: read options, the result tables, the rejects
collector (soft cases become rows with their reason; strict makes them errors), caption
cleaning and image records."""

from __future__ import annotations

import hashlib
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from mule.datasets.image_files import BadImage, probe
from mule.mule_core.errors import UserError
from mule.storage.content_digests import sha256_file


class DatasetReadError(UserError, ValueError):
    """Input a reader cannot go on with: names the file, the line (or record) and the fault.
    `rejects`: the rows rejected before it stopped (kept: `mule catalog --rejects` shows why)."""

    rejects = None


@dataclass(frozen=True)
class ReadOptions:
    languages: tuple[str, ...] | None = None  # None: every language with caption files
    strict: bool = False  # every soft case (a reject) becomes an error
    max_caption_bytes: int = 2000  # longer caption lines are rejected (Multi30K's longest is ~400)
    # languages another source brings (data.extra_captions): a reader that has none of them does not fail
    optional: tuple[str, ...] = ()


@dataclass
class ReadResult:
    images: pa.Table
    captions: pa.Table | SpooledTable  # a large table's captions stay on disk until they are written
    rejects: pa.Table
    merged_task1_lines: int = 0
    stats: dict = field(default_factory=dict)  # split -> images and captions per language
    notes: dict = field(default_factory=dict)  # what a reader adds to the ingest's summary


@dataclass
class Rows:
    columns: dict[str, list] = field(default_factory=dict)

    def add(self, **values) -> None:
        for key, value in values.items():
            self.columns.setdefault(key, []).append(value)

    def table(self, schema: pa.Schema) -> pa.Table:
        return pa.table({name: self.columns.get(name, []) for name in schema.names}, schema=schema)


@dataclass(frozen=True)
class TooLong:
    """A line over the cap: its first bytes and its full length (the rest was skipped)."""

    head: bytes
    size: int


def capped_lines(handle, cap: int) -> list[bytes | TooLong]:
    """Lines without their newline; a line over `cap` bytes is read in bounded chunks and
    kept as TooLong, so one absurd line cannot exhaust memory."""
    lines: list[bytes | TooLong] = []
    while True:
        line = handle.readline(cap + 2)
        if not line:
            return lines
        if line.endswith(b"\n"):
            line = line[:-1]
            lines.append(line if len(line) <= cap else TooLong(line[:cap], len(line)))
        elif len(line) <= cap:  # the last line, without a final newline
            lines.append(line)
        else:
            size, more = len(line), line
            while more and not more.endswith(b"\n"):
                more = handle.readline(1 << 20)
                size += len(more) - more.endswith(b"\n")
            lines.append(TooLong(line[:cap], size))


# Unicode's category Cc (U+0000-U+001F, U+007F-U+009F, fixed since Unicode 1.1) but the tab:
# one search instead of a category lookup per character (7 s of the real Multi30K's ingest).
CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def clean_caption(raw: bytes | TooLong, cap: int) -> tuple[str | None, str, str]:
    """(caption, '', '') or (None, kind, reason)."""
    if isinstance(raw, TooLong):
        return None, "too_long", f"caption of {raw.size} bytes (data.max_caption_bytes={cap})"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, "invalid_utf8", f"invalid UTF-8 at byte {error.start}"
    text = text.rstrip("\r").strip()
    if not text:
        return None, "empty", "empty caption"
    control = CONTROL.search(text)
    if control:
        return None, "control_char", f"control character U+{ord(control[0]):04X} at column {control.start() + 1}"
    return text, "", ""


def image_record(path: Path, with_hash) -> tuple[bool, str | None, int | None, int | None]:
    """(exists, SHA-256, width, height); with_hash: True, False, or a function path -> digest
    (storage.content_digests.FileHasher.digest, which skips files whose stat is unchanged).
    Width and height come from the header and are None for a file that is no usable image
    (datasets.image_files): the features stage rejects it with the reason."""
    if not path.is_file():  # also a folder, a FIFO or a device named like an image: never opened
        return False, None, None, None
    if callable(with_hash):
        sha = with_hash(path)
    else:
        sha = sha256_file(path) if with_hash else None
    try:
        width, height = probe(path)
    except BadImage:
        width = height = None
    return True, sha, width, height


@dataclass
class Rejects:
    """The rejects table's rows; with strict, the first reject is an error instead."""

    dataset: str
    strict: bool
    rows: Rows = field(default_factory=Rows)
    error: type[Exception] = DatasetReadError

    def add(self, source_file: str, line: int | None, kind: str, reason: str, raw: bytes | TooLong) -> None:
        if self.strict:
            where = f"{source_file}:{line}" if line else source_file
            raise self.error(f"{where}: {reason} (data.strict=true makes this an error)")
        data = raw.head if isinstance(raw, TooLong) else raw
        self.rows.add(dataset=self.dataset, source_file=source_file, line=line, kind=kind, reason=reason,
                      raw=data.decode("utf-8", "backslashreplace"), raw_bytes=data)  # fmt: skip


class SeenKeys:
    """Which keys a reader has seen, and on which line first: 16 bytes a key in two flat
    arrays (open addressing on a 64-bit digest) where a dict of tuples of strings took
    about 170. Two keys share a digest once in about 2^64 / n^2 tables of n rows: a
    million-row table has a chance of one in 30 million of one false duplicate."""

    def __init__(self, capacity: int = 1 << 16):
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.digests = array("Q", bytes(8 * capacity))
        self.lines = array("q", bytes(8 * capacity))
        self.mask, self.count = capacity - 1, 0

    @staticmethod
    def digest(*parts: str) -> int:
        data = "\x00".join(parts).encode("utf-8", "surrogatepass")
        return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") | 1  # 0 is an empty slot

    def first_line(self, digest: int, line: int) -> int | None:
        """The line this key was first seen on; None when it is new (then remembered at `line`)."""
        i = digest & self.mask
        while True:
            seen = self.digests[i]
            if seen == digest:
                return self.lines[i]
            if seen == 0:
                break
            i = (i + 1) & self.mask
        self.digests[i], self.lines[i] = digest, line
        self.count += 1
        if self.count * 2 > self.mask:  # half full: twice the room
            digests, lines = self.digests, self.lines
            self._allocate(2 * (self.mask + 1))
            for d, n in zip(digests, lines):
                if d:
                    self.first_line(d, n)
        return None


SPOOL_ROWS = 10_000  # rows a spool holds in memory before it writes them


class SpooledTable:
    """Rows kept on disk as they come (a Parquet file in a temporary folder, batch by
    batch), read back batch by batch: a million-row table costs a batch of memory, not a
    million Python rows. Reads like the pa.Table it stands for (num_rows, to_batches,
    column, to_pylist, to_pydict); close() removes the file (so does the end of the process)."""

    def __init__(self, schema: pa.Schema, batch_rows: int | None = None):
        import tempfile

        self.schema, self.batch_rows = schema, batch_rows or SPOOL_ROWS
        self._folder = tempfile.TemporaryDirectory(prefix="mule-spool-")
        self.path = Path(self._folder.name) / "rows.parquet"
        self._writer = None
        self._pending = Rows()
        self._pending_rows = 0
        self.num_rows = 0
        self._finished = False

    def add(self, **values) -> None:
        self._pending.add(**values)
        self._pending_rows += 1
        if self._pending_rows >= self.batch_rows:
            self._flush()

    def _flush(self) -> None:
        import pyarrow.parquet as pq

        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, self.schema, compression="zstd")
        if self._pending_rows:
            self._writer.write_table(self._pending.table(self.schema), row_group_size=self.batch_rows)
            self.num_rows += self._pending_rows
        self._pending, self._pending_rows = Rows(), 0

    def finish(self) -> SpooledTable:
        if not self._finished:
            self._flush()
            self._writer.close()
            self._finished = True
        return self

    def to_batches(self, max_chunksize: int | None = None):
        import pyarrow.parquet as pq

        self.finish()
        yield from pq.ParquetFile(self.path).iter_batches(batch_size=max_chunksize or self.batch_rows)

    def read_all(self) -> pa.Table:
        batches = list(self.to_batches())
        return pa.Table.from_batches(batches, self.schema) if batches else self.schema.empty_table()

    def column(self, name: str) -> pa.ChunkedArray:
        return self.read_all().column(name)

    def to_pylist(self) -> list[dict]:
        return self.read_all().to_pylist()

    def to_pydict(self) -> dict[str, list]:
        return self.read_all().to_pydict()

    def close(self) -> None:
        self._folder.cleanup()


@dataclass
class ChainedTables:
    """Tables read one after the other as one (a spooled table, then a few rows more): what
    ingest reads of a reader's captions (num_rows, to_batches, close)."""

    parts: list

    @property
    def num_rows(self) -> int:
        return sum(part.num_rows for part in self.parts)

    def to_batches(self, max_chunksize: int | None = None):
        for part in self.parts:
            yield from part.to_batches(max_chunksize=max_chunksize)

    def close(self) -> None:
        for part in self.parts:
            if hasattr(part, "close"):
                part.close()
