"""Whether a query's language is found right (no `lang` given): each human test caption of
xFlickr&CO (en, de, es, id, ja, ru, zh: one a photo) and of Multi30K's test_2016 (fr, cs)
in a language the model reads goes through the detection every command uses
(mule_core/language_id.py: the identifier restricted to the model's languages, times the
words each vocabulary knows), and the table says how many went to their own branch, where
the others went, and how many English sentences went to an added language's branch.
`--words-alone` gives the same table for the vocabularies alone (the detection before the
identifier).

    python bench/language_found.py --model W/models/multi30k/model+es+id+ja+ru+zh.pt \\
        --xflickrco ../shared/datasets/xflickrco --multi30k ../shared/datasets/multi30k
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import time
from collections import Counter
from pathlib import Path

from stage_times import cpu_model  # bench/ is on the path

from mule.api import load
from mule.mule_core.embedder import EmbedError


def captions(xflickrco: Path, multi30k: Path, languages: list[str]) -> dict[str, list[str]]:
    """Per language, its human test captions, one a photo."""
    out = {}
    for lang in languages:
        path = xflickrco / lang / "test.jsonl"
        if path.is_file():
            out[lang] = [json.loads(line)["sentences"][0] for line in path.read_text(encoding="utf-8").splitlines()
                         if line.strip()]  # fmt: skip
            continue
        path = multi30k / "data" / "task1" / "raw" / f"test_2016_flickr.{lang}.gz"
        if path.is_file():
            with gzip.open(path, "rt", encoding="utf-8") as lines:
                out[lang] = [line.strip() for line in lines if line.strip()]
    return out


def found_as(model, text: str) -> str:
    """The branch a query goes to; "none" when no vocabulary knows a word of it (an empty
    caption, or one of unknown words alone): every command refuses it, naming it."""
    try:
        return model.choose_language(text, None)[0]
    except EmbedError:
        return "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a model file, an exported folder or a workdir (its champion)")
    parser.add_argument("--xflickrco", required=True)
    parser.add_argument("--multi30k", required=True)
    parser.add_argument("--words-alone", action="store_true", help="the vocabularies alone, no identifier")
    parser.add_argument("--out", help="a JSON file of the table")
    args = parser.parse_args()
    model = load(args.model)
    if args.words_alone:
        from mule.mule_core import embedder, language_id

        def words_alone(text, vocabs, tokenizers=None):
            return language_id.detect_language(text, vocabs, tokenizers, use_identifier=False)

        embedder.detect_language = words_alone
    added = set(model.meta.get("added_languages") or ())
    found = captions(Path(args.xflickrco), Path(args.multi30k), model.languages)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {model.label}: {', '.join(model.languages)} "
          f"(added: {', '.join(sorted(added)) or 'none'}); {'vocabularies alone' if args.words_alone else 'identifier x vocabularies'}")
    rows, started, total = {}, time.perf_counter(), 0
    for lang, texts in found.items():
        read = Counter(found_as(model, text) for text in texts)
        total += len(texts)
        rows[lang] = {"captions": len(texts), "own": read[lang], "elsewhere": dict(read - Counter({lang: read[lang]})),
                      "to_added": sum(n for x, n in read.items() if x in added and x != lang)}  # fmt: skip
    seconds = time.perf_counter() - started
    print("\n| language | captions | to its own branch | % | went elsewhere | to an added branch |")
    print("|---|---|---|---|---|---|")
    for lang, row in rows.items():
        elsewhere = ", ".join(f"{x} {n}" for x, n in sorted(row["elsewhere"].items(), key=lambda kv: -kv[1])) or "–"
        mark = " (added)" if lang in added else ""
        print(f"| {lang}{mark} | {row['captions']} | {row['own']} | {100 * row['own'] / row['captions']:.1f} | "
              f"{elsewhere} | {row['to_added']} |")
    print(f"\n{total} captions in {seconds:.1f} s ({total / seconds:.0f} a second, one at a time)")
    if args.out:
        Path(args.out).write_text(json.dumps({"model": model.label, "words_alone": args.words_alone, "rows": rows,
                                              "seconds": seconds, "cpu": cpu_model()}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
