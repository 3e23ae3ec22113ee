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
(its words carry their MULE features and nothing else) and its tables are stored as the
base's are (output.tables: int8 by default, mule_core.table_precision): an added
language costs a quarter of a base one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from mule.data_catalog import queries
from mule.data_catalog.model_files import load_model, save_atomic, save_model, table_precisions, weights_digest
from mule.data_catalog.splits import load_split, load_vocabulary
from mule.mule_core.devices import resolve_device, use_cpu_threads
from mule.mule_core.encoding import cross_lingual, encode_split, evaluate_split
from mule.mule_core.errors import UserError
from mule.mule_core.metrics import mean_r1
from mule.mule_core.model import count_parameters, round_tables, table_names, with_added_language
from mule.mule_core.progress import SHOWN
from mule.mule_core.table_precision import stored_tables
from mule.mule_core.training.joint import JointTrainer
from mule.mule_core.training.lp import LPTrainer
from mule.mule_core.vocabulary import Vocab, Vocabulary
from mule.storage.content_digests import ids_digest
from mule.tasks.shared.checkpoints import fit_checkpointed, history_records, snapshot
from mule.tasks.shared.context import StageContext, logger
from mule.tasks.shared.token_identity import caption_tokenizers
from mule.words.aligned import StartSettings, aligned_start


class AddLanguageError(UserError, ValueError):
    pass


@dataclass
class Addition:
    """A language being added: the base model and what its branch starts from."""

    lang: str
    base_path: Path
    base: Any  # the base MuleModel, frozen
    meta: dict  # the base's file's meta (data_catalog.model_files.load_model)
    trained: list[str]  # the base's own languages (not languages added to it): what the branch reads beside its own
    added: tuple[str, ...]  # (lang,) when its captions are in a table of their own (the language-captions step)
    words: list[str]  # its training captions' words, commonest first
    vocab: Vocab
    vectors: torch.Tensor
    ngrams: tuple | None
    start: Any  # the aligned start, or None (the text stage's vectors)

    @property
    def vocabulary(self) -> Vocabulary:
        """What the branch trains on: the base's trained languages and its own."""
        vocabs = self.meta["vocabulary"].vocabs
        return Vocabulary([*self.trained, self.lang], {**{x: vocabs[x] for x in self.trained}, self.lang: self.vocab},
                          ngram_lengths=self.meta["vocabulary"].ngram_lengths)  # fmt: skip


@dataclass
class Splits:
    train: Any  # the training images with captions in the language (photographed)
    lp: Any  # its training captions' images, photographed or not (LP reads sentences alone)
    all_images: int  # training images with features
    val: Any
    val_captions: str | None  # which of the language's captions the validation split holds: human, translated, none


def compute(ctx: StageContext) -> dict[str, Any]:
    started = time.perf_counter()  # the aligned start included: e5 reads a new language's words once a machine
    addition = _addition(ctx)
    model = _with_branch(ctx, addition)
    splits = _splits(ctx, addition)
    counts = count_parameters(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    logger().info("adding %s to %s: %d training images with %s captions (of %d; LP on %d, photographed or not), "
                  "%s trainable parameters of %s", addition.lang, addition.base_path.name, splits.train.n_images,
                  addition.lang, splits.all_images, splits.lp.n_images, f"{trainable:,}", f"{counts['total']:,}",
                  extra=SHOWN)  # fmt: skip
    history, kept_epoch, kept_score, lp_epoch = _train(ctx, addition, model, splits)
    return _save(ctx, addition, model, splits, trainable, history, kept_epoch, kept_score, lp_epoch, started)


def _addition(ctx: StageContext) -> Addition:
    """The base model (add.base_model with the languages named before this one) and the
    new branch's start: aligned (its words read by e5 as the trained languages' nearest)
    or, the paper's, the text stage's vectors of the language."""
    wd, catalog, cfg = ctx.workdir, ctx.catalog, ctx.cfg
    dataset, lang = cfg.data.dataset, cfg.add.adding
    if not lang:
        raise AddLanguageError("no language to add: set add.languages (mule run add-language --lang ja)")
    base_path = wd.model_path(dataset, cfg.add.extended_model)
    if not base_path.exists():
        raise AddLanguageError(f"no base model at {base_path}: train one first (mule run all), or name one with "
                               f"add.base_model (models/{dataset}/<name>.pt)")  # fmt: skip
    base, meta = load_model(base_path)
    if lang in base.languages:
        raise AddLanguageError(f"{base_path} already reads {lang}")
    trained = list(meta.get("trained_languages") or base.languages)  # the base's own, not languages added to it
    from_table = lang not in cfg.data.languages  # its captions: a table of its own (the language-captions step)
    words = queries.training_words(catalog, dataset, lang, cfg.data.captions, added=from_table)
    if cfg.add.start == "aligned":  # its words, their vectors and its FC, from e5 and the trained languages
        start = aligned_start(base, meta["vocabulary"], lang, words, StartSettings(open_words=cfg.add.words),
                              cfg.text.tokenizers, keys_from=trained)  # fmt: skip
        vocab, vectors, ngrams = start.vocab, start.vectors, start.ngrams
    else:
        start = None
        vocab, vectors, ngrams = _text_stage_start(ctx, lang, from_table, meta["cfg"].model)
    return Addition(lang, base_path, base, meta, trained, (lang,) if from_table else (), words, vocab, vectors, ngrams,
                    start)  # fmt: skip


def _text_stage_start(ctx: StageContext, lang: str, from_table: bool, model_cfg) -> tuple:
    """The paper's start: the text stage's vectors of the language (and a random FC)."""
    if from_table:
        raise AddLanguageError(f"add.start=captions starts {lang} from the text stage's word vectors, which "
                               f"only a language of data.languages has: add {lang} to data.languages, or start "
                               "it aligned (add.start=aligned, the default)")  # fmt: skip
    own = load_vocabulary(ctx.catalog, ctx.cfg.data.dataset, [lang], model_cfg)
    if lang not in own.languages:
        raise AddLanguageError(f"no {lang} word vectors in dataset {ctx.cfg.data.dataset!r}: run the text stage with "
                               f"{lang} in data.languages (or start it aligned: add.start=aligned needs no "
                               "captions)")  # fmt: skip
    return own.vocabs[lang], own.vectors[lang], (own.ngram_vectors or {}).get(lang)


def _with_branch(ctx: StageContext, a: Addition):
    """The base with the new branch (its FC the aligned start's), on the run's CPU threads,
    and torch seeded after: the same training whatever branches the base holds."""
    use_cpu_threads(ctx.cfg.train.threads)  # in the key: the count changes the weights
    model = with_added_language(a.base, a.meta["cfg"].model, a.lang, len(a.vocab), a.vectors, a.vocab.tokens,
                                a.ngrams, word_dim=a.vectors.shape[1])  # fmt: skip
    if a.start is not None:
        with torch.no_grad():
            model.branches[a.lang].fc.weight.copy_(a.start.fc_weight)
            model.branches[a.lang].fc.bias.copy_(a.start.fc_bias)
    torch.manual_seed(ctx.cfg.train.seed)
    return model


def _splits(ctx: StageContext, a: Addition) -> Splits:
    catalog, cfg = ctx.catalog, ctx.cfg
    dataset, vocabulary = cfg.data.dataset, a.vocabulary
    max_tokens, extractor = a.meta["cfg"].text.max_tokens, a.meta["extractor"]
    every = load_split(catalog, dataset, "train", vocabulary, max_tokens, extractor, cfg.data.captions, added=a.added)
    # LP reads sentences alone: a training image without a photo still pairs the new
    # language's captions with the base languages' (xFlickr&CO's ja train_1500: 1,500, 488 photographed)
    text_only = load_split(catalog, dataset, "train", vocabulary, max_tokens, captions=cfg.data.captions, added=a.added)
    val, val_captions = _validation_split(catalog, dataset, vocabulary, max_tokens, extractor, a.lang,
                                          cfg.data.captions, a.added)  # fmt: skip
    # the others' images teach the new branch nothing
    return Splits(every.images_with(a.lang), text_only.images_with(a.lang), every.n_images, val, val_captions)


def _train(ctx: StageContext, a: Addition, model, splits: Splits) -> tuple[list, int, float | None, int | None]:
    """LP, then joint training, of the new branch alone, checkpointed: (history, the joint
    epoch kept, its val mR, LP's epoch kept). Without training captions the aligned start is
    the model; without validation captions, human or translated (a few-shot set: xFlickr&CO's
    train_100), no epoch can be chosen: the last is kept, and the run says so."""
    wd, cfg, log, lang = ctx.workdir, ctx.cfg, logger(), a.lang
    if not splits.lp.n_images:
        if a.start is None:
            raise AddLanguageError(f"no {lang} training captions to add it from (add.start=aligned reads it "
                                   "without any)")  # fmt: skip
        log.warning("no %s training captions: the branch is its aligned start, read zero-shot (nothing trained)",
                    lang, extra=SHOWN)  # fmt: skip
        return [], 0, None, None
    validated = splits.val_captions is not None
    if not validated:
        log.warning("no %s captions in the validation split: the epochs are not chosen, the last is kept (%d of "
                    "LP, %d joint); give %s validation captions (or data.captions=human+mt) to choose them", lang,
                    cfg.pretrain.epochs, cfg.train.epochs, lang)  # fmt: skip
    elif splits.val_captions != "human":
        log.warning("no human %s captions in the validation split: the epochs are chosen on its machine-"
                    "translated ones", lang, extra=SHOWN)  # fmt: skip
    loss, device, name = replace(cfg.loss, lc=False, nc=True), resolve_device(cfg.train.device), cfg.output.model_name
    lp_epoch = None
    if cfg.pretrain.enabled and cfg.pretrain.epochs > 0:
        lp_epoch = _lp(ctx, model, splits.lp, splits.val if validated else None, loss, device, lang,
                       wd.checkpoint_path(cfg.data.dataset, f"{name}.lp"))  # fmt: skip

    def validate(m):
        table = evaluate_split(m, splits.val, device, cfg.eval.ks)
        return table[lang]["mR"], table

    trainer = JointTrainer(model, splits.train, loss, cfg.train, device, validate=validate if validated else None)

    def metrics(r) -> dict:
        return {"add.train.match": r.losses.get("match", 0.0), **({f"add.val.{lang}.mR": r.score} if validated else {})}

    history, _ = fit_checkpointed(ctx, trainer, wd.checkpoint_path(cfg.data.dataset, name), "extend", metrics,
                                  lambda _: None)  # fmt: skip
    if validated:
        return history, trainer.best_epoch, trainer.best_score, lp_epoch
    return history, trainer.epoch, None, lp_epoch


def _save(ctx: StageContext, a: Addition, model, splits: Splits, trainable: int, history: list, kept_epoch: int,
          kept_score: float | None, lp_epoch: int | None, started: float) -> dict[str, Any]:  # fmt: skip
    """The branch rounded to what the file stores, the base checked unchanged (every weight,
    every base-language embedding of the test split), the model saved; the step's summary."""
    catalog, cfg, log, lang, meta = ctx.catalog, ctx.cfg, logger(), a.lang, a.meta
    dataset, base_vocab = cfg.data.dataset, meta["vocabulary"]
    round_tables(model, {lang: cfg.output.tables})  # as the file stores it: the model measured is the model saved
    model.eval()
    moved = _weights_moved(a.base, model)
    unchanged = _max_change(a.base, model, catalog, dataset, cfg, meta, meta["extractor"],
                            resolve_device(cfg.train.device))  # fmt: skip
    log.info("base after adding %s: largest change of a base weight %g, of a base language's sentence or image "
             "embedding on %s %g", lang, moved, cfg.eval.split, unchanged, extra=SHOWN)  # fmt: skip
    if moved != 0.0 or unchanged != 0.0:  # frozen weights cannot move anything: if they did, that is a bug
        raise RuntimeError(f"adding {lang} changed the base model (weights max |diff| {moved}, embeddings {unchanged})")
    every = Vocabulary([*a.base.languages, lang], {**base_vocab.vocabs, lang: a.vocab},
                       ngram_lengths=base_vocab.ngram_lengths)  # fmt: skip
    tokenizers = {**(meta.get("tokenizers") or {}),
                  **caption_tokenizers(catalog, queries.added_dataset(dataset, lang) if a.added else dataset, [lang],
                                       cfg.text.tokenizers, "extend")}  # fmt: skip
    path = ctx.workdir.model_path(dataset, cfg.output.model_name)
    base_cfg = meta["cfg"]
    saved_cfg = replace(cfg, model=base_cfg.model, text=replace(cfg.text, word_dim=base_cfg.text.word_dim,
                                                                 max_tokens=base_cfg.text.max_tokens))  # fmt: skip
    added_languages = [*meta.get("added_languages", []), lang]
    # the models it extends, its root first: the registry's champion moves to a model that extends it
    extends = [*meta.get("extends", []), weights_digest(base_vocab.words, a.base.state_dict())]
    base_val = meta.get("base_val_score", meta.get("val_score"))
    save_model(path, model, saved_cfg, every, tables={**table_precisions(meta), lang: cfg.output.tables}, kind="joint",
               dataset=dataset, extractor=meta["extractor"], best_epoch=kept_epoch, val_score=kept_score,
               val_table=meta.get("val_table"), parameters=count_parameters(model), base_model=str(a.base_path),
               added_language=lang, added_languages=added_languages, trained_languages=a.trained,
               unchanged=unchanged, tokenizers=tokenizers, extractor_numerics=meta.get("extractor_numerics"),
               extends=extends, base_val_score=base_val)  # fmt: skip
    mine = {k: v for k, v in model.state_dict().items() if k.startswith(f"branches.{lang}.")}
    branch = sum(t.numel() * t.element_size() for t in stored_tables(
        mine, dict.fromkeys(table_names(model, lang), cfg.output.tables)).values())  # as the file stores it
    log.info("%s: the %s branch is %d words x %d wide (%.1f MiB stored, %s tables); model at %s", lang, lang,
             len(a.vocab) - 2, a.vectors.shape[1], branch / 2**20, cfg.output.tables, path, extra=SHOWN)  # fmt: skip
    return {"path": str(path), "language": lang, "languages": list(every.languages),
            "added_languages": added_languages, "base_model": str(a.base_path), "best_epoch": kept_epoch,
            "lp_best_epoch": lp_epoch, "val_mR": kept_score, "val_captions": splits.val_captions,
            # what the registry compares: the base's validation (its languages are this model's, unchanged)
            "val_mean_mR": base_val, "val_images": ids_digest(splits.val.image_ids), "extends": extends,
            "images": splits.train.n_images, "lp_images": splits.lp.n_images, "caption_words": len(a.words),
            "trainable_parameters": trainable, "parameters": count_parameters(model),
            "branch_bytes": branch, "existing_languages_max_change": unchanged, "base_weights_max_change": moved,
            "start": cfg.add.start, **({"aligned": a.start.summary} if a.start is not None else {}),
            "weights_digest": weights_digest(every.words, model.state_dict()), "extractor": meta["extractor"],
            "examples": _examples(catalog, dataset, lang, a.added, a.trained[0]),
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
