"""The table layout's captions file, whatever wrote it: CSV with any of the usual
delimiters (sniffed), JSON Lines and Parquet, read as rows with their line numbers, cells
bounded in size, and the column names a table may give each role (image, caption,
language, split)."""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mule.datasets.readers.base import (
    DatasetReadError,
)

ROLES = {
    "image": ("file_name", "image", "image_path", "image_file", "filename", "file", "path", "img"),
    "caption": ("caption", "text", "sentence", "description", "captions", "sentences"),
    "lang": ("lang", "language", "locale", "lang_code"),
    "split": ("split", "set", "subset", "fold", "partition"),
}
WIDE = re.compile(r"^(?:caption|text|sentence)[_-](?P<lang>[A-Za-z]{2,3}(?:[_-][A-Za-z0-9]+)*)$")
class TableError(DatasetReadError):
    pass


CELL_LIMIT = 1 << 20
DELIMITERS = (",", ";", "\t", "|")  # what spreadsheets and databases write
SNIFF_BYTES = 1 << 16


def table_records(path: Path, where: str, encoding: str) -> tuple[list[str], Iterator[tuple[int, dict[str, Any], bytes]],
                                                              str | None]:  # fmt: skip
    """The table's columns, its records as (line, {column: value}, raw bytes of the record)
    read as they come (memory holds a record, or a batch of Parquet's, never the file), and
    the delimiter found (CSV: sniffed among , ; tab |)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _parquet(path, where)
    if suffix == ".jsonl":
        return _jsonl(path, where, encoding)
    return _csv(path, where, encoding, "\t" if suffix == ".tsv" else ",")


class _Lines:
    """A text file's lines as csv counts them ("\n", "\r\n" or "\r" ends one; U+2028 does
    not), decoded as they are read, numbered, with the lines of the record in hand kept for
    its raw text. A byte that is not in the encoding stops it, naming the line and column."""

    def __init__(self, path: Path, where: str, encoding: str):
        self.path, self.where, self.encoding = path, where, encoding
        codec = "utf-8-sig" if encoding.replace("_", "-").lower() in ("utf-8", "utf8") else encoding
        self.handle = io.TextIOWrapper(open(path, "rb"), encoding=codec, newline="")
        self.number = 0  # lines read so far
        self.taken: list[str] = []  # the lines since mark()
        self.ahead: list[str] = []  # read for sniffing, not yet handed out

    def __iter__(self):
        return self

    def __next__(self) -> str:
        if self.ahead:
            line = self.ahead.pop(0)
        else:
            line = self._read()
            if not line:
                raise StopIteration
        self.number += 1
        self.taken.append(line)
        return line

    def _read(self) -> str:
        try:
            return self.handle.readline()
        except UnicodeDecodeError:
            raise self._decode_error() from None

    def sample(self, size: int) -> tuple[list[str], bool]:
        """The first lines (about `size` characters) without consuming them; whether they are the whole file."""
        held = sum(map(len, self.ahead))
        while held < size:
            line = self._read()
            if not line:
                return list(self.ahead), True
            self.ahead.append(line)
            held += len(line)
        return list(self.ahead), False

    def mark(self) -> int:
        """A record starts: its first line's number."""
        self.taken = []
        return self.number + 1

    def raw(self) -> bytes:
        return "".join(self.taken).rstrip("\r\n").encode()

    def skip_to_end_of_cell(self, first: int, quotechar: str = '"') -> int:
        """After a cell too long to keep: reads on to the line where its quotes close (an
        odd count of quote characters so far means a quoted cell still open), keeping
        none of it (memory holds a line); returns that line's number. A quote still open at
        the end of the file is the malformed-CSV error naming `first`, the record's line: a
        quote left open, not a long caption, and not the rest of the file as one cell."""
        quotes = sum(line.count(quotechar) for line in self.taken)
        self.taken = []  # what is kept of the record was taken before (raw)
        while quotes % 2:
            line = self.ahead.pop(0) if self.ahead else self._read()
            if not line:
                raise TableError(f"{self.where}:{first}: malformed CSV (a quoted cell opens on this line and is still "
                                 f"open at the end of the file, {self.number - first + 1:,} lines on); a quoted cell "
                                 "must end with a quote (a quote left open? write a quote inside a cell as two)")  # fmt: skip
            self.number += 1
            quotes += line.count(quotechar)
        return self.number

    def close(self) -> None:
        self.handle.close()

    def _decode_error(self) -> TableError:
        """Where the first byte that is not in the encoding is: its line and column."""
        with open(self.path, "rb") as handle:
            for number, data in enumerate(handle, start=1):
                try:
                    data.decode(self.encoding)
                except UnicodeDecodeError as error:
                    return TableError(f"{self.where}:{number}: not {self.encoding} text (byte 0x{data[error.start]:02x} "
                                      f"at column {error.start + 1}); save the table as UTF-8, or name its encoding "
                                      "with data.encoding (e.g. cp1252)")  # fmt: skip
        return TableError(f"{self.where}: not {self.encoding} text; name its encoding with data.encoding")


def sniff_delimiter(lines: list[str], whole: bool, preferred: str) -> str:
    """The delimiter that splits the header into known columns and every sampled record into
    as many cells: `preferred` (the file's suffix's) unless another fits clearly better."""

    def fit(delimiter: str) -> tuple:
        records = list(csv.reader(lines if whole else lines[:-1], delimiter=delimiter))
        records = [r for r in records if any(c.strip() for c in r)]
        if not records:
            return (False, 0.0, 0)
        header = [h.strip().lower() for h in records[0]]
        known = any(h in names for names in ROLES.values() for h in header) or any(WIDE.match(h) for h in header)
        rest = records[1:]
        agree = sum(len(r) == len(header) for r in rest) / len(rest) if rest else 1.0
        return (len(header) > 1 and known, agree, len(header) > 1)

    scores = {d: fit(d) for d in dict.fromkeys((preferred, *DELIMITERS))}
    best = max(scores, key=lambda d: (scores[d], d == preferred))
    return best if scores[best] > scores[preferred] else preferred


def _csv(path: Path, where: str, encoding: str, preferred: str):
    lines = _Lines(path, where, encoding)
    sample, whole = lines.sample(SNIFF_BYTES)
    delimiter = sniff_delimiter(sample, whole, preferred)
    reader = csv.reader(lines, delimiter=delimiter, strict=True)
    limit = csv.field_size_limit()
    csv.field_size_limit(CELL_LIMIT)
    try:
        header = next(reader, None)
    except csv.Error as error:
        lines.close()
        raise TableError(f"{where}:1: not a readable header ({error})") from None
    finally:
        csv.field_size_limit(limit)
    if not header or not any(h.strip() for h in header):
        lines.close()
        raise TableError(f"{where}:1: no header row (the first line names the columns)")
    header = [h.strip() for h in header]
    repeated = [h for h, n in Counter(header).items() if n > 1]
    if repeated:
        lines.close()
        raise TableError(f"{where}:1: column {repeated[0]!r} appears {header.count(repeated[0])} times in the header")

    def records():
        limit = csv.field_size_limit(CELL_LIMIT)
        try:
            while True:
                line = lines.mark()
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error as error:
                    if "field larger than field limit" not in str(error):
                        raise TableError(f"{where}:{line}: malformed CSV ({error}); a quoted cell must end with a "
                                         "quote") from None  # fmt: skip
                    raw = lines.raw()[:4096]
                    last = lines.skip_to_end_of_cell(line)
                    yield line, {"__too_long__": CELL_LIMIT, "__through__": last}, raw
                    continue
                if not row or not any(cell.strip() for cell in row):
                    continue  # a blank line
                if len(row) != len(header):
                    yield line, {"__fields__": len(row), "__header__": len(header)}, lines.raw()
                else:
                    yield line, dict(zip(header, row)), lines.raw()
        finally:
            csv.field_size_limit(limit)
            lines.close()

    return header, records(), delimiter


def _jsonl(path: Path, where: str, encoding: str):
    """One JSON object a "\n"-ended line (not split at U+2028, which JSON allows inside a
    string). Two passes: the columns are every key any record has."""

    def lines():
        with open(path, "rb") as handle:
            codec = "utf-8-sig" if encoding.replace("_", "-").lower() in ("utf-8", "utf8") else encoding
            for number, data in enumerate(handle, start=1):
                if len(data) > CELL_LIMIT:
                    yield number, None, data[:4096]
                    continue
                try:
                    text = data.decode(codec if number == 1 else codec.removesuffix("-sig"))
                except UnicodeDecodeError as error:
                    raise TableError(f"{where}:{number}: not {encoding} text (byte 0x{data[error.start]:02x} at "
                                     f"column {error.start + 1}); save the table as UTF-8, or name its encoding "
                                     "with data.encoding") from None  # fmt: skip
                yield number, text.rstrip("\n").removesuffix("\r"), None

    columns: dict[str, None] = {}
    records = 0
    for _, text, _ in lines():
        if text is None or not text.strip():
            continue
        records += 1
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            columns.update(dict.fromkeys(record))
    if not records:
        raise TableError(f"{where}: no records (one JSON object a line)")

    def parsed():
        for number, text, cut in lines():
            if text is None:
                yield number, {"__too_long__": CELL_LIMIT}, cut
                continue
            if not text.strip():
                continue
            raw = text.encode()
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                yield number, {"__json__": f"not valid JSON at column {error.colno} ({error.msg})"}, raw
                continue
            if not isinstance(record, dict):
                yield number, {"__json__": f"a JSON {type(record).__name__}, not an object"}, raw
                continue
            yield number, record, raw

    return list(columns), parsed(), None


def _parquet(path: Path, where: str):
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except Exception as error:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
        raise TableError(f"{where}: not a readable Parquet file ({error})") from None

    def rows():
        number = 0
        try:
            for batch in file.iter_batches(batch_size=4096):
                for row in batch.to_pylist():
                    number += 1
                    yield number, row, json.dumps(row, ensure_ascii=False, default=str).encode()
        except Exception as error:  # noqa: BLE001 - a damaged row group
            raise TableError(f"{where}: not a readable Parquet file (row {number + 1}: {error})") from None

    return file.schema_arrow.names, rows(), None
