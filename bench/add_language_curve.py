"""New languages from few captions: `mule run add-language` for each language of xFlickr&CO
at each size of its few-shot files (train_5, train_25, train_100, ...), onto one trained
model, and the curve of test mR against captions beside the zero-shot peer and chance.

    python bench/add_language_curve.py --workdir W --source ../shared/datasets/multi30k \
        --images ../shared/datasets/flickr8k-224/images --xflickrco ../shared/datasets/xflickrco \
        --peer peer.json --out /tmp/curve

W is a workdir (a copy: its catalog takes the nine languages) whose `--base-model` is
trained. Each size re-ingests the captions of that size for every language (the text stage
reruns for all of them), then adds one language at a time (`train.base_model`: the base is
measured as it is and extended, nothing else trains). `--peer` is bench/peer_xflickrco.py's
`--out` JSON; `--out` gets curve.json and curve.png. Each run's log is in the output folder.
`--mt aligned`: the paper's +MT, each added language also trained on the English training
captions translated into it word by word (translate.backend=aligned: no parallel text).
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


def extra_files(sizes: dict[str, int]) -> str:
    """xFlickr&CO's files of these sizes (0: none of the language's training captions, its test
    captions only: it is read zero-shot from its aligned start)."""
    return ",".join([*(f"{lang}/train_{n}=train" for lang, n in sizes.items() if n), "test=test_xflickrco"])


def translate_train(backend: str, languages: list[str]) -> list[str]:
    """--mt: each added language also reads English's training captions translated into it
    by `backend` (the paper's +MT). Only English into the new languages (the added branch
    alone trains), all of them at once: one translate and one text stage for every addition."""
    if not backend:
        return []
    pairs = ",".join(f"en-{lang}" for lang in languages)
    return ["data.captions=human+mt", f"translate.backend={backend}", f"translate.pairs={pairs}"]


def add(args, lang: str, sizes: dict[str, int], log: Path) -> dict:
    """One `mule run add-language`; its test table (mR per language) from evaluation.json."""
    languages = ",".join((*BASE, *sizes))
    command = [sys.executable, "-m", "mule.commands.main", "run", "add-language", "--lang", lang,
               "--workdir", args.workdir, "--dataset", args.dataset, "--source", args.source, "--images", args.images,
               "--set", f"data.languages={languages}", "--set", f"data.extra_captions={args.xflickrco}",
               "--set", f"data.extra_files={extra_files(sizes)}", "--set", f"eval.split={args.split},test_2016",
               "--set", f"train.base_model={args.base_model}", *(a for kv in args.sets for a in ("--set", kv)),
               *(a for kv in translate_train(args.mt, args.languages.split(",")) for a in ("--set", kv))]  # fmt: skip
    with log.open("w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT)
    if code:
        raise SystemExit(f"add-language {lang} failed (exit {code}): see {log}")
    folder = Path(args.workdir) / "results" / args.dataset / f"{args.base_model}+{lang}"
    evaluation = json.loads((folder / "evaluation.json").read_text())
    assert evaluation["split"] == args.split, evaluation["split"]
    return {"mR": {k: v["mR"] for k, v in evaluation["table"].items()}, "images": evaluation["images"],
            "chance": {k: v["mR"] for k, v in evaluation["chance"].items()}}  # fmt: skip


def plot(curve: dict, peer: dict, out: Path, before: dict | None = None) -> None:
    """The curve (0 captions, zero-shot, at the axis's left end), the peer's line per language, chance;
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
        earlier = (before or {}).get("languages", {}).get(lang)
        if earlier:
            steps = sorted(earlier, key=int)
            sizes_seen |= {int(n) for n in steps}
            axes.plot([int(n) for n in steps], [earlier[n] for n in steps], "--", color=line.get_color(), alpha=0.35)
    axes.axhline(curve["chance"], color="grey", linestyle="--", linewidth=1, label="chance")
    axes.plot([], [], "k:", linewidth=1, label="e5-small + ridge, zero-shot (same colour)")
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
    parser.add_argument("--sizes", default="0,5,25,100", help="every language at each of these (0: zero-shot)")
    parser.add_argument("--more", default="ja=500,1500", help="one language further, the others at the last size")
    parser.add_argument("--base-model", default="model")
    parser.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                        help="passed to every `mule run add-language` (train.add_start=captions: the paper's start)")
    parser.add_argument("--mt", default="", metavar="BACKEND",
                        help="+MT: English training captions translated into each added language by this "
                             "translate.backend (aligned: any language e5 reads) beside its human captions")  # fmt: skip
    parser.add_argument("--split", default="test_xflickrco")
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
    runs = [(n, {lang: n for lang in languages}, languages) for n in sizes]
    if args.more:
        lang, further = args.more.split("=")
        runs += [(int(n), {x: (int(n) if x == lang else sizes[-1]) for x in languages}, [lang])
                 for n in further.split(",")]  # fmt: skip
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {sum(len(r[2]) for r in runs)} additions onto "
          f"{args.base_model}", flush=True)  # fmt: skip
    curve: dict = {"languages": {lang: {} for lang in languages}, "base": {}, "chance": None, "images": None}
    if args.mt:
        curve["label"] = f"A language added from few captions + English's translated into it ({args.mt})"
    started, done, total = time.perf_counter(), 0, sum(len(r[2]) for r in runs)
    for n, per_language, adding in runs:
        for lang in adding:
            result = add(args, lang, per_language, out / f"{n}-{lang}.log")
            curve["languages"][lang][str(n)] = round(result["mR"][lang], 1)
            curve["base"][f"{n}-{lang}"] = {k: round(v, 1) for k, v in result["mR"].items() if k != lang}
            curve["chance"], curve["images"] = round(result["chance"][lang], 1), result["images"]
            done += 1
            elapsed = time.perf_counter() - started
            print(f"{lang} from {n}: {result['mR'][lang]:.1f} mR ({done}/{total}, elapsed {elapsed:.0f} s, "
                  f"ETA {elapsed / done * (total - done):.0f} s)", flush=True)  # fmt: skip
    peer = {}
    if args.peer:
        tables = json.loads(Path(args.peer).read_text())
        peer = {lang: row["mR"] for lang, row in tables["splits"][args.split]["table"].items()}
        curve["peer"] = {k: round(v, 1) for k, v in peer.items()}
    (out / "curve.json").write_text(json.dumps(curve, indent=1))
    report(curve, peer, languages, out)
    print(f"{time.perf_counter() - started:.0f} s")


def over_seeds(curves: list[dict]) -> dict:
    """One curve over seeds: each point the mean of the seeds that have it, with "std" beside
    (sample std) where every seed has it; a point only the first seed has stays as it is."""
    mean: dict = {"languages": {}, "std": {}, "seeds": len(curves), "chance": curves[0]["chance"],
                  "images": curves[0]["images"], "peer": curves[0].get("peer", {}),
                  "label": curves[0].get("label", "A language added to a trained mule model")}  # fmt: skip
    for lang, points in curves[0]["languages"].items():
        values = {n: [c["languages"][lang][n] for c in curves if n in c["languages"].get(lang, {})] for n in points}
        mean["languages"][lang] = {n: round(statistics.fmean(v), 1) for n, v in values.items()}
        mean["std"][lang] = {n: round(statistics.stdev(v), 1) for n, v in values.items() if len(v) == len(curves) > 1}
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
    if peer:
        print("| peer (zero-shot) | " + " | ".join(f"{peer[x]:.1f}" for x in languages) + " |")
    print("| chance | " + " | ".join(str(curve["chance"]) for _ in languages) + " |")
    print(f"\n{out / 'curve.json'}, {out / 'curve.png'}")

if __name__ == "__main__":
    main()
