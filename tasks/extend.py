"""Adding a language to a trained model (MULE's design allows it: a language owns only
its word vectors and one FC into MULE): the `extend` step of the add-language sweep.

The base model (trained without the language) is copied and frozen; the new language's
branch is trained alone: LP first (NC at the MULE layer toward the base languages'
sentences of the same images), then NC at both layers plus the image-sentence loss, on
the training images that have captions in the new language. LC stays off (its
classifier would need the new language's row trained). Afterwards the base languages'
sentence and image embeddings are compared with the base model's on the test split:
they must be bit-identical.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from mule.data_catalog import queries
from mule.data_catalog.model_files import load_model, save_model
from mule.data_catalog.splits import load_split, load_vocabulary
from mule.mule_core.devices import resolve_device, use_cpu_threads
from mule.mule_core.encoding import cross_lingual, encode_split, evaluate_split
from mule.mule_core.errors import UserError
from mule.mule_core.joint_training import JointTrainer
from mule.mule_core.lp_training import LPTrainer
from mule.mule_core.metrics import mean_r1
from mule.mule_core.model import count_parameters, with_added_language
from mule.mule_core.progress import SHOWN
from mule.tasks.shared.aligned_start import aligned_start
from mule.tasks.shared.checkpoints import history_records
from mule.tasks.shared.context import StageContext, logger
from mule.tasks.shared.token_identity import caption_tokenizers

# Each trained language's commonest words: the keys a new language's words are read from.
# Fewer, better-trained words beat more on the validation photos (1,000: 32.6 mR held out,
# 10,000: 27.8; bench/aligned_start_val.py, docs/real-photos.md).
FIT_WORDS = 1000


class AddLanguageError(UserError, ValueError):
    pass


def base_model_name(lang: str, configured: str = "") -> str:
    return configured or f"without-{lang}"


def added_model_name(lang: str, configured_base: str = "") -> str:
    return f"{base_model_name(lang, configured_base)}+{lang}"


def compute(ctx: StageContext) -> dict[str, Any]:
    wd, catalog, cfg = ctx.workdir, ctx.catalog, ctx.cfg
    log, dataset = logger(), cfg.data.dataset
    lang = cfg.train.add_language
    if not lang:
        raise AddLanguageError("no language to add: set train.add_language (mule run add-language --lang ja)")
    base_path = wd.model_path(dataset, base_model_name(lang, cfg.train.base_model))
    if not base_path.exists():
        raise AddLanguageError(f"no base model at {base_path}: train one without {lang} first "
                               f"(mule run add-language trains it, or train.model_name={base_path.stem})")  # fmt: skip
    base, meta = load_model(base_path)
    if lang in base.languages:
        raise AddLanguageError(f"{base_path} already reads {lang}")
    vocabulary = load_vocabulary(catalog, dataset, [*base.languages, lang], meta["cfg"].model)
    aligned = cfg.train.add_start == "aligned"
    if lang not in vocabulary.languages and not aligned:
        raise AddLanguageError(f"no {lang} word vectors in dataset {dataset!r}: run the text stage with {lang} in "
                               "data.languages (or start it aligned: train.add_start=aligned needs no captions)")  # fmt: skip
    for other in base.languages:
        if meta["vocabulary"].vocabs[other].tokens != vocabulary.vocabs[other].tokens:
            raise AddLanguageError(f"the {other} word vectors changed since {base_path} was trained; retrain it")
    base_cfg, extractor = meta["cfg"], meta["extractor"]
    max_tokens = base_cfg.text.max_tokens
    tokenizers = caption_tokenizers(catalog, dataset, [x for x in vocabulary.languages if x != lang] + [lang],
                                    cfg.text.tokenizers, "extend")  # fmt: skip
    start = None
    if aligned:  # the branch's words, their vectors and its FC, from e5 and the trained languages
        captioned = vocabulary.vocabs[lang].tokens[2:] if lang in vocabulary.languages else []
        start = aligned_start(base, vocabulary, lang, captioned, cfg.train.add_words, FIT_WORDS, cfg.text.tokenizers)
        vocabulary = replace(vocabulary, languages=[*base.languages, lang],
                             vocabs={**vocabulary.vocabs, lang: start.vocab},
                             vectors={**vocabulary.vectors, lang: start.vectors},
                             ngram_vectors=None if vocabulary.ngram_vectors is None
                             else {**vocabulary.ngram_vectors, lang: start.ngrams})  # fmt: skip
    all_train = load_split(catalog, dataset, "train", vocabulary, max_tokens, extractor, cfg.data.captions)
    train = all_train.images_with(lang)  # the others' images teach the new branch nothing
    # LP reads sentences alone: a training image without a photo still pairs the new
    # language's captions with the base languages' (xFlickr&CO's ja train_1500: 1,500, 488 photographed)
    text_only = load_split(catalog, dataset, "train", vocabulary, max_tokens, captions=cfg.data.captions)
    text_train = text_only.images_with(lang)
    val, val_captions = _validation_split(catalog, dataset, vocabulary, max_tokens, extractor, lang, cfg.data.captions)
    device = resolve_device(cfg.train.device)
    use_cpu_threads(cfg.train.threads)  # in the key: the count changes the weights
    torch.manual_seed(cfg.train.seed)
    model = with_added_language(base, base_cfg.model, lang, vocabulary.sizes[lang], vocabulary.vectors[lang],
                                vocabulary.vocabs[lang].tokens, (vocabulary.ngram_vectors or {}).get(lang))  # fmt: skip
    if start is not None:
        with torch.no_grad():
            model.branches[lang].fc.weight.copy_(start.fc_weight)
            model.branches[lang].fc.bias.copy_(start.fc_bias)
    counts = count_parameters(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("adding %s to %s: %d training images with %s captions (of %d; LP on %d, photographed or not), "
             "%s trainable parameters of %s", lang, base_path.name, train.n_images, lang, all_train.n_images,
             text_train.n_images, f"{trainable:,}", f"{counts['total']:,}", extra=SHOWN)  # fmt: skip

    started = time.perf_counter()
    loss = replace(cfg.loss, lc=False, nc=True)
    # Without validation captions in the language, human or translated (a few-shot set:
    # xFlickr&CO's train_100), no epoch can be chosen: the last is kept, and the run says so.
    validated = val_captions is not None
    if not text_train.n_images:  # nothing to train on: the aligned start is the model
        if start is None:
            raise AddLanguageError(f"no {lang} training captions to add it from (train.add_start=aligned reads it "
                                   "without any)")  # fmt: skip
        log.warning("no %s training captions: the branch is its aligned start, read zero-shot (nothing trained)",
                    lang, extra=SHOWN)  # fmt: skip
        return _finish(ctx, base, base_path, model, meta, vocabulary, counts, trainable, lang, train, text_train,
                       [], 0, None, started, extractor, device, max_tokens, tokenizers, start, val_captions)  # fmt: skip
    if not validated:
        log.warning("no %s captions in the validation split: the epochs are not chosen, the last is kept (%d of LP, "
                    "%d joint); give %s validation captions (or data.captions=human+mt) to choose them", lang,
                    cfg.pretrain.epochs, cfg.train.epochs, lang)  # fmt: skip
    elif val_captions != "human":
        log.warning("no human %s captions in the validation split: the epochs are chosen on its machine-translated "
                    "ones", lang, extra=SHOWN)  # fmt: skip
    if cfg.pretrain.enabled and cfg.pretrain.epochs > 0:

        def validate_lp(m):
            table = cross_lingual(m, val, device, "mule")
            toward = {pair: row for pair, row in table.items() if lang in pair.split("->")}
            return mean_r1(toward), toward

        lp = LPTrainer(model, text_train, loss, cfg.train, device, pretrain=cfg.pretrain,
                       validate=validate_lp if validated else None)  # fmt: skip
        lp.fit(lambda r: ctx.report.metrics({"add.lp.val_r1": r.score}, step=r.epoch) if r.score is not None else None)
        if validated:
            log.info("LP of the %s branch: best epoch %d, val cross-lingual R@1 %.1f (pairs with %s)",
                     lang, lp.best_epoch, lp.best_score, lang, extra=SHOWN)  # fmt: skip

    def validate(m):
        table = evaluate_split(m, val, device, cfg.eval.ks)
        return table[lang]["mR"], table

    trainer = JointTrainer(model, train, loss, cfg.train, device, validate=validate if validated else None)
    history = trainer.fit(lambda r: ctx.report.metrics({"add.train.match": r.losses.get("match", 0.0),
                                                        **({f"add.val.{lang}.mR": r.score} if validated else {})},
                                                       step=r.epoch))  # fmt: skip
    kept_epoch = trainer.best_epoch if validated else trainer.epoch
    kept_score = trainer.best_score if validated else None
    return _finish(ctx, base, base_path, model, meta, vocabulary, counts, trainable, lang, train, text_train,
                   history, kept_epoch, kept_score, started, extractor, device, max_tokens, tokenizers, start,
                   val_captions)  # fmt: skip


def _validation_split(catalog, dataset, vocabulary, max_tokens, extractor, lang, captions):
    """The validation split the new branch's epochs are chosen on, and which captions of the
    language it holds: its human ones where it has any, else, when the run trains on
    translations (data.captions human+mt or mt), its translated ones; else none."""
    def has(split):
        return lang in {split.languages[i] for i in set(split.caption_lang.tolist())}

    human = load_split(catalog, dataset, "val", vocabulary, max_tokens, extractor)
    if has(human):
        return human, "human"
    if captions != "human":
        translated = load_split(catalog, dataset, "val", vocabulary, max_tokens, extractor, captions)
        if has(translated):
            return translated, captions
    return human, None


def _finish(ctx, base, base_path, model, meta, vocabulary, counts, trainable, lang, train, text_train, history,
            kept_epoch, kept_score, started, extractor, device, max_tokens, tokenizers, start,
            val_captions) -> dict[str, Any]:  # fmt: skip
    """The base languages checked unchanged, the model saved, the step's summary."""
    wd, catalog, cfg, log, dataset = ctx.workdir, ctx.catalog, ctx.cfg, logger(), ctx.cfg.data.dataset
    base_cfg = meta["cfg"]
    unchanged = _max_change(base, model, catalog, dataset, cfg, meta, extractor, device)
    log.info("base languages after adding %s: largest change of any sentence or image embedding on %s = %g",
             lang, cfg.eval.split, unchanged, extra=SHOWN)  # fmt: skip
    if unchanged != 0.0:  # frozen weights cannot move anything: if they did, that is a bug
        raise RuntimeError(f"adding {lang} changed the base languages' embeddings (max |diff| {unchanged})")
    path = wd.model_path(dataset, cfg.train.model_name)
    save_model(path, model, replace(cfg, model=base_cfg.model, text=replace(cfg.text, word_dim=base_cfg.text.word_dim, max_tokens=max_tokens)), vocabulary, kind="joint",
               dataset=dataset, extractor=extractor, best_epoch=kept_epoch, val_score=kept_score,
               parameters=counts, base_model=str(base_path), added_language=lang, unchanged=unchanged,
               tokenizers=tokenizers)  # fmt: skip
    return {"path": str(path), "language": lang, "best_epoch": kept_epoch, "val_mR": kept_score,
            "val_captions": val_captions,
            "images": train.n_images, "lp_images": text_train.n_images,
            "trainable_parameters": trainable, "parameters": counts, "existing_languages_max_change": unchanged,
            "start": cfg.train.add_start, **({"aligned": start.summary} if start is not None else {}),
            "seconds": round(time.perf_counter() - started, 1), "history": history_records(history)}  # fmt: skip


def _max_change(base, model, catalog, dataset, cfg, meta, extractor, device) -> float:
    """Largest |difference| between the base model's and the new model's embeddings of
    the base languages' test sentences (MULE and multimodal layers) and of the images."""
    first = queries.evaluation_splits(catalog, dataset, cfg.eval.split)[0][0]  # eval.split may name several
    data = load_split(catalog, dataset, first, meta["vocabulary"], meta["cfg"].text.max_tokens, extractor)
    before, after = encode_split(base, data, device), encode_split(model, data, device)
    return max(float((before[k] - after[k]).abs().max()) for k in before)
