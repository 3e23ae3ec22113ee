"""A language's captions of a dataset's own images, from a table a user gives (`mule run
add-language --lang es --captions es.csv`): CSV, TSV, JSON Lines or Parquet, read as the
table layout reads them (datasets/readers/table_files.py), xFlickr&CO's JSON Lines too.

    image,caption[,lang][,split]    image: the image's id, its file's name or its path
                                    caption: a sentence, or a list of them (JSON Lines, Parquet)

A row joins the image it names: its id, else the file the images table names (its path or
its name), else that name without its extension (xFlickr&CO's `1000092795.jpg` for image
1000092795). Its captions take that image's split. A row whose image the dataset lacks
(no_image), whose split column names another split than its image's (split_conflict), with
an empty or overlong caption, or repeating an earlier caption of the same image
(duplicate) is a reject with its file, line and reason. With a lang column (read as
everywhere: mule_core.languages.read_language), rows in other languages are left out and
counted; without one, every row is in the language the table is given for. xFlickr&CO's
records (`sentences`, `id`, `img_path`) are read as its own reader reads them: the
phrase-alignment digits of its Japanese captions removed (datasets/readers/xflickrco.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePath

import pyarrow as pa

from mule.data_catalog.schemas import REJECTS
from mule.datasets.readers.base import ReadOptions, Rejects, Rows, SeenKeys, clean_caption
from mule.datasets.readers.table import CAPTION_COLUMNS, TableOptions, layout
from mule.datasets.readers.table_files import ROLES, TableError, table_records
from mule.datasets.readers.table_splits import SPLITS
from mule.datasets.readers.xflickrco import ALIGNMENT_DIGITS
from mule.mule_core.languages import LanguageCodeError, read_language

# an image named by id (xFlickr&CO: `id`, `img_path`) as well as by file
IMAGE_COLUMNS = ("image_id", "id", "img_path")


class AddedCaptionsError(TableError):
    pass


@dataclass
class AddedCaptions:
    captions: pa.Table  # CAPTION_COLUMNS: the captions schema less tokens (what the step tokenises)
    rejects: pa.Table
    notes: dict = field(default_factory=dict)  # per file: captions kept per split, rows of other languages


class ImageIndex:
    """The dataset's images by id, by path and by file name: how a row finds its image."""

    def __init__(self, images: pa.Table):
        ids = images.column("image_id").to_pylist()
        self.split = dict(zip(ids, zip(images.column("split").to_pylist(), images.column("role").to_pylist())))
        self.by_name: dict[str, str] = {}
        for image_id, path, name in zip(ids, images.column("path").to_pylist(), images.column("file_name").to_pylist()):
            for key in (path, name, PurePath(str(path or "")).name):
                if key:
                    self.by_name.setdefault(str(key), image_id)

    def find(self, value) -> str | None:
        name = str(value).strip()
        if not name:
            return None
        if name in self.split:
            return name
        found = self.by_name.get(name) or self.by_name.get(PurePath(name).name)
        if found is not None:
            return found
        stem = PurePath(name).stem
        return stem if stem in self.split else None


def read_added_captions(path: Path, lang: str, dataset: str, images: pa.Table, options: ReadOptions,
                        encoding: str = "utf-8") -> AddedCaptions:  # fmt: skip
    """The captions in `lang` the table at `path` holds of the dataset's images (`images`:
    its images table), the rejects with their reasons, and what was left out."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise AddedCaptionsError(f"{path}: no such file (a table of {lang} captions: CSV, TSV, JSON Lines or Parquet)")
    where = path.name
    columns, records, _ = table_records(path, where, encoding)
    roles = _roles(columns, where, lang)
    index, rows, rejects = ImageIndex(images), Rows(), Rejects(dataset, options.strict, error=AddedCaptionsError)
    seen, kept, others, stripped = SeenKeys(), Counter(), Counter(), 0
    xflickrco = {"sentences", "img_path"} <= set(columns)
    for line, record, raw in records:
        if "__json__" in record or "__too_long__" in record or "__fields__" in record:
            reason = record.get("__json__") or (f"{record.get('__fields__')} fields, the header has "
                                                f"{record.get('__header__')}" if "__fields__" in record
                                                else "a cell too long for a caption")  # fmt: skip
            rejects.add(where, line, "bad_record", reason, raw)
            continue
        if roles["lang"] is not None:
            try:
                row_lang, _ = read_language(record.get(roles["lang"]))
            except LanguageCodeError as error:
                rejects.add(where, line, "bad_language", f"column {roles['lang']!r}: {error}", raw)
                continue
            if row_lang != lang:
                others[row_lang] += 1
                continue
        named = next((record.get(c) for c in roles["image"] if record.get(c) not in (None, "")), None)
        image_id = index.find(named) if named is not None else None
        if image_id is None:
            rejects.add(where, line, "no_image", f"no image of dataset {dataset!r} is named {named!r} (by its id, "
                        "its file or its path)" if named is not None else "no image named", raw)  # fmt: skip
            continue
        split, role = index.split[image_id]
        given = record.get(roles["split"]) if roles["split"] else None
        if given not in (None, "") and SPLITS.get(str(given).strip().lower(), str(given).strip()) not in (split, role):
            rejects.add(where, line, "split_conflict", f"image {image_id!r} is in split {split}, the row says {given}",
                        raw)  # fmt: skip
            continue
        cell = record.get(roles["caption"])
        sentences = cell if isinstance(cell, list | tuple) else [cell]
        for number, sentence in enumerate(sentences):
            if not isinstance(sentence, str):
                rejects.add(where, line, "bad_record", f"caption {number + 1} is not text", raw)
                continue
            text, kind, reason = clean_caption(sentence.encode("utf-8"), options.max_caption_bytes)
            if text is not None and xflickrco and lang in ALIGNMENT_DIGITS:
                bare = ALIGNMENT_DIGITS[lang].sub("", text).strip()
                stripped += bare != text
                text, kind, reason = (bare, "", "") if bare else (None, "empty", "empty once its alignment digits "
                                                                   "are removed")  # fmt: skip
            if text is None:
                rejects.add(where, line, kind, reason, raw)
                continue
            first = seen.first_line(SeenKeys.digest(image_id, text), line)
            if first is not None:
                rejects.add(where, line, "duplicate", f"the same {lang} caption of {image_id!r} as line {first}", raw)
                continue
            part = f"#{number + 1}" if len(sentences) > 1 else ""
            rows.add(caption_id=f"{where}:{line}{part}", dataset=dataset, image_id=image_id, split=split, role=role,
                     lang=lang, text=text, source=f"added/{path.stem}", source_file=where, line=line,
                     origin_caption_id=None, also_in=None, source_version=None)  # fmt: skip
            kept[split] += 1
    notes = {"file": str(path), "captions": dict(kept), "other_languages": dict(others)}
    if stripped:
        notes["alignment_digits_removed"] = stripped
    return AddedCaptions(rows.table(CAPTION_COLUMNS), rejects.rows.table(REJECTS), notes)


def _roles(columns: list[str], where: str, lang: str) -> dict:
    """Which columns name the image (several: the first filled wins), the caption, the
    language and the split."""
    lowered = {c.lower(): c for c in columns}
    image = [lowered[n] for n in (*ROLES["image"], *IMAGE_COLUMNS) if n in lowered]
    if not image:
        raise AddedCaptionsError(f"{where}: no image column: expected one of "
                                 f"{', '.join((*ROLES['image'], *IMAGE_COLUMNS))}; the columns are "
                                 f"{', '.join(columns)}")  # fmt: skip
    try:  # the caption, language and split columns as the table layout finds them
        found = layout(columns, where, TableOptions(columns={"image": image[0]}), (lang,))
    except TableError as error:
        raise AddedCaptionsError(str(error)) from None
    if found.wide:
        column = found.wide.get(lang)
        if column is None:
            raise AddedCaptionsError(f"{where}: no {lang} caption column (its columns: {', '.join(columns)})")
        return {"image": image, "caption": column, "lang": None, "split": found.split}
    return {"image": image, "caption": found.caption, "lang": found.lang, "split": found.split}
