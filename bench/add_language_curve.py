"""New languages from few captions, through the command a user types: `mule run
add-language --lang X` onto a trained model for each language of xFlickr&CO, from its
test captions alone (0: read zero-shot from its aligned start) and with its few-shot
training file (train_100, ...), each measured on its human test captions beside the model's
English branch reading the same queries translated word by word (the add-language report's
row), the zero-shot peer and chance; then the curve of test mR against captions.

    python bench/add_language_curve.py --workdir W --source ../shared/datasets/multi30k \
        --images ../shared/datasets/flickr8k-224/images --xflickrco ../shared/datasets/xflickrco \
        --base-model model --seed 0 --peer peer.json --out ~/mule-runs/curve-s0

W is the workdir `mule run all` made over the real photos (its `--base-model` trained).
Each point is one `mule run add-language --lang X --captions X=<file> ...
--set add.base_model=BASE --set train.seed=N`: nothing of the base is retrained, its
languages stay bit-identical, and the test captions (xFlickr&CO's test.jsonl) join
test_2016's photos. `--together es,id,ja,ru,zh` adds them all to one model in one command
(at the largest size) and prints its table. Each run's log is in the output folder; a
point already in --out's curve.json is not run again (a stopped bench resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from stage_times import cpu_model  # bench/ is on the path

BASE = ("en", "de", "fr", "cs")


def captions(args, lang: str, n: int) -> list[str]:
    """--captions for `lang` at size n: its test captions always, its train_n file when n > 0."""
    folder = Path(args.xflickrco) / lang
    files = [folder / "test.jsonl", *([folder / f"train_{n}.jsonl"] if n else [])]
    return [a for f in files for a in ("--captions", f"{lang}={f}")]


def add(args, langs: list[str], n: int, log: Path) -> dict:
    """One `mule run add-language`; the test mR of each added language and of the base's
    languages (evaluation.json), and its translated-query row (translated_queries.json)."""
    command = [sys.executable, "-m", "mule.commands.main", "run", "add-language", "--lang", ",".join(langs),
               "--workdir", args.workdir, "--dataset", args.dataset, "--source", args.source, "--images", args.images,
               "--set", f"add.base_model={args.base_model}", "--set", f"train.seed={args.seed}",
               *(a for lang in langs for a in captions(args, lang, n)), *(a for kv in args.sets for a in ("--set", kv))]  # fmt: skip
    started = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT)
    if code:
        raise SystemExit(f"add-language {','.join(langs)} failed (exit {code}): see {log}")
    results = Path(args.workdir) / "results" / args.dataset
    name = args.base_model + "".join(f"+{x}" for x in langs)
    evaluation = json.loads((results / name / "evaluation.json").read_text())
    base = results if args.base_model == "model" else results / args.base_model
    translated = json.loads((base / "translated_queries.json").read_text())
    return {"mR": {k: v["mR"] for k, v in evaluation["table"].items()}, "images": evaluation["images"],
            "chance": {k: v["mR"] for k, v in evaluation["chance"].items()},
            "translated": {k: v["mR"] for k, v in translated["table"].items() if k in langs},
            "tables": translated.get("tables", {}), "seconds": round(time.perf_counter() - started, 1),
            "model_bytes": (Path(args.workdir) / "models" / args.dataset / f"{name}.pt").stat().st_size}  # fmt: skip


def plot(curve: dict, peer: dict, out: Path, before: dict | None = None) -> None:
    """The curve (0 captions, zero-shot, at the axis's left end), the peer's line per language, the
    base's English branch reading the queries translated (x), chance;
    `before`: an earlier curve drawn faded and dashed in the same colours (another start)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 5.6))
    sizes_seen = set()
    for lang, points in curve["languages"].items():
        sizes = sorted(points, key=int)
        sizes_seen |= {int(n) for n in sizes}
        spread = curve.get("std", {}).get(lang)
        line = axes.errorbar([int(n) for n in sizes], [points[n] for n in sizes], fmt="o-", capsize=3,
                             yerr=[spread.get(n, 0.0) for n in sizes] if spread else None, label=f"mule, {lang}")[0]
        if lang in peer:
            axes.axhline(peer[lang], color=line.get_color(), linestyle=":", linewidth=1)
        translated = curve.get("translated", {}).get(lang, {})
        steps = sorted(translated, key=int)
        if steps:  # the base's English branch reading the queries translated word by word
            axes.plot([int(n) for n in steps], [translated[n] for n in steps], "x--", color=line.get_color(),
                      linewidth=0.8, alpha=0.6)  # fmt: skip
        earlier = (before or {}).get("languages", {}).get(lang)
        if earlier:
            steps = sorted(earlier, key=int)
            sizes_seen |= {int(n) for n in steps}
            axes.plot([int(n) for n in steps], [earlier[n] for n in steps], "--", color=line.get_color(), alpha=0.35)
    axes.axhline(curve["chance"], color="grey", linestyle="--", linewidth=1, label="chance")
    axes.plot([], [], "k:", linewidth=1, label="e5-small + ridge, zero-shot (same colour)")
    if any(curve.get("translated", {}).values()):
        axes.plot([], [], "kx--", linewidth=0.8, alpha=0.6, label="the base's English branch, queries translated")
    if before:
        axes.plot([], [], "k--", alpha=0.35, label=before.get("label", "before"))
    axes.set_xscale("symlog", linthresh=1)  # 0 captions (zero-shot) on the same axis
    ticks = sorted(sizes_seen)
    axes.set_xticks(ticks, [str(n) for n in ticks])
    axes.set_xlabel("captioned training images of the new language (xFlickr&CO train_N; 0: none, zero-shot)")
    seeds = f",\nmean ± std of {curve['seeds']} seeds where bars are drawn" if curve.get("seeds", 1) > 1 else ""
    axes.set_ylabel(f"test mR, {curve['images']} photos, one caption each{seeds}")
    axes.set_title(curve.get("label", "A language added to a trained mule model from few captions"))
    axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)  # below: the lines fill the axes
    figure.tight_layout()
    figure.savefig(out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--dataset", default="multi30k")
    parser.add_argument("--source", required=True)
    parser.add_argument("--images", required=True)
    parser.add_argument("--xflickrco", required=True)
    parser.add_argument("--languages", default="es,id,ja,ru,zh")
    parser.add_argument("--sizes", default="0,100", help="every language at each of these (0: zero-shot)")
    parser.add_argument("--more", default="", help="one language further, e.g. ja=1500")
    parser.add_argument("--base-model", default="model")
    parser.add_argument("--seed", type=int, default=0, help="train.seed of the additions (the base's own seed)")
    parser.add_argument("--together", help="languages added to one model in one command, at the largest size")
    parser.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                        help="passed to every `mule run add-language` (add.start=captions: the paper's start)")
    parser.add_argument("--peer", help="bench/peer_xflickrco.py --out JSON: the zero-shot peer's lines")
    parser.add_argument("--out", required=True)
    parser.add_argument("--replot", action="store_true", help="no runs: the table and plot of --out's curve.json")
    parser.add_argument("--before", help="an earlier curve.json, drawn faded beside this one (its 'label' says what)")
    parser.add_argument("--seeds", nargs="+", metavar="DIR",
                        help="with --replot: other seeds' --out folders; the table gives mean ± std over the "
                             "points every seed has, and --out gets seeds.json")  # fmt: skip
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        curve = json.loads((out / "curve.json").read_text())
        before = json.loads(Path(args.before).read_text()) if args.before else None
        if args.seeds:
            curve = over_seeds([curve, *(json.loads((Path(d) / "curve.json").read_text()) for d in args.seeds)])
            (out / "seeds.json").write_text(json.dumps(curve, indent=1))
        report(curve, curve.get("peer", {}), list(curve["languages"]), out, before)
        return
    languages, sizes = args.languages.split(","), [int(n) for n in args.sizes.split(",")]
    runs = [(n, lang) for n in sizes for lang in languages]
    if args.more:
        lang, further = args.more.split("=")
        runs += [(int(n), lang) for n in further.split(",")]
    saved = out / "curve.json"
    curve: dict = json.loads(saved.read_text()) if saved.exists() else {
        "languages": {lang: {} for lang in languages}, "translated": {lang: {} for lang in languages}, "base": {},
        "seconds": {}, "model_bytes": {}, "chance": None, "images": None, "seed": args.seed,
        "base_model": args.base_model}  # fmt: skip
    todo = [(n, lang) for n, lang in runs if str(n) not in curve["languages"].get(lang, {})]
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {len(todo)} additions onto {args.base_model} "
          f"({len(runs) - len(todo)} in {saved} already)", flush=True)  # fmt: skip
    started = time.perf_counter()
    for done, (n, lang) in enumerate(todo, start=1):
        result = add(args, [lang], n, out / f"{n}-{lang}.log")
        curve["languages"].setdefault(lang, {})[str(n)] = round(result["mR"][lang], 1)
        curve["translated"].setdefault(lang, {})[str(n)] = round(result["translated"].get(lang, float("nan")), 1)
        curve["base"][f"{n}-{lang}"] = {k: round(v, 1) for k, v in result["mR"].items() if k != lang}
        curve["seconds"][f"{n}-{lang}"], curve["model_bytes"][f"{n}-{lang}"] = result["seconds"], result["model_bytes"]
        curve["chance"], curve["images"] = round(result["chance"][lang], 1), result["images"]
        curve.setdefault("tables", {})[lang] = result["tables"].get(lang, "")
        saved.write_text(json.dumps(curve, indent=1))  # after every point: a stopped bench resumes
        elapsed = time.perf_counter() - started
        print(f"{lang} from {n}: {result['mR'][lang]:.1f} mR, translated queries {result['translated'].get(lang, 0):.1f} "
              f"({result['seconds']:.0f} s; {done}/{len(todo)}, elapsed {elapsed:.0f} s, "
              f"ETA {elapsed / done * (len(todo) - done):.0f} s)", flush=True)  # fmt: skip
    if args.together:
        together = args.together.split(",")
        result = add(args, together, max(sizes), out / f"together-{max(sizes)}.log")
        curve["together"] = {"languages": together, "captions": max(sizes), **result}
        saved.write_text(json.dumps(curve, indent=1))
        print(f"\n{args.base_model} with {', '.join(together)} added in one command ({result['seconds']:.0f} s, "
              f"{result['model_bytes'] / 2**20:.0f} MiB): " + ", ".join(f"{k} {v:.1f}" for k, v in result["mR"].items()))
    if args.peer:  # bench/peer_xflickrco.py's --out, or an earlier curve.json that holds the peer's figures
        tables = json.loads(Path(args.peer).read_text())
        curve["peer"] = tables["peer"] if "peer" in tables else {
            k: round(v["mR"], 1) for k, v in tables["splits"]["test_xflickrco"]["table"].items()}  # fmt: skip
        saved.write_text(json.dumps(curve, indent=1))
    report(curve, curve.get("peer", {}), languages, out)
    print(f"{time.perf_counter() - started:.0f} s")


def over_seeds(curves: list[dict]) -> dict:
    """One curve over seeds: each point the mean of the seeds that have it, with "std" beside
    (sample std) where every seed has it; a point only the first seed has stays as it is."""
    mean: dict = {"languages": {}, "std": {}, "seeds": len(curves), "chance": curves[0]["chance"],
                  "images": curves[0]["images"], "peer": curves[0].get("peer", {}),
                  "label": curves[0].get("label", "A language added to a trained mule model")}  # fmt: skip
    for key, spread in (("languages", "std"), ("translated", "translated_std")):
        mean[key], mean[spread] = {}, {}
        for lang, points in curves[0].get(key, {}).items():
            values = {n: [c[key][lang][n] for c in curves if n in c.get(key, {}).get(lang, {})] for n in points}
            mean[key][lang] = {n: round(statistics.fmean(v), 1) for n, v in values.items()}
            mean[spread][lang] = {n: round(statistics.stdev(v), 1) for n, v in values.items() if len(v) == len(curves) > 1}
    return mean


def cell(curve: dict, lang: str, n: int) -> str:
    value = curve["languages"][lang].get(str(n))
    if value is None:
        return "–"
    spread = curve.get("std", {}).get(lang, {}).get(str(n))
    return f"{value} ± {spread}" if spread is not None else str(value)


def report(curve: dict, peer: dict, languages: list[str], out: Path, before: dict | None = None) -> None:
    plot(curve, peer, out / "curve.png", before)
    header = sorted({int(n) for points in curve["languages"].values() for n in points})
    print("\n| captions | " + " | ".join(languages) + " |\n|---|" + "---|" * len(languages))
    for n in header:
        print(f"| {n} | " + " | ".join(cell(curve, x, n) for x in languages) + " |")
    # the base's English branch reading the queries translated word by word: one row where the
    # captions given to the added branch change nothing of it (the same base, the same table)
    rows = {n: [curve.get("translated", {}).get(x, {}).get(str(n)) for x in languages] for n in header}
    rows = {n: row for n, row in rows.items() if any(v is not None for v in row)}
    if len({tuple(row) for row in rows.values()}) == 1:
        rows = {"any captions": next(iter(rows.values()))}
    for n, row in rows.items():
        print(f"| {n}: the base's English branch, queries translated | "
              + " | ".join("–" if v is None else str(v) for v in row) + " |")  # fmt: skip
    if peer:
        print("| peer (zero-shot) | " + " | ".join(f"{peer[x]:.1f}" for x in languages) + " |")
    print("| chance | " + " | ".join(str(curve["chance"]) for _ in languages) + " |")
    print(f"\n{out / 'curve.json'}, {out / 'curve.png'}")

if __name__ == "__main__":
    main()
