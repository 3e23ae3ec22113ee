"""Adding a language to a trained model (MULE's design allows it: a language owns only
its word vectors and one FC into MULE): the `extend` step of the add-language sweep.

The base model is copied and frozen; the new language's branch is trained alone: LP first
(NC at the MULE layer toward the base's trained languages' sentences of the same images),
then NC at both layers plus the image-sentence loss, on the training images that have
captions in the new language. LC stays off (its classifier would need the new language's
row trained). Both train through the checkpointed loop the training stages use, so a stop
in any epoch resumes there. Afterwards every weight of the base, and the base languages'
sentence and image embeddings on the test split, are compared with the base model's: they
must be bit-identical.

The branch reads only the base's trained languages and its own captions: a language added
after another (es, then ja onto <base>+es) trains as it would alone, and the model holding
both is the two branches side by side. From an aligned start the branch is mule_dim wide
(its words carry their MULE features and nothing else) and its tables are stored in
float16 (mule_core.model.half_tables): an added language costs a quarter of a base one.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from mule.data_catalog import queries
from mule.data_catalog.model_files import load_model, save_atomic, save_model, weights_digest
from mule.data_catalog.splits import load_split, load_vocabulary
from mule.mule_core.devices import resolve_device, use_cpu_threads
from mule.mule_core.encoding import cross_lingual, encode_split, evaluate_split
from mule.mule_core.errors import UserError
from mule.mule_core.joint_training import JointTrainer
from mule.mule_core.lp_training import LPTrainer
from mule.mule_core.metrics import mean_r1
from mule.mule_core.model import count_parameters, half_tables, with_added_language
from mule.mule_core.progress import SHOWN
from mule.mule_core.vocabulary import Vocabulary
from mule.storage.content_digests import ids_digest
from mule.tasks.shared.aligned_start import aligned_start
from mule.tasks.shared.checkpoints import fit_checkpointed, history_records, snapshot
from mule.tasks.shared.context import StageContext, logger
from mule.tasks.shared.token_identity import caption_tokenizers

# Each trained language's commonest words: the keys a new language's words are read from.
# Fewer, better-trained words beat more on the validation photos (1,000: 32.6 mR held out,
# 10,000: 27.8; bench/aligned_start_val.py, docs/real-photos.md)
FIT_WORDS = 1000


class AddLanguageError(UserError, ValueError):
    pass


def compute(ctx: StageContext) -> dict[str, Any]:
    wd, catalog, cfg = ctx.workdir, ctx.catalog, ctx.cfg
    log, dataset, lang = logger(), cfg.data.dataset, cfg.train.adding
    started = time.perf_counter()  # the aligned start included: e5 reads a new language's words once a machine
    if not lang:
        raise AddLanguageError("no language to add: set train.add_language (mule run add-language --lang ja)")
    base_path = wd.model_path(dataset, cfg.train.extended_model)
    if not base_path.exists():
        raise AddLanguageError(f"no base model at {base_path}: train one first (mule run all), or name one with "
                               f"train.base_model (models/{dataset}/<name>.pt)")  # fmt: skip
    base, meta = load_model(base_path)
    if lang in base.languages:
        raise AddLanguageError(f"{base_path} already reads {lang}")
    base_cfg, extractor, max_tokens = meta["cfg"], meta["extractor"], meta["cfg"].text.max_tokens
    trained = list(meta.get("trained_languages") or base.languages)  # the base's own, not languages added to it
    from_table = lang not in cfg.data.languages  # its captions: a table of its own (the language-captions step)
    added = (lang,) if from_table else ()
    words = queries.training_words(catalog, dataset, lang, cfg.data.captions, added=from_table)
    base_vocab: Vocabulary = meta["vocabulary"]
    if cfg.train.add_start == "aligned":  # its words, their vectors and its FC, from e5 and the trained languages
        start = aligned_start(base, base_vocab, lang, words, cfg.train.add_words, FIT_WORDS, cfg.text.tokenizers,
                              keys_from=trained)  # fmt: skip
        vocab, vectors, ngrams = start.vocab, start.vectors, start.ngrams
    else:  # the paper's start: the text stage's vectors of the language, a random FC
        start = None
        if from_table:
            raise AddLanguageError(f"train.add_start=captions starts {lang} from the text stage's word vectors, which "
                                   f"only a language of data.languages has: add {lang} to data.languages, or start "
                                   "it aligned (train.add_start=aligned, the default)")  # fmt: skip
        own = load_vocabulary(catalog, dataset, [lang], base_cfg.model)
        if lang not in own.languages:
            raise AddLanguageError(f"no {lang} word vectors in dataset {dataset!r}: run the text stage with {lang} in "
                                   "data.languages (or start it aligned: train.add_start=aligned needs no captions)")  # fmt: skip
        vocab, vectors, ngrams = own.vocabs[lang], own.vectors[lang], (own.ngram_vectors or {}).get(lang)
    # what the branch trains on: the base's trained languages and its own captions
    vocabulary = Vocabulary([*trained, lang], {**{x: base_vocab.vocabs[x] for x in trained}, lang: vocab},
                            ngram_lengths=base_vocab.ngram_lengths)  # fmt: skip
    device = resolve_device(cfg.train.device)
    use_cpu_threads(cfg.train.threads)  # in the key: the count changes the weights
    model = with_added_language(base, base_cfg.model, lang, len(vocab), vectors, vocab.tokens, ngrams,
                                word_dim=vectors.shape[1])  # fmt: skip
    if start is not None:
        with torch.no_grad():
            model.branches[lang].fc.weight.copy_(start.fc_weight)
            model.branches[lang].fc.bias.copy_(start.fc_bias)
    torch.manual_seed(cfg.train.seed)  # after the base's branches were made: the same run whatever the base holds
    all_train = load_split(catalog, dataset, "train", vocabulary, max_tokens, extractor, cfg.data.captions, added=added)
    train = all_train.images_with(lang)  # the others' images teach the new branch nothing
    # LP reads sentences alone: a training image without a photo still pairs the new
    # language's captions with the base languages' (xFlickr&CO's ja train_1500: 1,500, 488 photographed)
    text_only = load_split(catalog, dataset, "train", vocabulary, max_tokens, captions=cfg.data.captions, added=added)
    text_train = text_only.images_with(lang)
    val, val_captions = _validation_split(catalog, dataset, vocabulary, max_tokens, extractor, lang, cfg.data.captions,
                                          added)  # fmt: skip
    counts = count_parameters(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("adding %s to %s: %d training images with %s captions (of %d; LP on %d, photographed or not), "
             "%s trainable parameters of %s", lang, base_path.name, train.n_images, lang, all_train.n_images,
             text_train.n_images, f"{trainable:,}", f"{counts['total']:,}", extra=SHOWN)  # fmt: skip

    loss = replace(cfg.loss, lc=False, nc=True)
    # Without validation captions in the language, human or translated (a few-shot set:
    # xFlickr&CO's train_100), no epoch can be chosen: the last is kept, and the run says so.
    validated = val_captions is not None
    history, kept_epoch, kept_score, lp_epoch = [], 0, None, None
    name = cfg.train.model_name
    if not text_train.n_images:  # nothing to train on: the aligned start is the model
        if start is None:
            raise AddLanguageError(f"no {lang} training captions to add it from (train.add_start=aligned reads it "
                                   "without any)")  # fmt: skip
        log.warning("no %s training captions: the branch is its aligned start, read zero-shot (nothing trained)",
                    lang, extra=SHOWN)  # fmt: skip
    else:
        if not validated:
            log.warning("no %s captions in the validation split: the epochs are not chosen, the last is kept (%d of "
                        "LP, %d joint); give %s validation captions (or data.captions=human+mt) to choose them", lang,
                        cfg.pretrain.epochs, cfg.train.epochs, lang)  # fmt: skip
        elif val_captions != "human":
            log.warning("no human %s captions in the validation split: the epochs are chosen on its machine-"
                        "translated ones", lang, extra=SHOWN)  # fmt: skip
        if cfg.pretrain.enabled and cfg.pretrain.epochs > 0:
            lp_epoch = _lp(ctx, model, text_train, val if validated else None, loss, device, lang,
                           wd.checkpoint_path(dataset, f"{name}.lp"))  # fmt: skip

        def validate(m):
            table = evaluate_split(m, val, device, cfg.eval.ks)
            return table[lang]["mR"], table

        trainer = JointTrainer(model, train, loss, cfg.train, device, validate=validate if validated else None)

        def metrics(r) -> dict:
            return {"add.train.match": r.losses.get("match", 0.0), **({f"add.val.{lang}.mR": r.score} if validated else {})}

        history, _ = fit_checkpointed(ctx, trainer, wd.checkpoint_path(dataset, name), "extend", metrics,
                                      lambda _: None)  # fmt: skip
        kept_epoch = trainer.best_epoch if validated else trainer.epoch
        kept_score = trainer.best_score if validated else None
    half_tables(model, [lang])  # as the file stores it: the model measured is the model saved
    model.eval()
    moved = _weights_moved(base, model)
    unchanged = _max_change(base, model, catalog, dataset, cfg, meta, extractor, device)
    log.info("base after adding %s: largest change of a base weight %g, of a base language's sentence or image "
             "embedding on %s %g", lang, moved, cfg.eval.split, unchanged, extra=SHOWN)  # fmt: skip
    if moved != 0.0 or unchanged != 0.0:  # frozen weights cannot move anything: if they did, that is a bug
        raise RuntimeError(f"adding {lang} changed the base model (weights max |diff| {moved}, embeddings {unchanged})")
    every = Vocabulary([*base.languages, lang], {**base_vocab.vocabs, lang: vocab},
                       ngram_lengths=base_vocab.ngram_lengths)  # fmt: skip
    tokenizers = {**(meta.get("tokenizers") or {}),
                  **caption_tokenizers(catalog, queries.added_dataset(dataset, lang) if from_table else dataset, [lang],
                                       cfg.text.tokenizers, "extend")}  # fmt: skip
    path = wd.model_path(dataset, name)
    saved_cfg = replace(cfg, model=base_cfg.model, text=replace(cfg.text, word_dim=base_cfg.text.word_dim,
                                                                 max_tokens=max_tokens))  # fmt: skip
    added_languages = [*meta.get("added_languages", []), lang]
    # the models it extends, its root first: the registry's champion moves to a model that extends it
    extends = [*meta.get("extends", []), weights_digest(base_vocab.words, base.state_dict())]
    base_val = meta.get("base_val_score", meta.get("val_score"))
    save_model(path, model, saved_cfg, every, half=[*meta.get("half_tables", []), lang], kind="joint",
               dataset=dataset, extractor=extractor, best_epoch=kept_epoch, val_score=kept_score,
               val_table=meta.get("val_table"), parameters=count_parameters(model), base_model=str(base_path),
               added_language=lang, added_languages=added_languages, trained_languages=trained,
               unchanged=unchanged, tokenizers=tokenizers, extractor_numerics=meta.get("extractor_numerics"),
               extends=extends, base_val_score=base_val)  # fmt: skip
    branch = sum(p.numel() * (2 if "embed" in n or "subwords" in n else 4)
                 for n, p in model.branches[lang].named_parameters())  # fmt: skip
    log.info("%s: the %s branch is %d words x %d wide (%.1f MiB stored, float16 tables); model at %s", lang, lang,
             len(vocab) - 2, vectors.shape[1], branch / 2**20, path, extra=SHOWN)  # fmt: skip
    return {"path": str(path), "language": lang, "languages": list(every.languages),
            "added_languages": added_languages, "base_model": str(base_path), "best_epoch": kept_epoch,
            "lp_best_epoch": lp_epoch, "val_mR": kept_score, "val_captions": val_captions,
            # what the registry compares: the base's validation (its languages are this model's, unchanged)
            "val_mean_mR": base_val, "val_images": ids_digest(val.image_ids), "extends": extends,
            "images": train.n_images, "lp_images": text_train.n_images, "caption_words": len(words),
            "trainable_parameters": trainable, "parameters": count_parameters(model),
            "branch_bytes": branch, "existing_languages_max_change": unchanged, "base_weights_max_change": moved,
            "start": cfg.train.add_start, **({"aligned": start.summary} if start is not None else {}),
            "weights_digest": weights_digest(every.words, model.state_dict()), "extractor": extractor,
            "examples": _examples(catalog, dataset, lang, added, trained[0]),
            "seconds": round(time.perf_counter() - started, 1), "history": history_records(history)}  # fmt: skip


def _lp(ctx: StageContext, model, text_train, val, loss, device, lang: str, checkpoint) -> int | None:
    """LP of the new branch, checkpointed after every epoch; once done, its final state is
    the checkpoint, so a stop in joint training resumes there without LP again. The best
    epoch (on val, when it has the language's captions), or None without validation."""
    cfg, log = ctx.cfg, logger()

    def validate_lp(m):
        table = cross_lingual(m, val, device, "mule")
        toward = {pair: row for pair, row in table.items() if lang in pair.split("->")}
        return mean_r1(toward), toward

    lp = LPTrainer(model, text_train, loss, cfg.train, device, pretrain=cfg.pretrain,
                   validate=validate_lp if val is not None else None)  # fmt: skip

    def done(_history) -> None:
        save_atomic({"key": ctx.key, "trainer": snapshot(lp.state_dict())}, checkpoint)

    fit_checkpointed(ctx, lp, checkpoint, "extend.lp",
                     lambda r: {"add.lp.val_r1": r.score} if r.score is not None else {}, done)  # fmt: skip
    if val is None:
        return None
    log.info("LP of the %s branch: best epoch %d, val cross-lingual R@1 %.1f (pairs with %s)", lang, lp.best_epoch,
             lp.best_score, lang, extra=SHOWN)  # fmt: skip
    return lp.best_epoch


def _validation_split(catalog, dataset, vocabulary, max_tokens, extractor, lang, captions, added):
    """The validation split the new branch's epochs are chosen on, and which captions of the
    language it holds: its human ones where it has any, else, when the run trains on
    translations (data.captions human+mt or mt), its translated ones; else none."""

    def has(split):
        return lang in {split.languages[i] for i in set(split.caption_lang.tolist())}

    human = load_split(catalog, dataset, "val", vocabulary, max_tokens, extractor, added=added)
    if has(human):
        return human, "human"
    if captions != "human":
        translated = load_split(catalog, dataset, "val", vocabulary, max_tokens, extractor, captions, added=added)
        if has(translated):
            return translated, captions
    return human, None


def _weights_moved(base, model) -> float:
    """Largest |difference| of any weight of the base in the new model (the classifier: the
    base's rows)."""
    theirs, ours = base.state_dict(), model.state_dict()
    largest = 0.0
    for name, tensor in theirs.items():
        mine = ours[name][: tensor.shape[0]] if name.startswith("classifier.") else ours[name]
        if tensor.numel():
            largest = max(largest, float((mine.float() - tensor.float()).abs().max()))
    return largest


def _max_change(base, model, catalog, dataset, cfg, meta, extractor, device) -> float:
    """Largest |difference| between the base model's and the new model's embeddings of
    the base's trained languages' test sentences (MULE and multimodal layers) and of the images."""
    first = queries.evaluation_splits(catalog, dataset, cfg.eval.split)[0][0]  # eval.split may name several
    vocabulary = meta["vocabulary"]
    trained = list(meta.get("trained_languages") or vocabulary.languages)
    own = Vocabulary(trained, {x: vocabulary.vocabs[x] for x in trained}, ngram_lengths=vocabulary.ngram_lengths)
    data = load_split(catalog, dataset, first, own, meta["cfg"].text.max_tokens, extractor)
    before, after = encode_split(base, data, device), encode_split(model, data, device)
    return max(float((before[k] - after[k]).abs().max()) for k in before)


def _examples(catalog, dataset: str, lang: str, added: tuple[str, ...], other: str) -> list[tuple[str, str]]:
    """A sentence in the new language where it has one, and one in a trained language (the
    registered model's input example: the first row's language given, the next detected)."""
    source = queries.added_dataset(dataset, lang) if added else dataset
    return [*((lang, text) for text in queries.first_captions(catalog, source, lang, 1)),
            *((other, text) for text in queries.first_captions(catalog, dataset, other, 1))]  # fmt: skip
