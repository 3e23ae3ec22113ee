"""Exported model folders: a trained model as plain files that load with no workdir, no
MLflow and no network (`mule export` writes them; `mule.api.load(folder)` reads them).

    <folder>/
      mule_model.json        the format, the languages, the dimensions, the settings it was
                             trained under, the tokenisers' identities, the image extractor's name
      model.safetensors      the weights (safetensors: no pickle; an int8 table T beside
                             T_scale, a float32 per row: T = T.float() * T_scale[:, None])
      vocab/<lang>.txt       each language's words in embedding-row order, one per line
      README.md              the model card
      extractor-weights.*    the image extractor's ImageNet weights, when they could be found
      config.json            what an app needs first: the embedding's dimension, the languages, the towers
      textual/model.onnx     the text tower (mule_core/onnx_towers.py), and model.int8.onnx
      textual/tower.json     its inputs: the stacked tables' offsets per language, words per sentence,
                             the n-gram lengths and the tokenisers
      textual/ngrams/<lang>.txt  each language's n-grams in id order (with model.subwords)
      visual/model.onnx      the image tower, and model.int8.onnx (none without images or the extractor's weights)
      visual/preprocess_cfg.json  what an image goes through before the network (size, resize, crops, pooling)

The layout follows immich's (textual/, visual/, preprocess_cfg.json, config.json), so an
app that loads CLIP-like models from folders finds its way; tokenising stays in Python.

The folder is what a user could push to the Hugging Face Hub as it is; loading never
needs the Hub. It is written beside its final name (`.NAME.exporting`) and swapped in: an
earlier export is renamed aside (`.NAME.replaced`), the new one renamed in, then the old
one deleted, so a stop leaves the old folder or the new one (an export stopped between
the two renames is put back by the next). Export writes only into a folder that is absent,
empty, or an earlier export holding nothing but the files mule wrote there (their list is
in mule_model.json); never the workdir or a folder inside it, never `.` or a file
(check_export_target), and it deletes nothing else.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from mule.data_catalog.model_files import word_widths
from mule.mule_core.errors import InputError, MissingInputError, UserError
from mule.mule_core.extractor_names import resize_for
from mule.mule_core.model import MuleModel
from mule.mule_core.progress import SHOWN
from mule.mule_core.settings import settings_from_dict
from mule.mule_core.table_precision import loaded_tables
from mule.mule_core.vocabulary import Vocab, Vocabulary
from mule.storage.locks import folder_lock

FOLDER_FORMAT = "mule-folder-1"
MARKER = "mule_model.json"
PREPROCESS = "visual/preprocess_cfg.json"
TOWERS = {("text", False): "textual/model.onnx", ("text", True): "textual/model.int8.onnx",
          ("image", False): "visual/model.onnx", ("image", True): "visual/model.int8.onnx"}  # fmt: skip
# What an export holds (an export made before mule_model.json listed its files is known by these)
LAYOUT = ("mule_model.json", "model.safetensors", "README.md", "config.json", "vocab/*.txt", "extractor-weights*",
          "textual/model.onnx", "textual/model.int8.onnx", "textual/tower.json", "textual/ngrams/*.txt",
          "visual/model.onnx", "visual/model.int8.onnx", "visual/preprocess_cfg.json")  # fmt: skip


log = logging.getLogger("mule.export")
LAYOUT_FOLDERS = {"vocab", "textual", "textual/ngrams", "visual"}


class ExportTargetError(UserError, ValueError):
    """`mule export --out` names a folder it must not write: the message says why and what to do."""


def is_model_folder(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / MARKER).is_file()


def write_model_folder(folder: Path, model_file: Path, card: str, weights_file: Path | None = None,
                       towers: dict[str, bytes] | None = None, tower_info: dict | None = None,
                       workdir: Path | None = None, wait: bool = True) -> Path:  # fmt: skip
    """`model_file` (data_catalog.model_files' format) as a folder at `folder`; `towers`:
    the ONNX files by their names in it (mule_core.onnx_towers.export_towers), `tower_info`
    what textual/tower.json says of the text tower's inputs; `workdir`: the workdir the
    folder must not be (or be inside). Where `folder` may not be written: ExportTargetError.
    Another writer next to it: waited for, saying who, or without `wait` refused naming it."""
    folder = check_export_target(folder, workdir)
    folder.parent.mkdir(parents=True, exist_ok=True)
    # one export at a time next to the folder: they share its staging and aside names
    with folder_lock(folder.parent, lambda who: log.warning("%s is being written by %s: waiting for it to finish "
                                                            "(Ctrl-C stops waiting)", folder.parent, who, extra=SHOWN),
                     wait=wait):  # fmt: skip
        folder = check_export_target(folder, workdir)  # again: the export waited for may have changed it
        _put_back(folder)
        data = torch.load(Path(model_file), map_location="cpu", weights_only=True)
        staging = _beside(folder, "exporting")
        _clear_leftover(staging)
        try:
            _write_staging(staging, data, model_file, card, weights_file, towers, tower_info)
            _swap_in(staging, folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # only ever mule's: made above
            raise
    return folder


def _write_staging(staging: Path, data: dict, model_file: Path, card: str, weights_file: Path | None,
                   towers: dict[str, bytes] | None, tower_info: dict | None) -> None:  # fmt: skip
    from safetensors.torch import save_file

    (staging / "vocab").mkdir(parents=True)
    # safetensors refuses tensors that share memory: every one gets its own copy
    save_file({k: v.detach().contiguous().clone() for k, v in data["state_dict"].items()},
              str(staging / "model.safetensors"), metadata={"format": FOLDER_FORMAT})  # fmt: skip
    (staging / "model.safetensors").chmod(0o644)  # readable as the other files are (it writes 0600)
    for lang, tokens in data["vocab"].items():
        if any("\n" in t or "\r" in t for t in tokens):
            raise InputError(f"{model_file}: a {lang} word holds a line break: it cannot be written one per line")
        (staging / "vocab" / f"{lang}.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    described = {k: v for k, v in data.items() if k not in ("state_dict", "vocab")}
    described["format"] = FOLDER_FORMAT
    features = data["config"].get("features", {})
    preprocess = {k: features.get(k) for k in ("arch", "weights", "input_size", "resize", "crops", "pool")}
    # what an app without mule does to an image (mule_core.backbones.CropTransform): the
    # shorter side resized (bilinear), then the centre crop (1), the corners and centre (5),
    # and those of the mirrored image (10); uint8 RGB, (crops, 3, size, size): the tower normalises
    preprocess |= {"shorter_side": resize_for(features.get("input_size", 224), features.get("resize", 0)),
                   "pixels": "uint8 RGB, (n, crops, 3, input_size, input_size); the image tower normalises"}  # fmt: skip
    if weights_file is not None and Path(weights_file).is_file():
        name = "extractor-weights" + "".join(Path(weights_file).suffixes[-1:])
        shutil.copyfile(weights_file, staging / name)
        preprocess["weights_file"] = name
    (staging / "visual").mkdir()
    _write_json(staging / PREPROCESS, preprocess)
    (staging / "README.md").write_text(card, encoding="utf-8")
    for name, data_bytes in (towers or {}).items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(data_bytes)
    if tower_info:
        info = dict(tower_info)
        ngrams = info.pop("ngrams", {})
        _write_json(staging / "textual" / "tower.json", info)
        for lang, grams in ngrams.items():
            (staging / "textual" / "ngrams").mkdir(parents=True, exist_ok=True)
            (staging / "textual" / "ngrams" / f"{lang}.txt").write_text("\n".join(grams) + "\n", encoding="utf-8")
    _write_json(staging / "config.json", {
        "model_type": "mule", "embed_dim": data["config"]["model"]["joint_dim"], "languages": data["languages"],
        "textual": {name: name in (towers or {}) for name in ("textual/model.onnx", "textual/model.int8.onnx")},
        "visual": {name: name in (towers or {}) for name in ("visual/model.onnx", "visual/model.int8.onnx")},
        "preprocess": PREPROCESS, "weights": "model.safetensors", "mule_format": FOLDER_FORMAT})  # fmt: skip
    # last: the marker lists every file the export holds (what a later export may replace)
    described["files"] = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file()) + [MARKER]
    (staging / MARKER).write_text(json.dumps(described, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def check_export_target(folder: Path, workdir: Path | None = None) -> Path:
    """The folder an export may be written to, as an absolute path: absent, empty, or an
    earlier export holding only the files mule wrote; ExportTargetError (one line: why, and
    what to do) for `.`, a file, a link, the workdir or a folder inside it, or a folder
    holding anything else. Nothing is read but names."""
    given = Path(folder).expanduser()
    target = Path(os.path.abspath(given))
    if str(folder).strip() in ("", ".") or target == Path.cwd() or target in Path.cwd().parents:
        raise ExportTargetError(f"--out {folder} is the folder you are in (or one above it): name a folder for the "
                                "export, e.g. --out my-model")  # fmt: skip
    if target.is_symlink():
        raise ExportTargetError(f"{target} is a symbolic link: name the folder itself (mule export replaces what is "
                                "at --out, and would replace the link)")  # fmt: skip
    if workdir is not None:
        root = Path(workdir).resolve()
        real = target.resolve()
        if real == root or root in real.parents:
            raise ExportTargetError(f"{target} is {'the workdir' if real == root else 'inside the workdir ' + str(root)}: "
                                    "an export goes to a folder of its own, outside it")  # fmt: skip
    if target.exists() and not target.is_dir():
        raise ExportTargetError(f"{target} is a file, not a folder: name a folder for the export (absent, empty, or "
                                "an earlier export)")  # fmt: skip
    foreign = not_written_by_mule(target) if target.is_dir() else []
    if foreign:
        kind = "an earlier export with files mule did not write" if (target / MARKER).is_file() else "not a mule export"
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ExportTargetError(f"{target} is {kind} ({shown}): mule export writes only into an absent or empty "
                                "folder, or replaces an earlier export; name another folder, or move those files")  # fmt: skip
    return target


def not_written_by_mule(folder: Path) -> list[str]:
    """What a folder holds that no export of mule wrote (relative paths, folders with a "/"):
    empty for an empty folder or an export as mule left it. The export's own list of files
    says, or for an export made before it kept one (and a staging folder), the layout."""
    files = _listed_files(folder)
    known = set(files or [])
    folders = {parent.as_posix() for f in known for parent in Path(f).parents} if files is not None else LAYOUT_FOLDERS
    found = []
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_dir() and not path.is_symlink():
            if name not in folders:
                found.append(name + "/")
        elif not (name in known if files is not None else any(fnmatch.fnmatch(name, p) for p in LAYOUT)):
            found.append(name)
    return found


def _listed_files(folder: Path) -> list[str] | None:
    """The files an export lists in its marker; None where it lists none (no marker, or older)."""
    try:
        listed = json.loads((folder / MARKER).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return [str(f) for f in listed] if isinstance(listed, list) else None


def _beside(folder: Path, what: str) -> Path:
    return folder.with_name(f".{folder.name}.{what}")


def _clear_leftover(path: Path) -> None:
    """A staging folder a stopped export left: removed when it holds only export files,
    else refused (something of the user's has that name)."""
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir() or not_written_by_mule(path):
        raise ExportTargetError(f"{path} is in the way of the export and is not one mule left: move it")
    shutil.rmtree(path)


def _swap_in(staging: Path, folder: Path) -> None:
    """The new export at `folder`; an earlier one renamed aside first and deleted once the
    new one is in place, so a stop leaves one of them at the name (or, between the two
    renames, the old one aside, which the next export puts back before it starts)."""
    aside = _beside(folder, "replaced")
    if folder.exists():
        _clear_leftover(aside)
        folder.rename(aside)
    try:
        staging.rename(folder)
    except BaseException:
        if aside.exists() and not folder.exists():
            aside.rename(folder)
        raise
    if aside.exists():
        shutil.rmtree(aside)


def _put_back(folder: Path) -> None:
    """An earlier export an export stopped between its two renames left aside: at its name again."""
    aside = _beside(folder, "replaced")
    if aside.is_dir() and not aside.is_symlink() and not folder.exists() and not not_written_by_mule(aside):
        aside.rename(folder)


def read_model_folder(folder: Path) -> tuple[MuleModel, dict[str, Any]]:
    """(model, meta) as data_catalog.model_files.load_model returns them."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not is_model_folder(folder):
        raise MissingInputError(f"{folder} is not an exported mule model (no {MARKER}): `mule export` writes one")
    data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    if data.get("format") != FOLDER_FORMAT:
        raise InputError(f"{folder / MARKER}: format {data.get('format')!r}, expected {FOLDER_FORMAT}")
    vocab = {}
    for lang in data["languages"]:
        path = folder / "vocab" / f"{lang}.txt"
        if not path.is_file():
            raise MissingInputError(f"{path}: missing ({lang} is one of the model's languages)")
        vocab[lang] = Vocab(path.read_text(encoding="utf-8").splitlines())
    cfg = settings_from_dict(data["config"])
    lengths = tuple(cfg.model.ngram_lengths) if cfg.model.subwords else ()
    vocabulary = Vocabulary(list(data["languages"]), vocab, ngram_lengths=lengths)
    model = MuleModel(data["languages"], vocabulary.sizes, word_widths(data), data["image_dim"], cfg.model,
                      vocabulary.words)  # fmt: skip
    model.load_state_dict(loaded_tables(load_file(str(folder / "model.safetensors"))))
    preprocess = json.loads((folder / PREPROCESS).read_text(encoding="utf-8"))
    if preprocess.get("weights_file"):
        data["extractor_weights_file"] = str(folder / preprocess["weights_file"])
    data["vocabulary"], data["cfg"] = vocabulary, cfg
    return model.eval(), data


def tower_file(folder: Path, tower: str, int8: bool) -> Path | None:
    """The ONNX file of a tower ("text" or "image") in an exported folder, or None where it has none."""
    path = Path(folder) / TOWERS[(tower, int8)]
    return path if path.is_file() else None


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
