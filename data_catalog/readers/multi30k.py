"""Reader for the official Multi30K repository layout (github.com/multi30k/dataset).

    data/task1/image_splits/<split>.txt          image file names, one per line
    data/task1/raw/<split>.<lang>.gz             one caption per image (en + translations)
    data/task2/image_splits/<split>_images.txt
    data/task2/raw/<split>.<1..5>.<lang>.gz      five independent captions per image

Serves the real text (no images: they are recorded as missing) and the generated
embedded dataset alike. Provenance is kept per caption (file and line). Task1's
English line repeats one of the image's task2 English captions: it is merged into that
row (`also_in`), and task1's translations point at it (`origin_caption_id`).

Bad lines (invalid UTF-8, empty, control characters) are rejected with their file,
line and reason and kept in the rejects table; files that don't line up with their
split file are an error that names both files.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import unicodedata
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from PIL import Image

from ..schemas import CAPTIONS, IMAGES, REJECTS

# (split name in the catalog, role, task1 file stem, task2 file stem)
SPLITS = (
    ("train", "train", "train", "train"),
    ("val", "val", "val", "val"),
    ("test_2016", "test", "test_2016_flickr", "test_2016"),
    ("test_2017_flickr", "extra", "test_2017_flickr", None),
    ("test_2017_mscoco", "extra", "test_2017_mscoco", None),
    ("test_2018_flickr", "extra", "test_2018_flickr", None),
)
REQUIRED_SPLITS = ("train", "val", "test_2016")
TASK1_SOURCE_LANG = "en"
_TASK2_FILE = re.compile(r"^(?P<stem>.+)\.(?P<index>[1-9])\.(?P<lang>[a-z]{2})\.gz$")


class Multi30kError(ValueError):
    pass


@dataclass
class ReadResult:
    images: pa.Table
    captions: pa.Table
    rejects: pa.Table
    merged_task1_lines: int = 0
    stats: dict = field(default_factory=dict)


@dataclass
class _Rows:
    columns: dict[str, list] = field(default_factory=dict)

    def add(self, **values) -> None:
        for key, value in values.items():
            self.columns.setdefault(key, []).append(value)

    def table(self, schema: pa.Schema) -> pa.Table:
        return pa.table({name: self.columns.get(name, []) for name in schema.names}, schema=schema)


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _read_gzip_lines(path: Path, root: Path) -> list[bytes]:
    try:
        with gzip.open(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError, zlib.error) as error:
        raise Multi30kError(f"{_rel(path, root)}: not a readable gzip file ({error})") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _read_split_file(path: Path, root: Path) -> list[str]:
    names, seen = [], {}
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1].strip() == b"":
        lines.pop()  # final newline
    for number, raw in enumerate(lines, start=1):
        try:
            name = raw.decode("utf-8").strip()
        except UnicodeDecodeError as error:
            raise Multi30kError(f"{_rel(path, root)}:{number}: invalid UTF-8 in an image name ({error})") from None
        if not name:
            raise Multi30kError(f"{_rel(path, root)}:{number}: empty image name")
        name = name.split("#", 1)[0]  # test_2017_mscoco lines carry '#<caption id>'
        if name in seen:
            raise Multi30kError(f"{_rel(path, root)}:{number}: image {name} already listed at line {seen[name]}")
        seen[name] = number
        names.append(name)
    return names


def _clean(raw: bytes) -> tuple[str | None, str]:
    """(caption, '') or (None, reason)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, f"invalid UTF-8 at byte {error.start}"
    text = text.rstrip("\r").strip()
    if not text:
        return None, "empty caption"
    for column, char in enumerate(text, start=1):
        if unicodedata.category(char) == "Cc" and char != "\t":
            return None, f"control character U+{ord(char):04X} at column {column}"
    return text, ""


def _image_record(path: Path, with_hash: bool) -> tuple[bool, str | None, int | None, int | None]:
    if not path.is_file():
        return False, None, None, None
    sha = hashlib.sha256(path.read_bytes()).hexdigest() if with_hash else None
    try:
        with Image.open(path) as image:
            width, height = image.size
    except OSError:
        width = height = None
    return True, sha, width, height


@dataclass
class _SplitReader:
    """Reads the caption files of one split into the shared rows, aligned with its images."""

    root: Path
    dataset: str
    split: str
    role: str
    listing: Path  # the split file the image order comes from
    image_ids: list[str]
    captions: _Rows
    rejects: _Rows
    counts: dict[str, int] = field(default_factory=dict)

    def read_aligned(self, path: Path) -> list[bytes]:
        lines = _read_gzip_lines(path, self.root)
        if len(lines) != len(self.image_ids):
            raise Multi30kError(
                f"{_rel(path, self.root)} has {len(lines)} lines but {_rel(self.listing, self.root)} lists "
                f"{len(self.image_ids)} images: the files are not aligned"
            )
        return lines

    def add(self, path: Path, number: int, raw: bytes, lang: str, source: str, origin: str | None = None) -> str | None:
        """Adds one caption line (or rejects it); returns its caption id."""
        text, reason = _clean(raw)
        source_file = _rel(path, self.root)
        if text is None:
            self.rejects.add(dataset=self.dataset, source_file=source_file, line=number, reason=reason,
                             raw=raw.decode("utf-8", "backslashreplace"))  # fmt: skip
            return None
        caption_id = f"{source_file}:{number}"
        self.captions.add(caption_id=caption_id, dataset=self.dataset, image_id=self.image_ids[number - 1],
                          split=self.split, role=self.role, lang=lang, text=text, source=source,
                          source_file=source_file, line=number, origin_caption_id=origin, also_in=None)  # fmt: skip
        self.counts[lang] = self.counts.get(lang, 0) + 1
        return caption_id

    def read_task2(self, files: list[Path]) -> list[dict[str, int]]:
        """Independent captions; returns, per image, its English texts -> row in captions."""
        english: list[dict[str, int]] = [{} for _ in self.image_ids]
        for path in files:
            match = _TASK2_FILE.match(path.name)
            if not match:
                continue
            lang = match["lang"]
            for number, raw in enumerate(self.read_aligned(path), start=1):
                if self.add(path, number, raw, lang, "multi30k/task2") and lang == TASK1_SOURCE_LANG:
                    row = len(self.captions.columns["text"]) - 1
                    english[number - 1].setdefault(self.captions.columns["text"][row], row)
        return english

    def read_task1(self, raw_dir: Path, stem: str, task2_english: list[dict[str, int]]) -> int:
        """The English line (merged into the task2 caption it repeats) and its translations;
        returns how many English lines were merged."""
        merged = 0
        en_path = raw_dir / f"{stem}.{TASK1_SOURCE_LANG}.gz"
        origins: list[str | None] = [None] * len(self.image_ids)
        if en_path.exists():
            for number, raw in enumerate(self.read_aligned(en_path), start=1):
                text, _ = _clean(raw)
                row = task2_english[number - 1].get(text) if text is not None else None
                if row is not None:
                    self.captions.columns["also_in"][row] = f"{_rel(en_path, self.root)}:{number}"
                    origins[number - 1] = self.captions.columns["caption_id"][row]
                    merged += 1
                else:
                    origins[number - 1] = self.add(en_path, number, raw, TASK1_SOURCE_LANG, "multi30k/task1")
        for path in sorted(raw_dir.glob(f"{stem}.*.gz")):
            lang = path.name[len(stem) + 1 : -len(".gz")]
            if lang == TASK1_SOURCE_LANG or not re.fullmatch(r"[a-z]{2}", lang):
                continue
            for number, raw in enumerate(self.read_aligned(path), start=1):
                self.add(path, number, raw, lang, "multi30k/task1", origins[number - 1])
        return merged


def _split_images(root: Path, split: str, split1: Path, split2: Path | None, has1: bool, has2: bool):
    """The split's image names (task1 and task2 split files must agree) and the file they came from."""
    names1 = _read_split_file(split1, root) if has1 else None
    names2 = _read_split_file(split2, root) if has2 else None
    if names1 is not None and names2 is not None and names1 != names2:
        first = next((i for i, (a, b) in enumerate(zip(names1, names2)) if a != b), min(len(names1), len(names2)))
        raise Multi30kError(
            f"{_rel(split1, root)} and {_rel(split2, root)} disagree at line {first + 1} "
            f"({len(names1)} vs {len(names2)} images)"
        )
    return (names1, split1) if names1 is not None else (names2, split2)


def read_multi30k(
    root: Path,
    dataset: str,
    images_dir: Path | None = None,
    hash_images: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ReadResult:
    root = Path(root)
    data = root / "data"
    if not data.is_dir():
        raise Multi30kError(f"{root} is not a Multi30K checkout: {data} does not exist")
    images_dir = Path(images_dir) if images_dir else root / "images"
    images, captions, rejects = _Rows(), _Rows(), _Rows()
    merged = 0
    image_split: dict[str, str] = {}
    stats: dict[str, dict[str, int]] = {}

    for split, role, stem1, stem2 in SPLITS:
        split1 = data / "task1" / "image_splits" / f"{stem1}.txt"
        split2 = data / "task2" / "image_splits" / f"{stem2}_images.txt" if stem2 else None
        task2_files = sorted((data / "task2" / "raw").glob(f"{stem2}.[1-9].*.gz")) if split2 and split2.exists() else []
        has1, has2 = split1.exists(), bool(task2_files)
        if not has1 and not has2:
            if split in REQUIRED_SPLITS:
                raise Multi30kError(
                    f"split {split!r} not found under {root}: expected {_rel(split1, root)}"
                    + (f" or {_rel(split2, root)}" if split2 else "")
                )
            continue
        names, listing = _split_images(root, split, split1, split2, has1, has2)
        if progress:
            progress(f"{split}: {len(names)} images")

        image_ids = []
        for name in names:
            image_id = name.rsplit(".", 1)[0]
            if image_id in image_split:
                raise Multi30kError(f"image {name} of split {split} is also in split {image_split[image_id]}")
            image_split[image_id] = split
            image_ids.append(image_id)
            exists, sha, width, height = _image_record(images_dir / name, hash_images)
            images.add(dataset=dataset, image_id=image_id, file_name=name, path=str(images_dir / name), split=split,
                       role=role, exists=exists, sha256=sha, width=width, height=height)  # fmt: skip

        reader = _SplitReader(root, dataset, split, role, listing, image_ids, captions, rejects)
        english = reader.read_task2(task2_files)
        if has1:
            merged += reader.read_task1(data / "task1" / "raw", stem1, english)
        stats[split] = {"images": len(names), **dict(sorted(reader.counts.items()))}

    return ReadResult(
        images=images.table(IMAGES),
        captions=captions.table(CAPTIONS.remove(CAPTIONS.get_field_index("tokens"))),
        rejects=rejects.table(REJECTS),
        merged_task1_lines=merged,
        stats=stats,
    )
