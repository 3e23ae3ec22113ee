"""More human captions of a dataset's own images, in IGLUE's xFlickr&CO layout
(Bugliarello et al., ICML 2022; github.com/e-bug/iglue, datasets/xFlickrCO/annotations):

    <folder>/<lang>/<name>.jsonl     one JSON object a line:
                                     {"sentences": ["..."], "id": "<image id>", "img_path": "<id>.jpg"}

They join the dataset ingest read (Multi30K's images are named by their Flickr ids, as
xFlickr&CO's are): `data.extra_captions` names the folder and `data.extra_files` each
file's split, by its name (`train_100=train,test=test_xflickrco`). A split the dataset has
adds the file's captions to its images (a row whose image is in no split of the dataset,
or in another, is a reject saying which); any other name is a split of its own over the
images the file names, kept apart from the dataset's (role `extra`: never trained on, its
image keeps its split) and measured with eval.split=<name>: the same photos' captions by
other writers. Only languages in data.languages are read; a language the dataset's own
files lack (es, id, ja, ru, zh for Multi30K) then comes from here alone.

The Japanese captions carry phrase-alignment digits glued to words as released
(`耳ピアスをした1男が、3メガネをかけて`): their ASCII digits are removed (counts there are
written in kanji: 二人), and the ingest summary says in how many captions.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from mule.datasets.readers.base import DatasetReadError, ReadOptions, Rejects, Rows, capped_lines, clean_caption

ALIGNMENT_DIGITS = {"ja": re.compile(r"[0-9]+")}  # per language: what the release glued to its words
MAX_LINE_BYTES = 1 << 16  # a line holds one photo's few sentences


class ExtraCaptionsError(DatasetReadError):
    pass


@dataclass
class ExtraCaptions:
    captions: pa.Table  # the captions schema less tokens (what ingest tokenises)
    rejects: pa.Table
    notes: dict = field(default_factory=dict)  # for the ingest summary
    languages: tuple[str, ...] = ()  # the languages the files brought


def parse_files(files: dict[str, str]) -> dict[str, str]:
    """data.extra_files as {name without .jsonl: split}; a name is a file of every language
    (train_100) or of one (ja/train_1500); an empty name or split is an error."""
    parsed = {}
    for name, split in files.items():
        stem, split = str(name).strip().removesuffix(".jsonl"), str(split).strip()
        if not stem or not split or stem.count("/") > 1 or stem.startswith("/") or stem.endswith("/"):
            raise ExtraCaptionsError(f"data.extra_files: {name}={split} is not NAME=SPLIT or LANG/NAME=SPLIT "
                                     "(e.g. train_100=train, ja/train_1500=train)")  # fmt: skip
        parsed[stem] = split
    return parsed


def files_of(files: dict[str, str], lang: str) -> dict[str, str]:
    """The named files a language reads: {name: split}; a name given for this language alone
    (ja/train_1500=train) takes the place of those given for every language for its split."""
    own = {stem.split("/", 1)[1]: split for stem, split in files.items() if stem.startswith(f"{lang}/")}
    shared = {stem: split for stem, split in files.items() if "/" not in stem and split not in own.values()}
    return shared | own


def provided_languages(folder: Path, files: dict[str, str], languages) -> tuple[str, ...]:
    """The languages of data.languages that have one of the named files in the folder."""
    folder = Path(folder)
    return tuple(lang for lang in languages
                 if any((folder / lang / f"{stem}.jsonl").is_file() for stem in files_of(files, lang)))  # fmt: skip


def read_extra_captions(folder: Path, files: dict[str, str], dataset: str, images: pa.Table,
                        options: ReadOptions, captions_schema: pa.Schema, rejects_schema: pa.Schema) -> ExtraCaptions:  # fmt: skip
    """The named files' captions in data.languages for the images ingest read (`images`:
    the images table: image_id, split, role)."""
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise ExtraCaptionsError(f"data.extra_captions={folder}: no such folder")
    files = parse_files(files)
    if not files:
        raise ExtraCaptionsError(f"data.extra_captions={folder} names no file: set data.extra_files "
                                 "(e.g. train_100=train,test=test_xflickrco: each file's split)")  # fmt: skip
    of_image = dict(zip(images.column("image_id").to_pylist(),
                        zip(images.column("split").to_pylist(), images.column("role").to_pylist())))  # fmt: skip
    roles = {split: role for split, role in of_image.values()}
    languages = provided_languages(folder, files, options.languages or sorted(p.name for p in folder.iterdir()))
    if not languages:
        wanted = ", ".join(options.languages or ())
        raise ExtraCaptionsError(f"{folder}: none of the files {', '.join(f'{s}.jsonl' for s in files)} is there "  # noqa: E501
                                 f"for a language of data.languages ({wanted}) (<lang>/<file>.jsonl)")  # fmt: skip
    reading = _Reading(folder, dataset, of_image, options,
                       rejects=Rejects(dataset, options.strict, error=ExtraCaptionsError))
    counts: dict[str, Counter] = {}
    for lang in languages:
        for stem, split in files_of(files, lang).items():
            path = folder / lang / f"{stem}.jsonl"
            if not path.is_file():
                continue
            role = roles.get(split, "extra")
            kept = _read_file(reading, path, lang, split, role)
            counts.setdefault(lang, Counter())[split] += kept
    notes = {"extra_captions": {"folder": str(folder), "files": files,
                                "captions": {lang: dict(c) for lang, c in counts.items()}}}  # fmt: skip
    for lang, n in reading.stripped.items():
        notes["extra_captions"][f"{lang}_alignment_digits_removed"] = n
    return ExtraCaptions(reading.rows.table(captions_schema), reading.rejects.rows.table(rejects_schema), notes,
                         languages)


@dataclass
class _Reading:
    """What every file of one read shares: where, which dataset and images, the rows and
    rejects it gathers, and the alignment digits removed per language."""

    folder: Path
    dataset: str
    of_image: dict  # image_id -> (split, role)
    options: ReadOptions
    rows: Rows = field(default_factory=Rows)
    rejects: Rejects | None = None
    stripped: Counter = field(default_factory=Counter)


def _read_file(reading: _Reading, path: Path, lang: str, split: str, role: str) -> int:
    """One jsonl file's captions into reading.rows; its bad lines into reading.rejects, each
    with its reason. Returns how many captions it kept."""
    folder, dataset, of_image, options = reading.folder, reading.dataset, reading.of_image, reading.options
    rows, rejects, stripped = reading.rows, reading.rejects, reading.stripped
    rel = f"{folder.name}/{path.relative_to(folder).as_posix()}"
    kept = 0
    with path.open("rb") as handle:
        lines = capped_lines(handle, MAX_LINE_BYTES)
    for number, raw in enumerate(lines, start=1):
        if not isinstance(raw, bytes):
            rejects.add(rel, number, "too_long", f"a line of {raw.size:,} bytes (one photo's sentences are far fewer)", raw)
            continue
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            image_id = str(record.get("id") or Path(str(record["img_path"])).stem)
            sentences = record["sentences"]
            if isinstance(sentences, str):
                sentences = [sentences]
            if not isinstance(sentences, list):
                raise TypeError("sentences is not a list")
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            rejects.add(rel, number, "bad_record", f"not an xFlickr&CO record ({error}): expected "
                        '{"sentences": [...], "id": ..., "img_path": ...}', raw)  # fmt: skip
            continue
        found = of_image.get(image_id)
        if found is None:
            rejects.add(rel, number, "no_image", f"image {image_id} is in no split of dataset {dataset!r}", raw)
            continue
        image_split, image_role = found
        if role == "extra" and image_role == "train":
            rejects.add(rel, number, "split_conflict", f"image {image_id} is a training image (split {image_split}): "
                        f"split {split} measures images never trained on", raw)  # fmt: skip
            continue
        if role != "extra" and image_split != split:
            rejects.add(rel, number, "split_conflict", f"image {image_id} is in split {image_split}, not {split} "
                        f"(data.extra_files gives {path.stem}.jsonl split {split})", raw)  # fmt: skip
            continue
        for index, sentence in enumerate(sentences):
            if not isinstance(sentence, str):
                rejects.add(rel, number, "bad_record", f"sentence {index + 1} is not text", raw)
                continue
            text, kind, reason = clean_caption(sentence.encode("utf-8"), options.max_caption_bytes)
            if text is not None and lang in ALIGNMENT_DIGITS:
                bare = ALIGNMENT_DIGITS[lang].sub("", text).strip()
                if bare != text:
                    stripped[lang] += 1
                text = bare or None
                if text is None:
                    kind, reason = "empty", "empty caption once its alignment digits are removed"
            if text is None:
                rejects.add(rel, number, kind, reason, raw)
                continue
            rows.add(caption_id=f"{rel}:{number}" + (f"#{index + 1}" if len(sentences) > 1 else ""), dataset=dataset,
                     image_id=image_id, split=split, role=role, lang=lang, text=text, source=f"xflickrco/{path.stem}",
                     source_file=rel, line=number, origin_caption_id=None, also_in=None, source_version=None)  # fmt: skip
            kept += 1
    return kept
