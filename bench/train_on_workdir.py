"""Joint training on a workdir's catalog, outside Prefect and MLflow: for choosing settings.

    python bench/train_on_workdir.py --workdir W [--dataset embedded] [--set K=V ...] [--test]
    python bench/train_on_workdir.py --workdir W --export inputs.pt [--features-bits 8]
    python bench/train_on_workdir.py --inputs inputs.pt [--variants runs.json] [--lp] [--test]

Reads what the train stage reads (train and val splits with their features, the word
vectors, LP's model when pretrain.enabled), trains with the resolved config and prints
every epoch (losses, language-classifier accuracy, validation mean mR, seconds), then the
best epoch and, with --test, the test split's mean mR. Nothing is written to the workdir.

`--export` writes those inputs (and the test split) to one file that `--inputs` reads
without the catalog, DuckDB, Prefect or MLflow: to try settings on another machine (a GPU
one, which has torch but not the pipeline's other dependencies). `--features-bits 8`
stores image features as 8 bits per value (per-dimension range) to keep the file small;
such runs choose settings, the figures that count come from the real features.
`--cpu-amp` trains on the CPU with CUDA's mixed precision (float16 autocast, GradScaler),
to check `train.amp` where no GPU is.
`--variants FILE` (JSON: {"name": {"section.option": value, ...}, ...}) trains each variant
from the same inputs in one process; `--lp` runs LP first (from the word vectors) instead
of loading the workdir's LP model.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from checkout import use_checkout  # noqa: E402

use_checkout()  # run from anywhere, installed or not

from mule.config.overrides import parse_assignments  # noqa: E402
from mule.config.resolution import resolve  # noqa: E402
from mule.mule_core.devices import resolve_device  # noqa: E402
from mule.mule_core.encoding import encode_split, evaluate_split  # noqa: E402
from mule.mule_core.metrics import (  # noqa: E402
    cross_lingual_recalls,
    mean_mr,
    perfect_translation_ceiling,
    translation_pair_recalls,
)
from mule.mule_core.model import MuleModel  # noqa: E402
from mule.mule_core.split_tensors import SplitTensors  # noqa: E402
from mule.mule_core.training.joint import JointTrainer  # noqa: E402
from mule.mule_core.training.loop import Trainer  # noqa: E402
from mule.mule_core.training.lp import LPTrainer  # noqa: E402

CPU_AMP = False  # --cpu-amp


def amp_on_the_cpu(trainer: Trainer) -> Trainer:
    """With --cpu-amp, train.amp's arithmetic on the CPU (float16 autocast, a GradScaler), as
    it runs on CUDA: to check AMP where no GPU is (slower than float32 there)."""
    if CPU_AMP and trainer.device.type == "cpu":
        trainer.mixed_precision(True)
    return trainer


# -- export: the catalog's inputs to one file -------------------------------------------
def export(workdir: str, dataset: str, preset: str, overrides: dict, out: str, bits: int, text_only: bool) -> None:
    from mule.data_catalog.model_files import load_model
    from mule.data_catalog.splits import load_split, load_vocabulary
    from mule.data_catalog.tables import Catalog
    from mule.storage.workdir import Workdir

    cfg = resolve(preset, {"data.dataset": dataset, **overrides})
    wd = Workdir.at(workdir)
    catalog = Catalog(wd)
    extractor = None if text_only else catalog.require_current_extractor(dataset, cfg.features)
    vocabulary = load_vocabulary(catalog, dataset, cfg.data.languages, cfg.model)
    # The catalog keeps one current set of word vectors per dataset: the text stage's last run.
    dims = {lang: v.shape[1] for lang, v in vocabulary.vectors.items()}
    if any(d != cfg.text.word_dim for d in dims.values()):
        sys.exit(f"{workdir}: the word vectors in the catalog have dimensions {dims}, the config asks for "
                 f"text.word_dim={cfg.text.word_dim}: run `mule run text` with the same --set first")  # fmt: skip
    splits = {}
    for name, selector in (("train", "train"), ("val", "val"), ("test", cfg.eval.split)):
        split = load_split(catalog, dataset, selector, vocabulary, cfg.text.max_tokens, extractor,
                           cfg.data.captions if name == "train" else "human")  # fmt: skip
        # Compact: tokens without padding (uint16 while vocabularies fit), small integer types.
        mask = torch.arange(split.tokens.shape[1])[None, :] < split.lengths[:, None]
        wide = int(split.tokens.max()) > 65535  # ids past a vocabulary: its words outside it
        entry = {"tokens": split.tokens[mask].numpy().astype(np.int32 if wide else np.uint16),
                 "width": split.tokens.shape[1], "lengths": split.lengths.numpy().astype(np.uint8),
                 "caption_lang": split.caption_lang.astype(np.int8), "caption_image": split.caption_image.astype(np.int32),
                 "image_ids": split.image_ids, "caption_group": split.caption_group.astype(np.int32),
                 "unseen": split.unseen, "caption_ids": split.caption_ids}  # fmt: skip
        entry["features"] = None if text_only else _pack(split.features, bits)
        splits[name] = entry
    lp_file = catalog.lp_model_path(cfg)
    lp_state = load_model(lp_file)[0].state_dict() if lp_file.exists() else None
    torch.save({"languages": vocabulary.languages, "vocab_sizes": vocabulary.sizes,
                "words": vocabulary.words,
                "vectors": {k: v.half() for k, v in vocabulary.vectors.items()}, "splits": splits,
                "ngram_vectors": {k: (names, v.half()) for k, (names, v) in (vocabulary.ngram_vectors or {}).items()},
                "ngram_lengths": vocabulary.ngram_lengths,
                "lp_state": lp_state, "extractor": extractor, "dataset": dataset}, out)  # fmt: skip
    sizes = ", ".join(f"{name} {len(entry['image_ids'])} images" for name, entry in splits.items())
    print(f"wrote {out}: {Path(out).stat().st_size / 2**20:.1f} MiB ({sizes})")


def _pack(features: torch.Tensor, bits: int):
    if bits == 32:
        return features
    if bits == 16:
        return features.half()
    low, high = features.min(0).values, features.max(0).values
    scale = (high - low).clamp(min=1e-12) / 255
    return {"q": ((features - low) / scale).round().to(torch.uint8), "low": low, "scale": scale}


def _unpack(features) -> torch.Tensor | None:
    if features is None:
        return None
    if isinstance(features, dict):
        return features["q"].float() * features["scale"] + features["low"]
    return features.float()


def _int64(array):
    return None if array is None else array.astype(np.int64)


def load_inputs(path: str):
    data = torch.load(path, map_location="cpu", weights_only=False)
    splits = {}
    for name, entry in data["splits"].items():
        lengths = torch.from_numpy(entry["lengths"].astype(np.int64))
        tokens = torch.zeros(len(lengths), entry["width"], dtype=torch.long)
        tokens[torch.arange(entry["width"])[None, :] < lengths[:, None]] = torch.from_numpy(
            entry["tokens"].astype(np.int64)
        )
        splits[name] = SplitTensors(data["languages"], tokens, lengths, entry["caption_lang"].astype(np.int64),
                                    entry["caption_image"].astype(np.int64), entry["image_ids"],
                                    _unpack(entry["features"]), entry.get("caption_ids"),
                                    _int64(entry.get("caption_group")), entry.get("unseen"))  # fmt: skip
    return data, splits


def words_outside_as_unknown(splits: dict, data: dict) -> dict:
    """The splits as a model without n-grams (model.subwords=false) reads them: a word
    outside the vocabulary (an n-gram-composed id, from the vocabulary's size on) is <unk>."""
    import dataclasses

    out = {}
    for name, split in splits.items():
        tokens = split.tokens.clone()
        for index, lang in enumerate(split.languages):
            rows = torch.from_numpy(np.asarray(split.caption_lang) == index)
            part = tokens[rows]
            part[part >= data["vocab_sizes"][lang]] = 1
            tokens[rows] = part
        out[name] = dataclasses.replace(split, tokens=tokens, unseen=None)
    return out


# -- training ---------------------------------------------------------------------------
def build(cfg, data, image_dim: int | None) -> MuleModel:
    vectors = {k: v.float() for k, v in data["vectors"].items()}
    dim = next(iter(vectors.values())).shape[1]
    if cfg.model.subwords and "words" not in data:
        sys.exit("these inputs hold no vocabularies (exported before model.subwords): export them again, "
                 "or --set model.subwords=false")  # fmt: skip
    lengths = tuple(cfg.model.ngram_lengths) if cfg.model.subwords else ()
    if lengths and "ngram_lengths" in data and tuple(data["ngram_lengths"]) != lengths:
        sys.exit(f"these inputs were exported for n-grams of lengths {data.get('ngram_lengths')}, the config asks for "
                 f"{lengths}: export them again with the same --set")  # fmt: skip
    model = MuleModel(data["languages"], data["vocab_sizes"], dim, image_dim, cfg.model, data.get("words"))
    ngrams = data.get("ngram_vectors") or {}
    for lang, v in vectors.items():
        grams = (ngrams[lang][0], ngrams[lang][1].float()) if lang in ngrams else None
        model.branches[lang].init_vectors(v, grams)
    return model


def printer(tag: str, started: float):
    def on_epoch(r) -> None:
        losses = " ".join(f"{k} {v:.3f}" for k, v in r.losses.items())
        flag = f" [{r.divergence}]" if r.divergence else ""
        score = "  -  " if r.score is None else f"{r.score:5.1f}"
        print(f"{tag} epoch {r.epoch:>2}  val {score}{'*' if r.is_best else ' '}  {losses}  "
              f"{r.seconds:.0f}s ({time.perf_counter() - started:.0f}s){flag}", flush=True)  # fmt: skip

    return on_epoch


def _mule_vectors(model, split, device) -> torch.Tensor:
    encoded = encode_split(model, split, device, joint=False)
    return torch.nn.functional.normalize(encoded["caption_mule"], dim=-1)


def lp_score(model, split, device) -> tuple[float, dict]:
    """LP's validation score (the pretrain stage's): mean cross-lingual R@1 over every pair, MULE layer."""
    emb = _mule_vectors(model, split, device)
    table = cross_lingual_recalls(emb, torch.from_numpy(split.caption_image).to(device),
                                  torch.from_numpy(split.caption_lang).to(device), split.languages)  # fmt: skip
    return float(np.mean([row["r1"] for row in table.values()])), table


def run_lp(cfg, data, train, val, device, tag: str, last_weights: bool = False) -> dict:
    """LP from the word vectors; the kept weights' state. With `last_weights` (and
    pretrain.ema on), also the state that pretrain.ema=0 would have kept: the same run
    (the average never feeds back into training), the raw weights validated every epoch."""
    model = build(cfg, data, None)
    shadow = {"score": -np.inf, "state": None, "epoch": 0}
    trainer = None

    def validate(m):
        if last_weights and trainer is not None and trainer.ema is not None:
            score, _ = lp_score(trainer.model, val, device)
            if score > shadow["score"]:
                shadow.update(score=score, state={k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()},
                              epoch=trainer.epoch + 1)  # fmt: skip
        return lp_score(m, val, device)

    trainer = amp_on_the_cpu(LPTrainer(model, train, cfg.loss, cfg.train, device, validate=validate,
                                     pretrain=cfg.pretrain))  # fmt: skip
    trainer.fit(printer(f"{tag} lp", time.perf_counter()))
    print(f"{tag} LP best epoch {trainer.best_epoch}: val cross-lingual R@1 {trainer.best_score:.2f}", flush=True)
    state = model.cpu().state_dict()
    if last_weights and shadow["state"] is not None:
        print(f"{tag} LP last weights: best epoch {shadow['epoch']}, val R@1 {shadow['score']:.2f}", flush=True)
        state["_last_weights"] = shadow["state"]
    return state


def train_variant(tag: str, cfg, data, splits, device, run_lp_first: bool, test: bool) -> dict:
    train, val = splits["train"], splits["val"]
    torch.manual_seed(cfg.train.seed)
    lp_state = data.get("lp_state")
    if cfg.pretrain.enabled and run_lp_first:
        torch.manual_seed(cfg.train.seed)
        lp_state = run_lp(cfg, data, train, val, device, tag)
        torch.manual_seed(cfg.train.seed)
    model = build(cfg, data, train.features.shape[1])
    model.set_image_normalization(train.features)
    if cfg.pretrain.enabled:
        if lp_state is None:
            sys.exit("pretrain.enabled but the inputs hold no LP model: --lp, or --set pretrain.enabled=false")
        own = {k: v for k, v in lp_state.items() if k.startswith("branches.") or k.startswith("classifier.")}
        model.load_state_dict(own, strict=False)

    def validate(m):
        table = evaluate_split(m, val, device, cfg.eval.ks)
        return mean_mr(table), table

    started = time.perf_counter()
    trainer = amp_on_the_cpu(JointTrainer(model, train, cfg.loss, cfg.train, device, validate=validate))
    trainer.fit(printer(tag, started))
    result = {"variant": tag, "best_epoch": trainer.best_epoch, "val": round(trainer.best_score, 2),
              "seconds": round(time.perf_counter() - started, 1), "stopped": trainer.stopped}  # fmt: skip
    if test:
        table = evaluate_split(model, splits["test"], device, cfg.eval.ks)
        result["test"] = round(mean_mr(table), 2)
        result["test_per_language"] = {k: round(v["mR"], 1) for k, v in table.items()}
    print("RESULT " + json.dumps(result), flush=True)
    return result


def lp_recalls(model, split, device, name: str) -> dict:
    """Cross-lingual R@1 per pair at the MULE layer on a split: image protocol, translation
    protocol (where the split has parallel lines) and the perfect-translation ceiling."""
    emb = _mule_vectors(model, split, device)
    table = cross_lingual_recalls(emb, torch.from_numpy(split.caption_image).to(device),
                                  torch.from_numpy(split.caption_lang).to(device), split.languages)  # fmt: skip
    out = {f"{name}_r1": {pair: round(row["r1"], 1) for pair, row in table.items()}}
    if split.caption_group is not None and (split.caption_group >= 0).any():
        pairs = translation_pair_recalls(emb, torch.from_numpy(split.caption_group).to(device),
                                         torch.from_numpy(split.caption_lang).to(device), split.languages)  # fmt: skip
        out[f"{name}_translation_r1"] = {pair: round(row["r1"], 1) for pair, row in pairs.items()}
        if "en" in split.languages:  # en->x can rise only as far as en->en with perfect translations
            ceiling = perfect_translation_ceiling(emb, torch.from_numpy(split.caption_image).to(device),
                                                  torch.from_numpy(split.caption_group).to(device),
                                                  torch.from_numpy(split.caption_lang).to(device),
                                                  list(split.languages).index("en"))  # fmt: skip
            out[f"{name}_ceiling_r1"] = round(ceiling["r1"], 1)
    return out


def lp_variant(tag: str, cfg, data, splits, device, last_weights: bool = False) -> list[dict]:
    """LP alone (text-only data), then cross-lingual R@1 at the MULE layer on the validation
    split (what settings are chosen on) and the test split. With `last_weights`, a second
    result: the same run's raw weights (what pretrain.ema=0 keeps)."""
    torch.manual_seed(cfg.train.seed)
    started = time.perf_counter()
    state = run_lp(cfg, data, splits["train"], splits["val"], device, tag, last_weights)
    seconds = round(time.perf_counter() - started, 1)
    results = []
    for name, weights in (("", state), (" (last weights)", state.pop("_last_weights", None))):
        if weights is None:
            continue
        model = build(cfg, data, None)
        model.load_state_dict(weights, strict=False)
        result = {"variant": tag + name, **lp_recalls(model, splits["val"], device, "val"),
                  **lp_recalls(model, splits["test"], device, "test"), "seconds": seconds}  # fmt: skip
        print("RESULT " + json.dumps(result), flush=True)
        results.append(result)
    return results


def from_workdir(workdir: str, cfg):
    import functools

    from mule.data_catalog.model_files import load_model
    from mule.data_catalog.splits import load_split, load_vocabulary
    from mule.data_catalog.tables import Catalog
    from mule.storage.workdir import Workdir

    wd = Workdir.at(workdir)
    catalog = Catalog(wd)
    extractor = catalog.require_current_extractor(cfg.data.dataset, cfg.features)
    vocabulary = load_vocabulary(catalog, cfg.data.dataset, cfg.data.languages, cfg.model)
    load = functools.partial(load_split, catalog, cfg.data.dataset, vocabulary=vocabulary,
                             max_tokens=cfg.text.max_tokens, extractor=extractor)  # fmt: skip
    splits = {"train": load("train", captions=cfg.data.captions), "val": load("val"), "test": load(cfg.eval.split)}
    lp_file = catalog.lp_model_path(cfg)
    data = {"languages": vocabulary.languages, "vocab_sizes": vocabulary.sizes, "vectors": vocabulary.vectors,
            "words": vocabulary.words, "ngram_vectors": vocabulary.ngram_vectors or {},
            "ngram_lengths": vocabulary.ngram_lengths,
            "lp_state": load_model(lp_file)[0].state_dict() if lp_file.exists() else None}  # fmt: skip
    return data, splits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir")
    parser.add_argument("--inputs", help="a file written by --export, instead of --workdir")
    parser.add_argument("--dataset", default="embedded")
    parser.add_argument("--preset", help="default: the dataset's (config.resolution.default_preset)")
    parser.add_argument("--set", dest="assignments", action="append", default=[])
    parser.add_argument("--variants", help="JSON file: {name: {option: value}}, each trained in turn")
    parser.add_argument("--only", action="append", help="train only this variant of --variants (repeatable)")
    parser.add_argument("--lp", action="store_true", help="run LP on the inputs first instead of loading LP's model")
    parser.add_argument("--test", action="store_true", help="also evaluate the kept model on the test split")
    parser.add_argument("--export", help="write the inputs to this file and stop")
    parser.add_argument("--features-bits", type=int, default=32, choices=(8, 16, 32))
    parser.add_argument("--text-only", action="store_true", help="LP alone (no image features): export or train")
    parser.add_argument("--cpu-amp", action="store_true",
                        help="on the CPU, train with train.amp's float16 autocast and GradScaler, as on CUDA")
    args = parser.parse_args()
    global CPU_AMP
    CPU_AMP = args.cpu_amp
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("mule.training").setLevel(logging.WARNING)  # per-epoch lines are printed below
    logging.getLogger("mule.progress").setLevel(logging.WARNING)

    base = {"data.dataset": args.dataset, **parse_assignments(args.assignments)}
    if args.export:
        export(args.workdir, args.dataset, args.preset, base, args.export, args.features_bits, args.text_only)
        return
    variants = json.loads(Path(args.variants).read_text()) if args.variants else {"run": {}}
    variants = {k: v for k, v in variants.items() if not args.only or k in args.only}
    if args.inputs:
        data, splits = load_inputs(args.inputs)
    else:
        data, splits = from_workdir(args.workdir, resolve(args.preset, base))
    device = resolve_device(resolve(args.preset, base).train.device)
    train = splits["train"]
    print(f"machine: {platform.node()}, {device}, {torch.cuda.get_device_name() if device.type == 'cuda' else ''} "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}; {train.n_images} train images, "
          f"{len(train.caption_image)} captions", flush=True)  # fmt: skip
    results = []
    for name, overrides in variants.items():
        cfg = resolve(args.preset, {**base, **overrides})
        print(f"== {name}: {overrides}", flush=True)
        if args.text_only:
            results += lp_variant(name, cfg, data, splits, device)
        else:
            results.append(train_variant(name, cfg, data, splits, device, args.lp, args.test))
    if len(results) > 1 and not args.text_only:
        print("\n| variant | val mR | best epoch | test mR | seconds |\n|---|---|---|---|---|")
        for r in results:
            print(f"| {r['variant']} | {r['val']} | {r['best_epoch']} | {r.get('test', '')} | {r['seconds']} |")


if __name__ == "__main__":
    main()
