"""The ONNX towers beside the PyTorch model: recall (float32 and int8 against PyTorch),
file sizes, CPU latency per sentence and per image.

    python bench/onnx_towers.py --workdir DIR [--dataset embedded] [--models model seed1 seed2]
                                [--split test] [--text-splits val,test_2016] [--out figures.json]

Each model (models/<dataset>/<name>.pt) is exported as `mule export --model-file` does, then
opened three ways: PyTorch (mule.api.load), its ONNX towers (engine="onnxruntime") and their
8-bit variants (int8=True). On `--split` (image-sentence, images from their files through
each engine's own image path): R@1/5/10 both ways per language, mR, as the evaluate stage
reports them. On each of `--text-splits` (text only: real Multi30K text has no photos for
most images): sentence -> sentence retrieval across languages in the joint space (each
caption a query, the other language's captions the candidates, a hit when a caption of the
same image is in the top K), the mean of R@1/5/10 over every ordered pair.

Captions go in as the evaluate stage encodes them (the catalog's tokens, Vocabulary.encode),
so a caption with no known word gets <unk> here as it does there. Latency: one sentence or
one image per call, the median of `--calls` calls, after a warm-up; torch on its default
threads, ONNX Runtime on its own. Run alone: another CPU-heavy process beside it skews both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mule import api
from mule.data_catalog import queries
from mule.data_catalog.tables import Catalog
from mule.mule_core.metrics import cross_lingual_recalls, per_language_recalls
from mule.storage.workdir import Workdir

ENGINES = {"torch": {}, "onnx-fp32": {"engine": "onnxruntime"}, "onnx-int8": {"engine": "onnxruntime", "int8": True}}


def export(model_file: Path, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "mule.commands.main", "export", "--model-file", str(model_file),
                    "--out", str(out)], check=True, capture_output=True)  # fmt: skip
    return out


def split_rows(catalog: Catalog, dataset: str, split: str, languages: list[str], with_files: bool) -> dict:
    rows = queries.caption_selection(catalog, dataset, split, languages, "human", with_files=with_files).to_pylist()
    if with_files:
        rows = [r for r in rows if r["has_file"]]
    images = list(dict.fromkeys(r["image_id"] for r in rows))
    at = {image: i for i, image in enumerate(images)}
    return {"rows": rows, "images": images, "sentence_image": torch.tensor([at[r["image_id"]] for r in rows]),
            "sentence_lang": torch.tensor([languages.index(r["lang"]) for r in rows])}  # fmt: skip


def sentence_vectors(embedder, rows: list[dict]) -> np.ndarray:
    """Each caption's vector from its stored tokens, as the evaluate stage encodes it."""
    vocabulary, max_tokens = embedder.meta["vocabulary"], embedder.meta["cfg"].text.max_tokens
    out = np.zeros((len(rows), embedder.meta["cfg"].model.joint_dim), np.float32)
    for lang in dict.fromkeys(r["lang"] for r in rows):
        at = [i for i, r in enumerate(rows) if r["lang"] == lang]
        for start in range(0, len(at), 256):
            chunk = at[start : start + 256]
            encoded = vocabulary.encode(lang, [list(rows[i]["tokens"]) for i in chunk])
            out[chunk] = embedder._vectors_of_ids(lang, encoded, max_tokens)
    return out


def image_recalls(embedders: dict, data: dict, paths: dict[str, str], languages: list[str]) -> dict:
    """mR per language and their mean, per engine, and for the int8 text tower beside the
    float32 image tower ("onnx-int8-text"): which tower's 8 bits cost what."""
    files = [Path(paths[i]) for i in data["images"]]
    images = {e: torch.from_numpy(m.encode_image(files)) for e, m in embedders.items()}
    sentences = {e: torch.from_numpy(sentence_vectors(m, data["rows"])) for e, m in embedders.items()}
    pairs = {e: (images[e], sentences[e]) for e in embedders} | {"onnx-int8-text": (images["onnx-fp32"], sentences["onnx-int8"])}
    out = {}
    for engine, (image_vectors, sentence_vectors_) in pairs.items():
        table = per_language_recalls(image_vectors, sentence_vectors_, data["sentence_image"], data["sentence_lang"], languages)
        out[engine] = {lang: round(row["mR"], 2) for lang, row in table.items()} | {
            "mean": round(statistics.mean(row["mR"] for row in table.values()), 2)}  # fmt: skip
    return out


def text_recalls(embedder, data: dict, languages: list[str]) -> float:
    sentences = torch.from_numpy(sentence_vectors(embedder, data["rows"]))
    pairs = cross_lingual_recalls(sentences, data["sentence_image"], data["sentence_lang"], languages)
    return round(statistics.mean(statistics.mean(v for k, v in p.items() if k.startswith("r")) for p in pairs.values()), 2)


def latency_ms(call, items: list, calls: int) -> float:
    call(items[0])
    times = []
    for item in (items * (calls // max(len(items), 1) + 1))[:calls]:
        start = time.perf_counter()
        call(item)
        times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times), 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--dataset", default="embedded")
    parser.add_argument("--models", nargs="+", default=["model"], help="model names in models/<dataset>/ (seeds)")
    parser.add_argument("--split", default="test", help="image-sentence split ('' for none)")
    parser.add_argument("--text-splits", default="", help="comma-separated splits for sentence->sentence recall")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    workdir = Workdir.at(Path(args.workdir), create=False)
    catalog, figures = Catalog(workdir), {"models": {}}
    paths = queries.image_paths(catalog, args.dataset)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            folder = export(workdir.model_path(args.dataset, name), Path(tmp) / name)
            sizes = {str(p.relative_to(folder)): round(p.stat().st_size / 2**20, 2)
                     for p in sorted(folder.rglob("*.onnx")) if p.is_file()}  # fmt: skip
            sizes["model.safetensors"] = round((folder / "model.safetensors").stat().st_size / 2**20, 2)
            row = figures["models"][name] = {"sizes_mib": sizes}
            embedders = {engine: api.load(folder, **kw) for engine, kw in ENGINES.items()}
            languages = embedders["torch"].languages
            if args.split and embedders["torch"].has_images:
                data = split_rows(catalog, args.dataset, args.split, languages, True)
                row[f"{args.split} image-sentence mR"] = image_recalls(embedders, data, paths, languages)
                row["images"], row["sentences"] = len(data["images"]), len(data["rows"])
            for split in filter(None, args.text_splits.split(",")):
                data = split_rows(catalog, args.dataset, split, languages, False)
                row[f"{split} sentence->sentence mR"] = {e: text_recalls(m, data, languages) for e, m in embedders.items()}
            if name == args.models[0]:
                data = split_rows(catalog, args.dataset, args.split or "val", languages, embedders["torch"].has_images)
                texts = [(" ".join(r["tokens"]), r["lang"]) for r in data["rows"][:50]]
                row["ms per sentence"] = {e: latency_ms(lambda t, m=m: m.encode_text(t[0], t[1]), texts, args.calls)
                                          for e, m in embedders.items()}  # fmt: skip
                if embedders["torch"].has_images:
                    files = [Path(paths[i]) for i in data["images"][:20]]
                    row["ms per image"] = {e: latency_ms(m.encode_image, files, max(20, args.calls // 4))
                                           for e, m in embedders.items()}  # fmt: skip
            print(json.dumps({name: row}, indent=1), flush=True)
    if len(args.models) > 1:
        figures["over seeds"] = _over_seeds(figures["models"])
        print(json.dumps(figures["over seeds"], indent=1))
    figures["machine"] = _machine()
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 0


def _over_seeds(models: dict) -> dict:
    """Per measure and engine: the mean and standard deviation over the models, and of the
    paired difference from torch's (the same model, another engine)."""
    out = {}
    first = next(iter(models.values()))
    for measure in [k for k in first if "mR" in k]:
        def value(row, engine, measure=measure):
            v = row[measure][engine]
            return v["mean"] if isinstance(v, dict) else v

        for engine in first[measure]:
            values = [value(row, engine) for row in models.values()]
            diffs = [value(row, engine) - value(row, "torch") for row in models.values()]
            out[f"{measure} {engine}"] = {"mean": round(statistics.mean(values), 2), "std": round(statistics.stdev(values), 2),
                                          "minus torch": round(statistics.mean(diffs), 2),
                                          "minus torch std": round(statistics.stdev(diffs), 2)}  # fmt: skip
    return out


def _machine() -> dict:
    import os
    import platform

    import onnxruntime

    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__, "torch threads": torch.get_num_threads()}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
