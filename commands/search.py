"""`mule search`: images for a sentence, or sentences for an image (the champion)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mule.commands.options import reading_workdir
from mule.mule_core.settings import ConfigError


def run(args: argparse.Namespace) -> int:
    if bool(args.text) == bool(args.image):
        raise ConfigError('search needs a sentence or --image PATH (one of them): mule search "a red circle" or '
                          "mule search --image photo.jpg")  # fmt: skip
    if args.k < 1:
        raise ConfigError(f"--k must be at least 1, got {args.k}")
    from mule.mule_core.devices import idle_threads_sleep
    from mule.storage.locks import catalog_reading

    idle_threads_sleep()  # before the query's encoder imports torch
    from mule.serving import retrieval

    workdir = reading_workdir(args.workdir, "search")
    with catalog_reading(workdir):  # never a stage's outputs half-written
        searcher = retrieval.open_searcher(workdir, args.dataset, args.run, args.version)
        if args.text:
            found = retrieval.search_text(searcher, args.text, args.lang, args.k, args.split)
        else:
            found = retrieval.search_image(searcher, Path(args.image), args.k, args.split)
    if args.text:
        print(f"{found['model']}; query in {found['lang']} ({found['language']}); "
              f"{found['gallery']} images ({found['split']}; {found['searched']})")  # fmt: skip
        composed = set(found["composed_words"])
        unknown = [w for w in found["unknown_words"] if w not in composed]
        if composed:
            print(f"words outside the {found['lang']} vocabulary, built from their character n-grams: "
                  f"{', '.join(found['composed_words'])}")  # fmt: skip
        if unknown:
            print(f"words the {found['lang']} vocabulary does not know (read as <unk>): {', '.join(unknown)}")
        for r in found["results"]:
            print(f"{r['rank']:>3}  {r['score']:.3f}  {r['image_id']:<24} {r['split']:<10} {r['path']}")
    else:
        print(f"{found['model']}; image features: {found['features']}")
        for lang, results in found["results"].items():
            print(f"[{lang}]")
            for r in results:
                print(f"{r['rank']:>3}  {r['score']:.3f}  {r['text']}   ({r['image_id']})")
    if args.out:
        from mule.experiments import plots

        figure = plots.search_sheet(found)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(args.out, dpi=110)
        plots.close(figure)
        print(f"contact sheet: {args.out}")
    return 0
