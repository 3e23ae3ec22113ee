"""Seconds the retrieval metrics take at an evaluation's sizes, this checkout's
`mule_core/metrics.py` against another commit's, on the same embeddings, with the
tables compared (they must be equal).

    python bench/metrics_time.py [--baseline COMMIT] [--repeats 5] [--images 1000] [--sentences en=5000,de=6000,fr=1000,cs=1000]

The default sizes are the demo's test split (and Multi30K's test_2016: 1,000 images,
five English and five German captions each, one French and one Czech). Embeddings are
random unit vectors (512-d, the MULE layer's size): the metrics' time does not depend on
their values. Timed, alternating between the two modules, the median of --repeats:
per-language recalls (image -> sentence and sentence -> image: what validation and the
evaluate stage compute) and cross-lingual sentence retrieval over every ordered pair of
languages (LP's validation score; evaluate computes it at two layers).
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from checkout import use_checkout  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

use_checkout()

from mule.mule_core import metrics as this_metrics  # noqa: E402


def module_at(commit: str):
    """mule_core/metrics.py as it was at `commit`. It imports torch and, from 33cba7e on,
    mule_core/grouping.py: that one comes from this checkout (the same function since)."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:mule_core/metrics.py"],
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp(prefix="mule-metrics-")) / "metrics_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("metrics_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inputs(images: int, sentences: dict[str, int], dim: int = 512, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    image_emb = torch.nn.functional.normalize(torch.randn(images, dim, generator=generator), dim=-1)
    sentence_image, sentence_lang = [], []
    for index, count in enumerate(sentences.values()):
        per_image = max(1, count // images)
        sentence_image.append(torch.arange(count) // per_image % images)
        sentence_lang.append(torch.full((count,), index))
    sentence_image, sentence_lang = torch.cat(sentence_image), torch.cat(sentence_lang)
    sentence_emb = torch.nn.functional.normalize(torch.randn(len(sentence_image), dim, generator=generator), dim=-1)
    return image_emb, sentence_emb, sentence_image, sentence_lang, list(sentences)


def timed(calls: list, repeats: int) -> list[tuple[float, object]]:
    """Each call's median seconds and its last result, the calls taking turns."""
    seconds: list[list[float]] = [[] for _ in calls]
    results: list[object] = [None] * len(calls)
    for _ in range(repeats):
        for index, call in enumerate(calls):
            start = time.perf_counter()
            results[index] = call()
            seconds[index].append(time.perf_counter() - start)
    return [(statistics.median(s), r) for s, r in zip(seconds, results)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="a commit whose mule_core/metrics.py to time beside this checkout's")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--sentences", default="en=5000,de=6000,fr=1000,cs=1000")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sentences = {k: int(v) for k, v in (item.split("=") for item in args.sentences.split(","))}
    image_emb, sentence_emb, sentence_image, sentence_lang, languages = inputs(args.images, sentences)
    modules = {"this checkout": this_metrics}
    if args.baseline:
        modules[f"baseline {args.baseline}"] = module_at(args.baseline)
    measures = {
        "per-language recalls (image <-> sentence)": lambda m: m.per_language_recalls(
            image_emb, sentence_emb, sentence_image, sentence_lang, languages),
        "cross-lingual sentence retrieval (every ordered pair)": lambda m: m.cross_lingual_recalls(
            sentence_emb, sentence_image, sentence_lang, languages),
    }  # fmt: skip
    print(f"machine: {platform.node()}, {torch.get_num_threads()} torch threads; torch {torch.__version__}; "
          f"{args.images} images, sentences {sentences}; median of {args.repeats}")  # fmt: skip
    print("\n| measure | " + " | ".join(f"{name} s" for name in modules) + " | equal |")
    print("|---|" + "---|" * (len(modules) + 1))
    for label, measure in measures.items():
        for module in modules.values():
            measure(module)  # warm
        timings = timed([lambda module=module, measure=measure: measure(module) for module in modules.values()],
                        args.repeats)
        cells = [f"{seconds:.3f}" for seconds, _ in timings]
        tables = [table for _, table in timings]
        equal = all(table == tables[0] for table in tables)
        print(f"| {label} | " + " | ".join(cells) + f" | {'yes' if equal else 'NO'} |")


if __name__ == "__main__":
    main()
