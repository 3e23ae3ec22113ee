"""What every dataset reader shares: read options, the result tables, the rejects
collector (soft cases become rows with their reason; strict makes them errors), caption
cleaning and image records."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from mule.mule_core.errors import UserError

from ..content import sha256_file
from ..images import BadImage, probe


class DatasetReadError(UserError, ValueError):
    """Input a reader cannot go on with: names the file, the line (or record) and the fault."""


@dataclass(frozen=True)
class ReadOptions:
    languages: tuple[str, ...] | None = None  # None: every language with caption files
    strict: bool = False  # every soft case (a reject) becomes an error
    max_caption_bytes: int = 2000  # longer caption lines are rejected (Multi30K's longest is ~400)


@dataclass
class ReadResult:
    images: pa.Table
    captions: pa.Table
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
    (data_catalog.content.FileHasher.digest, which skips files whose stat is unchanged).
    Width and height come from the header and are None for a file that is no usable image
    (data_catalog.images): the features stage rejects it with the reason."""
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
