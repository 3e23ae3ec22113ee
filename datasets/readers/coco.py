"""Reader for MSCOCO with English, Japanese and Chinese captions, in the published files.

    captions_train2014.json, captions_val2014.json     COCO captions (English), often under annotations/
    dataset_coco.json                                  Karpathy's split (optional; English too if no COCO file)
    yjcaptions26k_clean.json                           YJ Captions 26k (Japanese, COCO-style)
    stair_captions_v1.2_train.json, _val.json          STAIR Captions (Japanese, COCO-style)
    imageid.human-written-caption.txt                  COCO-CN (Chinese): `COCO_val2014_000000573854#0<TAB>caption`
      (or imageid.caption.txt, as in the 201805 release), and imageid.manually-translated-caption.txt
      when present (`COCO_train2014_000000503310#zhm#3 caption`: a space, not a TAB)
    coco-cn_train.txt, coco-cn_val.txt, coco-cn_test.txt   COCO-CN's split (one image name a line)
    images/<train2014|val2014>/COCO_<...>.jpg          the image files (or images/<file name>)

Files are looked for in the dataset folder and its direct subfolders. Everything joins
on the COCO image id; every caption keeps its file and its place in it as provenance
(`line`: the line of a text file, or the 1-based position of the record in a JSON file's
`annotations`, or in dataset_coco.json's `images`).

Splits (CocoOptions.split_rule): `trilingual`, as in the paper: val and test images drawn
(seeded) from the images with captions in every configured language, the rest train;
`coco-cn`: COCO-CN's official lists (images outside them train); `karpathy`: the split
of dataset_coco.json (restval is train).

Bad input as in the Multi30K reader: a file that is not JSON, or JSON without the
expected lists, is fatal (file, line and column); a bad record (not an object, no
caption, a caption that is empty, too long or holds control characters, an image id no
file describes) goes to the rejects table with its reason.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
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
    clean_caption,
    image_record,
)

SPLIT_RULES = ("trilingual", "coco-cn", "karpathy")
JAPANESE_SOURCES = ("all", "yj", "stair")
COCO_NAME = re.compile(r"^(?:COCO_(?P<folder>[a-z]+\d{4})_)?(?P<id>\d{1,12})(?:\.jpg)?$")
_SPLIT_OF_KARPATHY = {"train": "train", "restval": "train", "val": "val", "test": "test"}


class CocoError(DatasetReadError):
    pass


@dataclass(frozen=True)
class CocoOptions:
    split_rule: str = "trilingual"
    val_images: int = 1000
    test_images: int = 1000
    split_seed: int = 0
    japanese: str = "all"  # which Japanese files to read when both YJ and STAIR are there


@dataclass
class _Image:
    name: str  # COCO_train2014_000000000009: the image id in the catalog
    folder: str  # train2014 / val2014: the subfolder of the images folder, if any


@dataclass
class _Caption:
    coco_id: int
    lang: str
    text: str
    source: str
    source_file: str
    line: int
    part: str = ""  # dataset_coco.json: which of the record's sentences


@dataclass
class _State:
    root: Path
    dataset: str
    options: ReadOptions
    rejects: Rejects
    images: dict[int, _Image] = field(default_factory=dict)
    captions: list[_Caption] = field(default_factory=list)
    skipped_languages: set[str] = field(default_factory=set)

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def register(self, coco_id: int, file_name: str, default_folder: str = "") -> None:
        if coco_id in self.images:
            return
        stem = file_name.rsplit(".", 1)[0] if file_name else ""
        match = COCO_NAME.match(stem) if stem else None
        folder = (match["folder"] if match and match["folder"] else default_folder) or ""
        name = (
            stem if stem and match and match["folder"] else f"COCO_{folder}_{coco_id:012d}" if folder else str(coco_id)
        )
        self.images[coco_id] = _Image(name, folder)

    def wanted(self, lang: str, path: Path) -> bool:
        if self.options.languages is None or lang in self.options.languages:
            return True
        if lang not in self.skipped_languages:
            known = ", ".join(self.options.languages)
            self.rejects.add(self.rel(path), None, "unknown_language",
                             f"language {lang!r} is not in data.languages ({known}): file skipped", b"")  # fmt: skip
            self.skipped_languages.add(lang)
        return False

    def add_caption(self, coco_id: int, lang: str, value, source: str, path: Path, line: int, part: str = "") -> None:
        source_file = self.rel(path)
        if not isinstance(value, str):
            raw = json.dumps(value, ensure_ascii=False).encode()
            self.rejects.add(source_file, line, "bad_record", f"caption is {type(value).__name__}, not text", raw)
            return
        raw = re.sub(r"[\r\n\t]+", " ", value).encode("utf-8", "surrogatepass")  # JSON escapes lone surrogates
        text, kind, reason = clean_caption(raw, self.options.max_caption_bytes)
        if text is None:
            self.rejects.add(source_file, line, kind, reason, raw)
            return
        self.captions.append(_Caption(coco_id, lang, text, source, source_file, line, part))


CAPTION_FILES = ("captions_*.json", "dataset_coco.json", "imageid.human-written-caption.txt", "imageid.caption.txt",
                 "stair_captions_*.json", "yjcaptions*.json")  # fmt: skip


def has_coco_files(root: Path) -> bool:
    """Whether a folder holds any of the caption files this reader reads."""
    return Path(root).is_dir() and any(_find(Path(root), name) for name in CAPTION_FILES)


def _find(root: Path, name: str) -> list[Path]:
    """Files called `name` (a glob) in the dataset folder, else in its direct subfolders.
    AppleDouble files (`._name`, macOS metadata that archives made on a Mac carry beside
    every file, COCO-CN's release among them) are never data."""

    def files(pattern: str) -> list[Path]:
        return sorted(p for p in root.glob(pattern) if p.is_file() and not p.name.startswith("._"))

    return files(name) or files(f"*/{name}")


def _load_json(state: _State, path: Path, lists: tuple[str, ...]) -> dict:
    where = state.rel(path)
    try:
        data = json.loads(path.read_bytes())
    except UnicodeDecodeError as error:
        raise CocoError(f"{where}: invalid UTF-8 at byte {error.start}: not a JSON file") from None
    except json.JSONDecodeError as error:
        raise CocoError(f"{where}:{error.lineno}: not valid JSON at column {error.colno} ({error.msg})") from None
    if not isinstance(data, dict):
        raise CocoError(f"{where}: expected a JSON object with {', '.join(lists)}, got a {type(data).__name__}")
    for key in lists:
        if not isinstance(data.get(key), list):
            raise CocoError(f"{where}: no '{key}' list: not a COCO-style captions file")
    return data


def _read_coco_style(state: _State, path: Path, lang: str, source: str, folder: str) -> int:
    """COCO captions, YJ and STAIR: images[{id, file_name}], annotations[{image_id, caption}]."""
    if not state.wanted(lang, path):
        return 0
    data = _load_json(state, path, ("images", "annotations"))
    for record in data["images"]:
        if isinstance(record, dict) and isinstance(record.get("id"), int):
            state.register(record["id"], str(record.get("file_name") or ""), folder)
    before = len(state.captions)
    for number, record in enumerate(data["annotations"], start=1):
        if not isinstance(record, dict) or not isinstance(record.get("image_id"), int) or "caption" not in record:
            missing = "not an object" if not isinstance(record, dict) else "no integer image_id or no caption"
            raw = json.dumps(record, ensure_ascii=False)[:2000].encode()
            state.rejects.add(state.rel(path), number, "bad_record", f"annotations[{number - 1}]: {missing}", raw)
            continue
        if record["image_id"] not in state.images:
            reason = f"image id {record['image_id']} is not in the file's images list"
            state.rejects.add(state.rel(path), number, "no_image", reason, str(record["caption"]).encode())
            continue
        state.add_caption(record["image_id"], lang, record["caption"], source, path, number)
    return len(state.captions) - before


def _read_karpathy(state: _State, path: Path, with_captions: bool) -> dict[int, str]:
    """dataset_coco.json: images[{cocoid, filepath, filename, split, sentences[{raw}]}] -> split per image."""
    data = _load_json(state, path, ("images",))
    split: dict[int, str] = {}
    for number, record in enumerate(data["images"], start=1):
        if not isinstance(record, dict) or not isinstance(record.get("cocoid"), int):
            raw = json.dumps(record, ensure_ascii=False)[:2000].encode()
            state.rejects.add(state.rel(path), number, "bad_record", f"images[{number - 1}]: no integer cocoid", raw)
            continue
        coco_id = record["cocoid"]
        state.register(coco_id, str(record.get("filename") or ""), str(record.get("filepath") or ""))
        if record.get("split") in _SPLIT_OF_KARPATHY:
            split[coco_id] = _SPLIT_OF_KARPATHY[record["split"]]
        if with_captions and state.wanted("en", path):
            for k, sentence in enumerate(record.get("sentences") or []):
                value = sentence.get("raw") if isinstance(sentence, dict) else sentence
                state.add_caption(coco_id, "en", value, "karpathy", path, number, f".{k}")
    return split


def _coco_cn_id(name: str) -> tuple[int, str] | None:
    match = COCO_NAME.match(name.strip())
    return (int(match["id"]), match["folder"] or "") if match else None


# The release's two caption files differ: imageid.caption.txt puts a TAB after the key
# (COCO_val2014_000000573854#0), imageid.manually-translated-caption.txt one space after
# COCO_train2014_000000503310#zhm#3 (the translation of that image's COCO caption 3).
_COCO_CN_LINE = re.compile(rb"^(?P<key>[^\s#]+#[^\s]*)[\t ](?P<caption>.*)$", re.S)


def _read_coco_cn(state: _State, path: Path, source: str) -> int:
    """Lines `COCO_val2014_000000573854#0<TAB>caption` or `COCO_train2014_000000503310#zhm#3 caption`."""
    if not state.wanted("zh", path):
        return 0
    before = len(state.captions)
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        match = _COCO_CN_LINE.match(raw)
        key = match["key"] if match else b""
        parsed = _coco_cn_id(key.decode("utf-8", "replace").split("#", 1)[0]) if match else None
        if parsed is None:
            reason = ("expected 'COCO_<folder>_<id>#<n>', a TAB or a space, then the caption" if not match
                      else f"bad image name {key[:80]!r}")  # fmt: skip
            state.rejects.add(state.rel(path), number, "bad_line", reason, raw)
            continue
        caption = match["caption"]
        coco_id, folder = parsed
        state.register(coco_id, "", folder)
        text, kind, reason = clean_caption(caption, state.options.max_caption_bytes)
        if text is None:
            state.rejects.add(state.rel(path), number, kind, reason, raw)
            continue
        state.captions.append(_Caption(coco_id, "zh", text, source, state.rel(path), number))
    return len(state.captions) - before


def _read_name_list(state: _State, path: Path) -> list[int]:
    ids = []
    for number, raw in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not raw.strip():
            continue
        parsed = _coco_cn_id(raw.split("#", 1)[0])
        if parsed is None:
            state.rejects.add(state.rel(path), number, "bad_image_name", f"not a COCO image name: {raw[:80]!r}",
                              raw.encode())  # fmt: skip
            continue
        state.register(parsed[0], "", parsed[1])
        ids.append(parsed[0])
    return ids


def _japanese_files(root: Path, choice: str) -> list[tuple[Path, str]]:
    yj = [(p, "yj") for p in _find(root, "yjcaptions26k*.json")]
    stair = [(p, "stair") for p in _find(root, "stair_captions_v1.2_*.json") if "tokenized" not in p.name]
    return {"all": yj + stair, "yj": yj, "stair": stair}[choice]


def _assign_splits(state: _State, coco: CocoOptions, karpathy: dict[int, str], coco_cn: dict[str, list[int]],
                   languages: list[str]) -> dict[int, str]:  # fmt: skip
    with_caption: dict[int, set[str]] = {}
    for caption in state.captions:
        with_caption.setdefault(caption.coco_id, set()).add(caption.lang)
    split = dict.fromkeys(with_caption, "train")
    if coco.split_rule == "trilingual":
        candidates = sorted(i for i, langs in with_caption.items() if set(languages) <= langs)
        needed = coco.val_images + coco.test_images
        if len(candidates) < needed:
            raise CocoError(
                f"only {len(candidates)} images have captions in every language ({', '.join(languages)}); "
                f"the split needs {coco.val_images} val + {coco.test_images} test: lower data.val_images / "
                "data.test_images, or use data.coco_split=coco-cn"
            )
        random.Random(f"coco-split:{coco.split_seed}").shuffle(candidates)
        split.update(dict.fromkeys(candidates[: coco.test_images], "test"))
        split.update(dict.fromkeys(candidates[coco.test_images : needed], "val"))
    elif coco.split_rule == "coco-cn":
        if not coco_cn:
            raise CocoError("data.coco_split=coco-cn needs COCO-CN's coco-cn_val.txt and coco-cn_test.txt")
        for name in ("val", "test"):
            split.update({i: name for i in coco_cn.get(name, []) if i in split})
    else:
        if not karpathy:
            raise CocoError("data.coco_split=karpathy needs dataset_coco.json")
        split.update({i: s for i, s in karpathy.items() if i in split})
    return split


def read_coco(
    root: Path,
    dataset: str,
    images_dir: Path | None = None,
    hash_images: bool | Callable[[Path], str | None] = True,  # or a cached digest function
    progress: Callable[[str], None] | None = None,
    options: ReadOptions | None = None,
    coco: CocoOptions | None = None,
) -> ReadResult:
    root = Path(root)
    try:
        return _read(root, dataset, images_dir, hash_images, progress, options or ReadOptions(), coco or CocoOptions())
    except CocoError as error:
        raise CocoError(f"{error} (in {root})") from None


def _read(root: Path, dataset: str, images_dir: Path | None, hash_images: bool,
          progress: Callable[[str], None] | None, options: ReadOptions, coco: CocoOptions) -> ReadResult:  # fmt: skip
    if not root.is_dir():
        raise CocoError(f"dataset folder {root} does not exist")
    images_dir = Path(images_dir) if images_dir else root / "images"
    state = _State(root, dataset, options, Rejects(dataset, options.strict, error=CocoError))
    say = progress or (lambda _message: None)

    english = _find(root, "captions_*.json")
    for path in english:
        folder = path.stem.removeprefix("captions_")
        say(f"{state.rel(path)}: {_read_coco_style(state, path, 'en', 'coco', folder)} English captions")
    karpathy: dict[int, str] = {}
    for path in _find(root, "dataset_coco.json"):
        karpathy = _read_karpathy(state, path, with_captions=not english)
        say(f"{state.rel(path)}: Karpathy split of {len(karpathy)} images")
    for path, source in _japanese_files(root, coco.japanese):
        folder = "train2014" if source == "yj" else path.stem.rsplit("_", 1)[-1] + "2014"
        say(f"{state.rel(path)}: {_read_coco_style(state, path, 'ja', source, folder)} Japanese captions")
    human = _find(root, "imageid.human-written-caption.txt") or _find(root, "imageid.caption.txt")
    for path in human:
        say(f"{state.rel(path)}: {_read_coco_cn(state, path, 'coco-cn')} Chinese captions")
    for path in _find(root, "imageid.manually-translated-caption.txt"):
        say(f"{state.rel(path)}: {_read_coco_cn(state, path, 'coco-cn/translated')} Chinese (translated) captions")
    coco_cn = {name: [i for p in _find(root, f"coco-cn_{name}.txt") for i in _read_name_list(state, p)]
               for name in ("train", "val", "test")}  # fmt: skip
    coco_cn = {name: ids for name, ids in coco_cn.items() if ids}

    counts = Counter(c.lang for c in state.captions)
    languages = [lang for lang in options.languages or sorted({c.lang for c in state.captions})
                 if counts.get(lang) or lang not in options.optional]  # fmt: skip
    expected = {"en": "captions_train2014.json / captions_val2014.json (or dataset_coco.json)",
                "ja": "yjcaptions26k_clean.json or stair_captions_v1.2_train.json",
                "zh": "COCO-CN's imageid.human-written-caption.txt"}  # fmt: skip
    for lang in languages:
        if not counts.get(lang):
            where = expected.get(lang, f"a caption file in {lang}")
            raise CocoError(f"no usable {lang} captions: expected {where}; or leave {lang} out of data.languages")

    split = _assign_splits(state, coco, karpathy, coco_cn, languages)
    images, captions = Rows(), Rows()
    stats: dict[str, dict[str, int]] = {}
    for coco_id in sorted(split, key=lambda i: state.images[i].name):
        image = state.images[coco_id]
        file_name = f"{image.name}.jpg"
        candidates = [images_dir / image.folder / file_name] if image.folder else []
        places = [*candidates, images_dir / file_name]
        path = next((p for p in places if p.is_file()), places[0])
        exists, sha, width, height = image_record(path, hash_images)
        images.add(dataset=dataset, image_id=image.name, file_name=file_name, path=str(path), split=split[coco_id],
                   role=split[coco_id], exists=exists, sha256=sha, width=width, height=height)  # fmt: skip
        stats.setdefault(split[coco_id], {"images": 0})["images"] += 1
    for caption in sorted(state.captions, key=lambda c: (state.images[c.coco_id].name, c.lang, c.source_file, c.line)):
        name, role = state.images[caption.coco_id].name, split[caption.coco_id]
        captions.add(caption_id=f"{caption.source_file}:{caption.line}{caption.part}",
                     dataset=dataset, image_id=name, split=role, role=role, lang=caption.lang, text=caption.text,
                     source=caption.source, source_file=caption.source_file, line=caption.line,
                     origin_caption_id=None, also_in=None, source_version=None)  # fmt: skip
        per_split = stats[role]
        per_split[caption.lang] = per_split.get(caption.lang, 0) + 1
    for name in ("train", "val", "test"):
        if name in stats:
            say(f"{name}: {stats[name]}")
    return ReadResult(
        images=images.table(IMAGES),
        captions=captions.table(CAPTIONS.remove(CAPTIONS.get_field_index("tokens"))),
        rejects=state.rejects.rows.table(REJECTS),
        stats=stats,
    )
