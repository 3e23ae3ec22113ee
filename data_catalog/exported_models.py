"""Exported model folders: a trained model as plain files that load with no workdir, no
MLflow and no network (`mule export` writes them; `mule.api.load(folder)` reads them).

    <folder>/
      mule_model.json        the format, the languages, the dimensions, the settings it was
                             trained under, the tokenisers' identities, the image extractor's name
      model.safetensors      the weights (safetensors: no pickle)
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
needs the Hub. It is written beside its final name and renamed into place, so a stopped
export leaves the old folder or the new one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from mule.mule_core.errors import InputError, MissingInputError
from mule.mule_core.extractor_names import resize_for
from mule.mule_core.model import MuleModel
from mule.mule_core.settings import settings_from_dict
from mule.mule_core.vocabulary import Vocab, Vocabulary

FOLDER_FORMAT = "mule-folder-1"
MARKER = "mule_model.json"
PREPROCESS = "visual/preprocess_cfg.json"
TOWERS = {("text", False): "textual/model.onnx", ("text", True): "textual/model.int8.onnx",
          ("image", False): "visual/model.onnx", ("image", True): "visual/model.int8.onnx"}  # fmt: skip


def is_model_folder(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / MARKER).is_file()


def write_model_folder(folder: Path, model_file: Path, card: str, weights_file: Path | None = None,
                       towers: dict[str, bytes] | None = None, tower_info: dict | None = None) -> Path:  # fmt: skip
    """`model_file` (data_catalog.model_files' format) as a folder at `folder`; `towers`:
    the ONNX files by their names in it (mule_core.onnx_towers.export_towers), `tower_info`
    what textual/tower.json says of the text tower's inputs."""
    from safetensors.torch import save_file

    data = torch.load(Path(model_file), map_location="cpu", weights_only=True)
    folder = Path(folder)
    staging = folder.with_name(f".{folder.name}.exporting")
    shutil.rmtree(staging, ignore_errors=True)
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
    (staging / MARKER).write_text(json.dumps(described, indent=2, sort_keys=True) + "\n", encoding="utf-8")
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
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)
    return folder


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
    model = MuleModel(data["languages"], vocabulary.sizes, data["word_dim"], data["image_dim"], cfg.model,
                      vocabulary.words)  # fmt: skip
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
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
