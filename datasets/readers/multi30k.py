"""Reader for the official Multi30K repository layout (github.com/multi30k/dataset).

    data/task1/image_splits/<split>.txt          image file names, one per line
    data/task1/raw/<split>.<lang>.gz             one caption per image (en + translations)
    data/task2/image_splits/<split>_images.txt
    data/task2/raw/<split>.<1..5>.<lang>.gz      five independent captions per image

Serves the real text (no images: they are recorded as missing) and the generated
embedded dataset alike. Provenance is kept per caption (file and line). Task1's
English line repeats one of the image's task2 English captions: it is merged into that
row (`also_in`), and task1's translations point at it (`origin_caption_id`).

What the reader does with bad input (the README's table lists every case):
- soft: the line goes to the rejects table (file, line, kind, reason, raw bytes) and the
  read goes on: invalid UTF-8, empty or control-character captions, captions over
  `max_caption_bytes` (read in bounded chunks, never whole), blank, unsafe (a path) or
  duplicate image names in a split file (and the caption lines of that image), images
  left with no caption, caption files in a language outside `languages`;
- fatal (Multi30kError, naming the file and line): unreadable or truncated gzip, caption
  and split files of different lengths, an image in two splits, a missing required split
  or configured language, a split with no images or no usable captions.
`strict=True` makes every soft case fatal. Trailing blank lines and CRLF line ends are
accepted silently. The reader opens only the split and caption files of the layout above
and image files by names checked to stay inside the images folder.
"""

from __future__ import annotations

import functools
import gzip
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mule.data_catalog.schemas import CAPTIONS, IMAGES, REJECTS
from mule.datasets.readers.base import (
    DatasetReadError,
    ReadOptions,
    ReadResult,
    Rejects,
    Rows,
    TooLong,
    capped_lines,
    clean_caption,
    image_record,
)

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
MAX_NAME_BYTES = 255  # an image name longer than a file name can be is not one


class Multi30kError(DatasetReadError):
    pass


@functools.lru_cache(maxsize=256)  # called for every caption line: a few files, 450k lines
def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _drop_trailing_blank(lines: list, keep: int = 0) -> list:
    """Trailing blank lines (an editor's extra newlines, a lone CR) are not entries. The
    first `keep` lines always stay: a caption file's last caption may be empty (a reject)."""
    end = len(lines)
    while end > keep and isinstance(lines[end - 1], bytes) and not lines[end - 1].strip():
        end -= 1
    return lines[:end]


def _read_gzip_lines(path: Path, root: Path, cap: int) -> list[bytes | TooLong]:
    try:
        with gzip.open(path, "rb") as handle:
            return capped_lines(handle, cap)
    except (OSError, EOFError, zlib.error) as error:
        raise Multi30kError(f"{_rel(path, root)}: not a readable gzip file ({error})") from None


@dataclass(frozen=True)
class _Entry:
    """One line of a split file: an image name, or why the line names no usable image."""

    line: int
    name: str | None
    kind: str = ""
    reason: str = ""
    raw: bytes = b""


def _unsafe(name: str) -> str:
    """Why `name` could resolve outside the images folder ('' when it cannot)."""
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "an absolute path"
    if "/" in name or "\\" in name:
        return "a path, not a file name"
    if name in (".", "..") or "\x00" in name:
        return "not a file name"
    return ""


def _read_split_file(path: Path, root: Path) -> list[_Entry]:
    with path.open("rb") as handle:
        lines = _drop_trailing_blank(capped_lines(handle, MAX_NAME_BYTES))
    entries, seen = [], {}
    for number, raw in enumerate(lines, start=1):
        if isinstance(raw, TooLong):
            entries.append(_Entry(number, None, "bad_image_name", f"image name of {raw.size} bytes", raw.head))
            continue
        try:
            name = raw.decode("utf-8").strip()
        except UnicodeDecodeError as error:
            entries.append(_Entry(number, None, "bad_image_name", f"invalid UTF-8 at byte {error.start}", raw))
            continue
        name = name.split("#", 1)[0]  # test_2017_mscoco lines carry '#<caption id>'
        if not name:
            entries.append(_Entry(number, None, "blank_image_line", "blank line among the image names", raw))
        elif why := _unsafe(name):
            entries.append(_Entry(number, None, "unsafe_image_name", f"image name {name!r} is {why}", raw))
        elif name in seen:
            reason = f"image {name} already listed at line {seen[name]}"
            entries.append(_Entry(number, None, "duplicate_image", reason, raw))
        else:
            seen[name] = number
            entries.append(_Entry(number, name))
    return entries


@dataclass
class _SplitReader:
    """Reads the caption files of one split into the shared rows, aligned with its images."""

    root: Path
    dataset: str
    split: str
    role: str
    listing: Path  # the split file the image order comes from
    entries: list[_Entry]
    captions: Rows
    rejects: Rejects
    options: ReadOptions
    counts: dict[str, int] = field(default_factory=dict)
    per_image: dict[str, int] = field(default_factory=dict)  # image id -> captions kept

    def image_id(self, number: int) -> str | None:
        name = self.entries[number - 1].name
        return name.rsplit(".", 1)[0] if name else None

    def wanted(self, path: Path, lang: str) -> bool:
        """Caption files in a language outside data.languages are skipped, and say so."""
        if self.options.languages is None or lang in self.options.languages:
            return True
        known = ", ".join(self.options.languages)
        self.rejects.add(_rel(path, self.root), None, "unknown_language",
                         f"language {lang!r} is not in data.languages ({known}): file skipped", b"")  # fmt: skip
        return False

    def read_aligned(self, path: Path) -> list[bytes | TooLong]:
        n = len(self.entries)
        lines = _drop_trailing_blank(_read_gzip_lines(path, self.root, self.options.max_caption_bytes), keep=n)
        if len(lines) != n:
            raise Multi30kError(
                f"{_rel(path, self.root)} has {len(lines)} lines but {_rel(self.listing, self.root)} lists "
                f"{n} images: the files are not aligned"
            )
        return lines

    def add(self, path: Path, number: int, raw: bytes | TooLong, lang: str, source: str,
            origin: str | None = None) -> str | None:  # fmt: skip
        """Adds one caption line (or rejects it); returns its caption id."""
        source_file = _rel(path, self.root)
        image_id = self.image_id(number)
        if image_id is None:
            entry = self.entries[number - 1]
            reason = f"its image line {_rel(self.listing, self.root)}:{number} was rejected ({entry.reason})"
            self.rejects.add(source_file, number, "no_image", reason, raw)
            return None
        text, kind, reason = clean_caption(raw, self.options.max_caption_bytes)
        if text is None:
            self.rejects.add(source_file, number, kind, reason, raw)
            return None
        caption_id = f"{source_file}:{number}"
        self.captions.add(caption_id=caption_id, dataset=self.dataset, image_id=image_id,
                          split=self.split, role=self.role, lang=lang, text=text, source=source,
                          source_file=source_file, line=number, origin_caption_id=origin, also_in=None,
                          source_version=None)  # fmt: skip
        self.counts[lang] = self.counts.get(lang, 0) + 1
        self.per_image[image_id] = self.per_image.get(image_id, 0) + 1
        return caption_id

    def read_task2(self, files: list[Path]) -> list[dict[str, int]]:
        """Independent captions; returns, per image, its English texts -> row in captions."""
        english: list[dict[str, int]] = [{} for _ in self.entries]
        for path in files:
            match = _TASK2_FILE.match(path.name)
            if not match or not self.wanted(path, match["lang"]):
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
        origins: list[str | None] = [None] * len(self.entries)
        if en_path.exists() and self.wanted(en_path, TASK1_SOURCE_LANG):
            for number, raw in enumerate(self.read_aligned(en_path), start=1):
                text, _, _ = clean_caption(raw, self.options.max_caption_bytes)
                row = task2_english[number - 1].get(text) if text is not None else None
                if row is not None:
                    self.captions.columns["also_in"][row] = f"{_rel(en_path, self.root)}:{number}"
                    origins[number - 1] = self.captions.columns["caption_id"][row]
                    merged += 1
                else:
                    origins[number - 1] = self.add(en_path, number, raw, TASK1_SOURCE_LANG, "multi30k/task1")
        for path in sorted(raw_dir.glob(f"{stem}.*.gz")):
            lang = path.name[len(stem) + 1 : -len(".gz")]
            if lang == TASK1_SOURCE_LANG or not re.fullmatch(r"[a-z]{2}", lang) or not self.wanted(path, lang):
                continue
            for number, raw in enumerate(self.read_aligned(path), start=1):
                self.add(path, number, raw, lang, "multi30k/task1", origins[number - 1])
        return merged


def _split_entries(root: Path, split1: Path, split2: Path | None, has1: bool, has2: bool):
    """The split's image lines (task1 and task2 split files must agree) and the file they came from."""
    entries1 = _read_split_file(split1, root) if has1 else None
    entries2 = _read_split_file(split2, root) if has2 else None
    if entries1 is not None and entries2 is not None:
        names1, names2 = [e.name for e in entries1], [e.name for e in entries2]
        if names1 != names2:
            first = next((i for i, (a, b) in enumerate(zip(names1, names2)) if a != b), min(len(names1), len(names2)))
            raise Multi30kError(
                f"{_rel(split1, root)} and {_rel(split2, root)} disagree at line {first + 1} "
                f"({len(names1)} vs {len(names2)} images)"
            )
    return (entries1, split1) if entries1 is not None else (entries2, split2)


def _check_languages(split: str, reader: _SplitReader, root: Path, stem1: str, stem2: str | None) -> None:
    """In the splits training and evaluation need, every configured language has captions."""
    for lang in reader.options.languages or ():
        if reader.counts.get(lang) or lang in reader.options.optional:
            continue
        task1 = root / "data" / "task1" / "raw" / f"{stem1}.{lang}.gz"
        task2 = f" or data/task2/raw/{stem2}.<1..5>.{lang}.gz" if stem2 else ""
        if task1.exists() or (stem2 and any((root / "data/task2/raw").glob(f"{stem2}.[1-9].{lang}.gz"))):
            raise Multi30kError(f"split {split!r}: every {lang} caption line was rejected (see the rejects table)")
        raise Multi30kError(
            f"split {split!r} has no {lang} captions: expected {_rel(task1, root)}{task2}; "
            f"add the file, or leave {lang} out of data.languages"
        )


def read_multi30k(
    root: Path,
    dataset: str,
    images_dir: Path | None = None,
    hash_images: bool | Callable[[Path], str | None] = True,  # or a cached digest function
    progress: Callable[[str], None] | None = None,
    options: ReadOptions | None = None,
) -> ReadResult:
    root = Path(root)
    options = options or ReadOptions()
    try:
        return _read(root, dataset, images_dir, hash_images, progress, options)
    except Multi30kError as error:
        raise Multi30kError(f"{error} (in {root})") from None


def _read(root: Path, dataset: str, images_dir: Path | None, hash_images: bool,
          progress: Callable[[str], None] | None, options: ReadOptions) -> ReadResult:  # fmt: skip
    data = root / "data"
    if not data.is_dir():
        raise Multi30kError(f"not a Multi30K checkout: {data} does not exist")
    images_dir = Path(images_dir) if images_dir else root / "images"
    images, captions, rejects = Rows(), Rows(), Rejects(dataset, options.strict, error=Multi30kError)
    merged = 0
    image_split: dict[str, str] = {}
    stats: dict[str, dict[str, int]] = {}

    for split, role, stem1, stem2 in SPLITS:
        split1 = data / "task1" / "image_splits" / f"{stem1}.txt"
        split2 = data / "task2" / "image_splits" / f"{stem2}_images.txt" if stem2 else None
        task2_files = sorted((data / "task2" / "raw").glob(f"{stem2}.[1-9].*.gz")) if split2 and split2.exists() else []
        has1, has2 = split1.is_file(), bool(task2_files)
        if not has1 and not has2:
            if split in REQUIRED_SPLITS:
                raise Multi30kError(
                    f"split {split!r} not found: expected {_rel(split1, root)}"
                    + (f" or {_rel(split2, root)} with its caption files" if split2 else "")
                )
            continue
        entries, listing = _split_entries(root, split1, split2, has1, has2)
        if not entries:
            raise Multi30kError(f"{_rel(listing, root)} lists no images: split {split!r} is empty")
        if progress:
            progress(f"{split}: {len(entries)} images")
        for entry in entries:
            if entry.name is None:
                rejects.add(_rel(listing, root), entry.line, entry.kind, entry.reason, entry.raw)
                continue
            image_id = entry.name.rsplit(".", 1)[0]
            if image_id in image_split:
                raise Multi30kError(
                    f"{_rel(listing, root)}:{entry.line}: image {entry.name} of split {split} is also in split "
                    f"{image_split[image_id]}: an image in two splits leaks training data into evaluation"
                )
            image_split[image_id] = split

        reader = _SplitReader(root, dataset, split, role, listing, entries, captions, rejects, options)
        english = reader.read_task2(task2_files)
        if has1:
            merged += reader.read_task1(data / "task1" / "raw", stem1, english)
        asked = set(options.languages or ())
        if not reader.counts and not (asked and asked <= set(options.optional)):  # all optional: none is no error
            raise Multi30kError(f"split {split!r} has no usable caption (see the rejects table)")
        if split in REQUIRED_SPLITS:
            _check_languages(split, reader, root, stem1, stem2)

        kept = 0
        for entry in entries:
            if entry.name is None:
                continue
            image_id = entry.name.rsplit(".", 1)[0]
            if not reader.per_image.get(image_id):
                reason = f"image {entry.name} has no usable caption in any language"
                rejects.add(_rel(listing, root), entry.line, "no_captions", reason, entry.name.encode())
                continue
            kept += 1
            exists, sha, width, height = image_record(images_dir / entry.name, hash_images)
            images.add(dataset=dataset, image_id=image_id, file_name=entry.name, path=str(images_dir / entry.name),
                       split=split, role=role, exists=exists, sha256=sha, width=width, height=height)  # fmt: skip
        stats[split] = {"images": kept, **dict(sorted(reader.counts.items()))}

    return ReadResult(
        images=images.table(IMAGES),
        captions=captions.table(CAPTIONS.remove(CAPTIONS.get_field_index("tokens"))),
        rejects=rejects.rows.table(REJECTS),
        merged_task1_lines=merged,
        stats=stats,
    )
