"""Reader for the table layout: a folder of images and one captions table.

    <source>/metadata.jsonl | metadata.csv | metadata.parquet     Hugging Face's imagefolder
    <source>/captions.csv | .tsv | .jsonl | .parquet               or any file named by data.table
    <source>/<image paths the table names>                         or under data.images

Long form, one row per caption:       file_name,caption,lang[,split]
Wide form, one caption column a language:  file_name,caption_es,caption_pl[,split]

Columns are found by their usual names (ROLES; `caption_<lang>`, `text_<lang>` or
`sentence_<lang>` for the wide form); data.columns names others (`image=photo`,
`caption_es=beschreibung`). A long table without a language column is in the one language
of data.languages. Image paths are relative to the table's folder or to the images folder
(data.images), or absolute under one of them; linked folders are followed. A path that
leads out of both (`../x.png`, `/home/x.png`) is a reject (outside_dataset): a dataset's
files stay inside it. An image is identified by its path relative to where it was found.

Splits: a split column (train, val/valid/validation/dev, test or test_<name>) is used as
given; without one, each image is drawn into val or test by a hash of (data.split_seed,
its id) with data.val_share and data.test_share: an image keeps its split when rows are
added, and its captions never span splits.

Bad input: a row with a missing or unreadable image, an empty caption, a language code
that is not one, a split that is none, a duplicate of an earlier row, or (CSV) a wrong
number of fields goes to the rejects table with the file, its line and the reason. A
table that cannot be read at all (not in data.encoding, malformed CSV quoting, not a
Parquet file, no image or caption column, a column data.columns names that is not
there) is one error naming the file and the line.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from mule.data_catalog.schemas import CAPTIONS, IMAGES, REJECTS
from mule.data_catalog.sources import TABLE_NAMES, table_in
from mule.datasets.image_files import BadImage, probe
from mule.datasets.readers.base import (
    ReadOptions,
    ReadResult,
    Rejects,
    Rows,
    SeenKeys,
    SpooledTable,
    TooLong,
    clean_caption,
    image_record,
)
from mule.datasets.readers.image_paths import OutsideDataset, locate_image
from mule.datasets.readers.table_files import ROLES, WIDE, TableError, table_records
from mule.datasets.readers.table_splits import seeded_role, split_role
from mule.mule_core.languages import LanguageCodeError, language_code, read_language, variety_of
from mule.mule_core.progress import SHOWN

CAPTION_COLUMNS = CAPTIONS.remove(CAPTIONS.get_field_index("tokens"))  # what ingest adds the tokens to

_LINE_BREAK = re.compile(r"[ \t]*(?:\r\n|[\r\n\x85\u2028\u2029])[ \t]*")  # inside a quoted cell


@dataclass(frozen=True)
class TableOptions:
    table: str = ""  # the file, relative to the source folder; "": found (sources.TABLE_NAMES)
    columns: dict[str, str] = field(default_factory=dict)  # role -> column, beside the usual names
    encoding: str = "utf-8"
    val_share: float = 0.1
    test_share: float = 0.1
    split_seed: int = 0


@dataclass
class Layout:
    """Which column plays which role."""

    image: str
    split: str | None
    caption: str | None = None  # long form
    lang: str | None = None  # long form; None: every caption is in `single`
    single: str | None = None
    wide: dict[str, str] = field(default_factory=dict)  # lang -> column (wide form)
    ignored: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        """What the ingest's summary (and MLflow) records of the table's columns."""
        form = {"form": "wide", "captions": self.wide} if self.wide else {"form": "long", "caption": self.caption,
                                                                          "lang": self.lang or f"(all {self.single})"}  # fmt: skip
        return {**form, "image": self.image, "split": self.split or "(drawn by data.split_seed)", "ignored": self.ignored}


def find_table(root: Path, name: str) -> Path:
    if name and (Path(name).is_absolute() or ".." in Path(name).parts):
        raise TableError(f"data.table={name}: the captions table must be inside the dataset folder {root} "
                         "(name it relative to that folder, or point --source at the folder that holds it)")  # fmt: skip
    path = table_in(root, name)
    if path is None:
        if name:
            raise TableError(f"{root / name}: no such file (data.table)")
        raise TableError(f"{root}: no captions table: expected one of {', '.join(TABLE_NAMES)}, or name it with data.table")
    return path


# A cell longer than this is no caption (data.max_caption_bytes rejects far less): the row
# is rejected as soon as the cell passes it, without reading the cell into memory whole.
def layout(columns: list[str], where: str, options: TableOptions, languages: tuple[str, ...] | None) -> Layout:
    """Which column is which, from data.columns and the usual names; an error naming the
    columns there are when a role cannot be filled."""
    chosen: dict[str, str] = {}
    for role, column in options.columns.items():
        if column not in columns:
            raise TableError(f"{where}: data.columns names {role}={column}, but the table's columns are {', '.join(columns)}")
        if role not in ROLES and not WIDE.match(role):
            raise TableError(f"data.columns: {role!r} is no role; roles are {', '.join(ROLES)} and caption_<lang>")
        chosen[role] = column
    lowered = {c.lower(): c for c in columns}
    for role, names in ROLES.items():
        if role not in chosen:
            found = next((lowered[n] for n in names if n in lowered and lowered[n] not in chosen.values()), None)
            if found:
                chosen[role] = found
    wide: dict[str, str] = {}
    for role, column in chosen.items():  # caption_<lang> named by data.columns
        if match := WIDE.match(role):
            wide[_code(match["lang"], where)] = column
    if "caption" not in chosen:  # the wide form, found by its columns' names; in a long table
        for column in columns:  # caption_id or text_len are other columns, not Indonesian captions
            match = WIDE.match(column) if column not in chosen.values() else None
            code = _language_or_none(match["lang"]) if match else None
            if code:  # caption_xyz, xyz no language: listed with the ignored columns
                wide.setdefault(code, column)
    if "image" not in chosen:
        raise TableError(f"{where}: no image column: expected one of {', '.join(ROLES['image'])} "
                         f"(or data.columns=image=NAME); the columns are {', '.join(columns)}")  # fmt: skip
    if "caption" in chosen and wide:
        raise TableError(f"{where}: both a caption column ({chosen['caption']}) and caption_<lang> columns "
                         f"({', '.join(wide.values())}); keep one form, or name the columns with data.columns")  # fmt: skip
    if "caption" not in chosen and not wide:
        raise TableError(f"{where}: no caption column: expected caption (long form, with a lang column) or "
                         f"caption_<lang> columns (wide form); the columns are {', '.join(columns)}")  # fmt: skip
    used = {chosen.get("image"), chosen.get("split"), *wide.values()}
    if wide:
        return Layout(chosen["image"], chosen.get("split"), wide=wide,
                      ignored=[c for c in columns if c not in used and c != chosen.get("lang")])  # fmt: skip
    single = None
    if "lang" not in chosen:
        if not languages or len(languages) != 1:
            raise TableError(f"{where}: no language column ({', '.join(ROLES['lang'])}): name it with data.columns=lang=NAME, "
                             f"or set data.languages to the one language of every caption")  # fmt: skip
        single = languages[0]
    used |= {chosen["caption"], chosen.get("lang")}
    return Layout(chosen["image"], chosen.get("split"), chosen["caption"], chosen.get("lang"), single,
                  ignored=[c for c in columns if c not in used])  # fmt: skip


def _language_or_none(value: str) -> str | None:
    try:
        return language_code(value)
    except LanguageCodeError:
        return None


def _code(value: str, where: str) -> str:
    try:
        return language_code(value)
    except LanguageCodeError as error:
        raise TableError(f"{where}: a caption column's language: {error}") from None


@dataclass(slots=True)
class _Image:
    image_id: str
    path: str
    split: str
    role: str
    line: int


def read_table(root: Path, dataset: str, images_dir: Path | None, hash_images,
               progress: Callable[[str], None] | None, options: ReadOptions, table: TableOptions) -> ReadResult:  # fmt: skip
    root = Path(root)
    if not root.is_dir():
        raise TableError(f"dataset folder {root} does not exist")
    say = progress or (lambda _message: None)
    path = find_table(root, table.table)
    where = os.path.relpath(path, root) if path.is_relative_to(root) else str(path)
    columns, records, delimiter = table_records(path, where, table.encoding)
    roles = layout(columns, where, table, options.languages)
    named = {",": "commas", ";": "semicolons", "\t": "tabs", "|": "bars"}
    say(f"{where}: {'wide' if roles.wide else 'long'} form"
        + (f", cells separated by {named[delimiter]}" if delimiter else "") + f"; image column {roles.image!r}"
        + (f", split column {roles.split!r}" if roles.split else ", splits drawn by data.split_seed")
        + (f"; ignored columns: {', '.join(roles.ignored)}" if roles.ignored else ""))  # fmt: skip
    extra = Path(images_dir) if images_dir else None
    bases = [path.parent] + ([extra] if extra and extra != path.parent and extra.is_dir() else [])
    rows = _Rows(dataset, where, roles, table, options, bases, Rejects(dataset, options.strict, error=TableError))
    try:
        for line, record, raw in records:
            rows.read(line, record, raw)
        rows.seen = rows.located = rows.bad_images = None  # read: what only reading needs goes first
        return _result(rows, dataset, hash_images, say, options, roles, delimiter)
    except BaseException:
        rows.captions.close()
        raise


def _key(value):
    """A lang cell as a dict key (a JSON list or object is not hashable)."""
    return value if isinstance(value, str | int | float | bool | None) else repr(value)


class _Rows:
    """The table's records read one by one into images and captions; what is wrong with a
    record goes to the rejects with its line."""

    def __init__(self, dataset: str, where: str, roles: Layout, table: TableOptions, options: ReadOptions,
                 bases: list[Path], rejects: Rejects):  # fmt: skip
        self.dataset, self.where, self.roles, self.table, self.options = dataset, where, roles, table, options
        self.bases, self.rejects = bases, rejects
        self.images: dict[str, _Image] = {}
        self.bad_images: dict[str, tuple[str, str]] = {}  # the image as named -> (kind, reason), decided once
        self.located: dict[str, str] = {}  # the image as named -> its id: a file looked up once
        self.seen = SeenKeys()  # (image, lang, caption) -> its line
        self.captions = SpooledTable(CAPTION_COLUMNS)  # on disk as they come: a table of millions of rows
        self.counts: Counter = Counter()  # (split, lang) -> captions kept
        self.captioned: set[str] = set()  # images with a caption kept
        self.other_languages: Counter = Counter()
        self.wanted = set(options.languages) if options.languages else None
        self.codes: dict = {}  # a lang cell as written -> (its code, how it was read) or the reason it is none
        self.read_as: Counter = Counter()  # (cell, code, how) -> rows read so: a name, a region of a wanted language

    def reject(self, line: int, kind: str, reason: str, raw: bytes) -> None:
        self.rejects.add(self.where, line, kind, reason, raw)

    def read(self, line: int, record: dict, raw: bytes) -> None:
        if "__json__" in record:
            return self.reject(line, "bad_record", record["__json__"], raw)
        if "__fields__" in record:
            reason = f"{record['__fields__']} fields, the header has {record['__header__']} (a comma in an unquoted cell?)"
            return self.reject(line, "bad_record", reason, raw)
        if "__too_long__" in record:
            through = record.get("__through__", line)
            lines = f" over lines {line:,}-{through:,}" if through > line else ""
            reason = (f"a cell of more than {record['__too_long__']:,} characters{lines}: no caption is that long "
                      "(the row is skipped)")  # fmt: skip
            return self.reject(line, "too_long", reason, raw)
        found = self.image(line, record.get(self.roles.image), raw)
        if found is None:
            return None
        image_id, file = found
        named = self.split(line, record, image_id, raw)
        if named is None:
            return None
        if image_id not in self.images:
            self.images[image_id] = _Image(image_id, file, named[0], named[1], line)
        cells = self.roles.wide.items() if self.roles.wide else [(None, self.roles.caption)]
        for wide_lang, column in cells:
            self.caption(line, record, image_id, wide_lang, column, raw)
        return None

    def image(self, line: int, value, raw: bytes) -> tuple[str, str] | None:
        """(image id, file) of the row's image, or None with the row rejected."""
        if value is None or not str(value).strip():
            self.reject(line, "no_image", f"no image named in column {self.roles.image!r}", raw)
            return None
        value = str(value).strip()
        image_id = self.located.get(value)
        if image_id is not None and image_id in self.images:  # the common case: an image already read
            return image_id, self.images[image_id].path
        if value not in self.bad_images:
            found = self.find(value)
            if found is not None:
                self.located[value] = found[0]
                return found
        self.reject(line, *self.bad_images[value], raw)
        return None

    def find(self, value: str) -> tuple[str, str] | None:
        """(image id, file) of an image as named, looked up once; None with the reason in bad_images."""
        try:
            found = locate_image(value, self.bases)
        except OutsideDataset:
            self.bad_images[value] = ("outside_dataset", f"image path {value!r} leads outside the dataset (only "
                                      f"files under {' or '.join(map(str, self.bases))} are read)")  # fmt: skip
            return None
        if found is None:
            looked = ", ".join(map(str, self.bases))
            self.bad_images[value] = ("no_image", f"image file {value!r} not found (looked in {looked})")
        elif found[0] not in self.images:
            try:
                probe(found[1])
            except BadImage as error:
                self.bad_images[value] = ("bad_image", f"image {value!r} cannot be read: {error}")
                return None
        return found

    def split(self, line: int, record: dict, image_id: str, raw: bytes) -> tuple[str, str] | None:
        """(split, role) of the row's image: given, else drawn; None with the row rejected."""
        given = record.get(self.roles.split) if self.roles.split else None
        if given is not None and str(given).strip():
            named = split_role(given)
            if named is None:
                self.reject(line, "bad_split", f"split {given!r} is none of train, val, test, test_<name>", raw)
                return None
        else:
            role = seeded_role(image_id, self.table)
            named = (role, role)
        known = self.images.get(image_id)
        if known and (known.split, known.role) != named:
            self.reject(line, "split_conflict",
                        f"image {image_id!r} is in split {known.split} on line {known.line}, here {named[0]}", raw)  # fmt: skip
            return None
        return named

    def caption(self, line: int, record: dict, image_id: str, wide_lang: str | None, column: str, raw: bytes) -> None:
        cell = record.get(column)
        if wide_lang is not None and (cell is None or not str(cell).strip()):
            return  # a wide table's empty cell: no caption in that language
        lang = wide_lang
        if lang is None:
            value = self.roles.single if self.roles.lang is None else record.get(self.roles.lang)
            lang = self.language(value)
            if lang is None:
                return self.reject(line, "bad_language", f"column {self.roles.lang!r}: {self.codes[_key(value)]}", raw)
        many = isinstance(cell, (list, tuple))  # JSONL or Parquet: a list of captions in one cell
        if self.wanted is not None and lang not in self.wanted:
            self.other_languages[lang] += len(cell) if many else 1
            return
        for k, one in enumerate(cell if many else [cell]):
            self.one_caption(line, image_id, lang, column, one, f":{k}" if many else "", raw)

    def language(self, value) -> str | None:
        """The code a lang cell names, decided once per value: a code as written (EN -> en);
        a language's name (English, Deutsch) or a region tag of a language data.languages
        has without its region (en-US when it has en) read as that code, and counted (said
        after reading); None when it names no language, or a variety of one in another
        script (zh-Hant where data.languages has zh): the reason in `codes`."""
        key = _key(value)
        if key not in self.codes:
            self.codes[key] = self._decide(value)
        found = self.codes[key]
        if isinstance(found, str):
            return None
        code, how = found
        if how:
            self.read_as[str(value), code, how] += 1
        return code

    def _decide(self, value) -> tuple[str, str] | str:
        try:
            code, how = read_language(value)
        except LanguageCodeError as error:
            return error.args[0]
        if self.wanted is not None and code not in self.wanted:
            shorter, why = variety_of(code, self.wanted)
            if why:  # zh-Hant where data.languages has zh: another script, never read as it
                return f"{why}: add {code} to data.languages to read its captions"
            if shorter:
                code, how = shorter, f"{how} and " * bool(how) + f"data.languages has {shorter} without {code}'s subtags"
        return code, how

    def one_caption(self, line: int, image_id: str, lang: str, column: str, cell, part: str, raw: bytes) -> None:
        # a line break inside a quoted cell is layout, not part of the sentence
        text = _LINE_BREAK.sub(" ", str(cell)) if cell is not None else ""
        data, cap = text.encode(), self.options.max_caption_bytes
        text, kind, reason = clean_caption(data if len(data) <= cap else TooLong(data[:cap], len(data)), cap)
        if text is None:
            return self.reject(line, kind, f"column {column!r}{part and f' item {part[1:]}'}: {reason}", raw)
        first = self.seen.first_line(SeenKeys.digest(image_id, lang, text), line)
        if first is not None:
            return self.reject(line, "duplicate", f"the same {lang} caption of {image_id!r} as line {first}", raw)
        image = self.images[image_id]
        self.counts[image.split, lang] += 1
        self.captioned.add(image_id)
        self.captions.add(caption_id=f"{self.where}:{line}" + (f":{lang}" if self.roles.wide else "") + part,
                          dataset=self.dataset, image_id=image_id, split=image.split, role=image.role, lang=lang,
                          text=text, source="table", source_file=self.where, line=line, origin_caption_id=None,
                          also_in=None, source_version=None)  # fmt: skip


def _result(rows_read: _Rows, dataset: str, hash_images, say, options: ReadOptions, roles: Layout,
            delimiter: str | None) -> ReadResult:  # fmt: skip
    images, captions, other_languages = rows_read.images, rows_read.captions.finish(), rows_read.other_languages
    counts = Counter()
    for (_, lang), n in rows_read.counts.items():
        counts[lang] += n
    shown = logging.getLogger("mule.ingest")
    for (value, code, how), n in sorted(rows_read.read_as.items()):
        shown.warning("%s: %d caption%s with %s %r read as %s (%s)", rows_read.where, n, "s" * (n > 1),
                      roles.lang, value, code, how, extra=SHOWN)  # fmt: skip
    for lang in options.languages or ():
        if not counts.get(lang) and lang not in options.optional:
            found = sorted(set(counts) | set(other_languages))
            bad = [kind for kind in rows_read.rejects.rows.columns.get("kind", []) if kind == "bad_language"]
            error = TableError(f"no usable {lang} captions in the table (its languages: {', '.join(found) or 'none'}"
                               + (f"; {len(bad)} rejected for a {roles.lang} that names no language: "
                                  "`mule catalog --rejects` lists them" if bad else "")
                               + "); set data.languages to the languages to train on")  # fmt: skip
            error.rejects = rows_read.rejects.rows.table(REJECTS)
            raise error
    if other_languages:
        shown.warning("captions in languages outside data.languages, left out: %s",
                      ", ".join(f"{n} {lang}" for lang, n in other_languages.most_common()), extra=SHOWN)  # fmt: skip
    stats: dict[str, dict[str, int]] = {}
    chunks, rows = [], Rows()
    for image_id in sorted(images):
        image = images.pop(image_id)  # each image's row replaces its object: one copy at a time
        if image.image_id not in rows_read.captioned:
            continue  # every caption of it was rejected or in another language
        exists, sha, width, height = image_record(Path(image.path), hash_images)
        rows.add(dataset=dataset, image_id=image.image_id, file_name=os.path.basename(image.path), path=image.path,
                 split=image.split, role=image.role, exists=exists, sha256=sha, width=width, height=height)  # fmt: skip
        stats.setdefault(image.split, {"images": 0})["images"] += 1
        if len(rows.columns["image_id"]) >= 10_000:
            chunks.append(rows.table(IMAGES))
            rows = Rows()
    chunks.append(rows.table(IMAGES))
    for (split, lang), n in sorted(rows_read.counts.items()):
        stats[split][lang] = n
    for name, figures in sorted(stats.items()):
        say(f"{name}: {figures}")
    described = roles.describe() | ({"delimiter": delimiter} if delimiter else {})
    notes = {"table": described, "left_out_languages": dict(other_languages)}
    return ReadResult(images=pa.concat_tables(chunks), captions=captions, rejects=rows_read.rejects.rows.table(REJECTS),
                      stats=stats, notes=notes)
