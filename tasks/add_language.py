"""Adding a language to a trained model (MULE's design allows it: a language owns only
its word vectors and one FC into MULE).

The base model (trained without the language) is copied and frozen; the new language's
branch is trained alone: LP first (NC at the MULE layer toward the base languages'
sentences of the same images), then NC at both layers plus the image-sentence loss, on
the training images that have captions in the new language. LC stays off (its
classifier would need the new language's row trained). Afterwards the base languages'
sentence and image embeddings are compared with the base model's on the test split:
they must be bit-identical.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import Any

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from experiments import plots
from experiments.tracking import Tracker
from mule_core.config import fingerprint
from mule_core.errors import UserError
from mule_core.model import count_parameters, with_added_language
from mule_core.training import Trainer, encode_split, evaluate_split, resolve_device

from .common import context, logger
from .model_io import file_digest, load_model, load_split, load_vocabulary, model_digest, save_model
from .training_common import cross_lingual, mean_r1, optim_config


class AddLanguageError(UserError, ValueError):
    pass


def base_model_name(lang: str, configured: str = "") -> str:
    return configured or f"without-{lang}"


def added_model_name(lang: str, configured_base: str = "") -> str:
    return f"{base_model_name(lang, configured_base)}+{lang}"


@task(name="add-language", cache_policy=NO_CACHE)
def add_language(workdir: str, config: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    wd, catalog, cfg = context(workdir, config)
    log, dataset, tracker = logger(), cfg.data.dataset, Tracker(wd, run_id)
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
    vocabulary = load_vocabulary(catalog, dataset, [*base.languages, lang])
    if lang not in vocabulary.languages:
        raise AddLanguageError(
            f"no {lang} word vectors in dataset {dataset!r}: run the text stage with {lang} in data.languages"
        )
    for other in base.languages:
        if meta["vocabulary"].vocabs[other].tokens != vocabulary.vocabs[other].tokens:
            raise AddLanguageError(f"the {other} word vectors changed since {base_path} was trained; retrain it")
    base_cfg = meta["cfg"]
    extractor = meta["extractor"]
    reader = functools.partial(catalog.read_features, dataset)
    features = (extractor, reader)
    all_train = load_split(catalog, dataset, "train", vocabulary, base_cfg.text.max_tokens, features, cfg.data.captions)
    train = all_train.images_with(lang)  # the others' images teach the new branch nothing
    val = load_split(catalog, dataset, "val", vocabulary, base_cfg.text.max_tokens, features)
    device = resolve_device(cfg.train.device)
    torch.manual_seed(cfg.train.seed)
    model = with_added_language(base, base_cfg.model, lang, vocabulary.sizes[lang], vocabulary.vectors[lang])
    counts = count_parameters(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("adding %s to %s: %d training images with %s captions (of %d), %s trainable parameters of %s",
             lang, base_path.name, train.n_images, lang, all_train.n_images, f"{trainable:,}", f"{counts['total']:,}")  # fmt: skip

    path = wd.model_path(dataset, cfg.train.model_name)
    key = fingerprint("add-language", lang, model_digest(base_path), cfg.data.captions, cfg.loss, cfg.pretrain,
                      replace(cfg.train, reuse=False), file_digest(wd.table_path("word_vectors", dataset)))  # fmt: skip
    if cfg.train.reuse and path.exists():
        previous = torch.load(path, map_location="cpu", weights_only=True)
        if previous.get("key") == key:
            log.info("reusing %s: the same language added to the same base (train.reuse=true)", path)
            return {"path": str(path), "reused": True, "existing_languages_max_change": previous["unchanged"]}
    started = time.perf_counter()
    loss = replace(cfg.loss, lc=False, nc=True)
    if cfg.pretrain.enabled and cfg.pretrain.epochs > 0:

        def validate_lp(m):
            table = cross_lingual(m, val, device, "mule")
            toward = {pair: row for pair, row in table.items() if lang in pair.split("->")}
            return mean_r1(toward), toward

        lp = Trainer(model, train, loss, optim_config(cfg, train, lp=True), device, mode="lp", validate=validate_lp)
        lp.fit(lambda r: tracker.metrics({"add.lp.val_r1": r.score}, step=r.epoch))
        log.info("LP of the %s branch: best epoch %d, val cross-lingual R@1 %.1f (pairs with %s)",
                 lang, lp.best_epoch, lp.best_score, lang)  # fmt: skip

    def validate(m):
        table = evaluate_split(m, val, device, cfg.eval.ks)
        return table[lang]["mR"], table

    trainer = Trainer(model, train, loss, optim_config(cfg, train, lp=False), device, mode="joint", validate=validate)
    history = trainer.fit(lambda r: tracker.metrics({"add.train.match": r.losses.get("match", 0.0),
                                                     f"add.val.{lang}.mR": r.score}, step=r.epoch))  # fmt: skip
    unchanged = _max_change(base, model, catalog, dataset, cfg, meta, features, device)
    log.info("base languages after adding %s: largest change of any sentence or image embedding on %s = %g",
             lang, cfg.eval.split, unchanged)  # fmt: skip
    if unchanged != 0.0:  # frozen weights cannot move anything: if they did, that is a bug
        raise RuntimeError(f"adding {lang} changed the base languages' embeddings (max |diff| {unchanged})")
    save_model(path, model, replace(cfg, model=base_cfg.model, text=base_cfg.text), vocabulary, kind="joint",
               dataset=dataset, extractor=extractor, best_epoch=trainer.best_epoch, val_score=trainer.best_score,
               parameters=counts, key=key, base_model=str(base_path), added_language=lang, unchanged=unchanged)  # fmt: skip
    figure = plots.training_curves(history, f"Adding {lang}", score_label=f"val {lang} mR")
    tracker.figure(figure, "add_language_curves.png")
    plots.close(figure)
    tracker.metrics({"add.trainable_parameters": trainable, "add.existing_languages_max_change": unchanged,
                     f"add.val.{lang}.best_mR": trainer.best_score})  # fmt: skip
    return {"path": str(path), "best_epoch": trainer.best_epoch, f"val_{lang}_mR": trainer.best_score,
            "trainable_parameters": trainable, "existing_languages_max_change": unchanged,
            "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def _max_change(base, model, catalog, dataset, cfg, meta, features, device) -> float:
    """Largest |difference| between the base model's and the new model's embeddings of
    the base languages' test sentences (MULE and multimodal layers) and of the images."""
    data = load_split(catalog, dataset, cfg.eval.split, meta["vocabulary"], meta["cfg"].text.max_tokens, features)
    before, after = encode_split(base, data, device), encode_split(model, data, device)
    return max(float((before[k] - after[k]).abs().max()) for k in before)
