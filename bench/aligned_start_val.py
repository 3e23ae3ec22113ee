"""How an aligned start is chosen without reading a test split: each trained language of a
model is taken out in turn and started again aligned from the others (as a language with
no captions would be, words/aligned.py), and its validation mR is read over
the validation photos. Prints one row per setting (the held-out languages' val mR and
their mean), beside the trained branch's own val mR and chance.

    python bench/aligned_start_val.py --workdir W --dataset multi30k \
        --settings k=5 k=10 k=10,t=0.1 k=10,t=0.1,words=20000

W: a workdir whose train stage ran (models/<dataset>/model.pt). Words are read by e5 once
per machine (the user's cache), so only the first setting pays them.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

import torch
from stage_times import cpu_model  # bench/ is on the path

from mule.data_catalog.model_files import load_model
from mule.data_catalog.splits import load_split
from mule.data_catalog.tables import Catalog
from mule.mule_core.encoding import evaluate_split
from mule.mule_core.metrics import chance_table
from mule.mule_core.model import MuleModel, with_added_language
from mule.storage.workdir import Workdir
from mule.words.aligned import StartSettings, aligned_start


def without(model: MuleModel, lang: str, cfg) -> MuleModel:
    """The model without `lang`'s branch (its classifier row dropped): what a language is added to."""
    kept = [x for x in model.languages if x != lang]
    words = {x: model.branches[x].words for x in kept}
    sizes = {x: model.branches[x].embed.num_embeddings for x in kept}
    word_dim = model.branches[kept[0]].embed.embedding_dim
    image_dim = model.image_mean.numel() if model.image_branch is not None else None
    out = MuleModel(kept, sizes, word_dim, image_dim, cfg, words)
    state = {k: v for k, v in model.state_dict().items()
             if not k.startswith(f"branches.{lang}.") and not k.startswith("classifier.")}  # fmt: skip
    out.load_state_dict(state, strict=False)
    rows = [model.languages.index(x) for x in kept]
    with torch.no_grad():
        out.classifier.weight.copy_(model.classifier.weight[rows])
        out.classifier.bias.copy_(model.classifier.bias[rows])
    return out.eval()


def row(label: str, scores: dict[str, float], seconds: str) -> str:
    cells = " | ".join(f"{v:.1f}" for v in scores.values())
    return f"| {label} | {cells} | {sum(scores.values()) / len(scores):.1f} | {seconds} |"


def parse(setting: str) -> dict:
    """k=10,t=0.1,words=50000,keys=10000 -> aligned_start's neighbours, temperature, open words
    and each trained language's words it is read against."""
    names = {"k": ("neighbours", int), "t": ("temperature", float), "words": ("open_words", int),
             "keys": ("fit_words", int)}
    options = {}
    for item in filter(None, setting.split(",")):
        key, value = item.split("=")
        name, kind = names[key]
        options[name] = kind(value)
    return options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--dataset", default="multi30k")
    parser.add_argument("--model", default="model")
    parser.add_argument("--languages", default="de,fr,cs", help="the trained languages taken out in turn")
    parser.add_argument("--settings", nargs="+", default=["k=10,t=0.1"],
                        help="k=NEIGHBOURS,t=TEMPERATURE,words=OPEN_WORDS (each defaults to train.add_*'s)")
    args = parser.parse_args()
    wd = Workdir.at(args.workdir)
    catalog = Catalog(wd)
    model, meta = load_model(wd.model_path(args.dataset, args.model))
    cfg, vocabulary = meta["cfg"], meta["vocabulary"]
    held_out = args.languages.split(",")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {args.model} of {args.dataset}; val photos", flush=True)
    own = load_split(catalog, args.dataset, "val", vocabulary, cfg.text.max_tokens, meta["extractor"])
    trained = evaluate_split(model, own, torch.device("cpu"), (1, 5, 10))
    chance = chance_table(torch.from_numpy(own.caption_image), torch.from_numpy(own.caption_lang), own.languages,
                          (1, 5, 10))  # fmt: skip
    print(f"| setting | {' | '.join(held_out)} | mean | seconds |\n|---|" + "---|" * (len(held_out) + 2))
    print(row("the trained branch", {x: trained[x]["mR"] for x in held_out}, "–"), flush=True)
    for setting in args.settings:
        options = parse(setting)
        started, scores = time.perf_counter(), {}
        for lang in held_out:
            base = without(model, lang, cfg.model)
            start = aligned_start(base, vocabulary, lang, [], StartSettings(**options), cfg.text.tokenizers)
            added = with_added_language(base, cfg.model, lang, len(start.vocab), start.vectors, start.vocab.tokens,
                                        start.ngrams)  # fmt: skip
            with torch.no_grad():
                added.branches[lang].fc.weight.copy_(start.fc_weight)
                added.branches[lang].fc.bias.copy_(start.fc_bias)
            words = replace(vocabulary, languages=added.languages, vocabs={**vocabulary.vocabs, lang: start.vocab})
            val = load_split(catalog, args.dataset, "val", words, cfg.text.max_tokens, meta["extractor"])
            scores[lang] = evaluate_split(added.eval(), val, torch.device("cpu"), (1, 5, 10))[lang]["mR"]
        print(row(setting, scores, f"{time.perf_counter() - started:.0f}"), flush=True)
    print(row("chance", {x: chance[x]["mR"] for x in held_out}, "–"))


if __name__ == "__main__":
    main()
