"""Joint training: image-sentence triplet loss + NC + LC, starting from LP's MULE layers.

Validation mR after every epoch picks the model that is kept. A checkpoint after the
epochs (written at the lowest CPU priority beside the next: tasks/shared/checkpoints.py) lets an interrupted run
resume where it stopped: only a run under the same stage key (the same inputs, config and
code) resumes it.
"""

from __future__ import annotations

from typing import Any

import torch

from mule.data_catalog import queries
from mule.data_catalog.model_files import load_model, save_model, weights_digest
from mule.data_catalog.splits import load_split, load_vocabulary
from mule.mule_core.batching import captions_per_image
from mule.mule_core.devices import resolve_device, use_cpu_threads
from mule.mule_core.encoding import evaluate_split
from mule.mule_core.errors import UserError
from mule.mule_core.metrics import chance_table, mean_mr
from mule.mule_core.model import build_model, count_parameters, round_tables
from mule.mule_core.progress import SHOWN
from mule.mule_core.training.joint import JointTrainer
from mule.storage.content_digests import ids_digest
from mule.tasks.shared.checkpoints import fit_checkpointed, history_records, phase_seconds
from mule.tasks.shared.context import StageContext, images_with_files, logger
from mule.tasks.shared.token_identity import caption_tokenizers

# Below this many validation images, the run says that its epoch choice is noisy (34 real
# Multi30K val photos: chance mR 15; even folds of 290 real photos differ by up to 4 mR).
FEW_VAL_IMAGES = 100


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


def compute(ctx: StageContext) -> dict[str, Any]:
    wd, catalog, cfg = ctx.workdir, ctx.catalog, ctx.cfg
    log, dataset = logger(), cfg.data.dataset
    images_with_files(catalog, dataset)  # a dataset without images stops here, saying so
    extractor = catalog.require_current_extractor(dataset, cfg.features)
    vocabulary = load_vocabulary(catalog, dataset, cfg.data.languages, cfg.model)
    tokenizers = caption_tokenizers(catalog, dataset, vocabulary.languages, cfg.text.tokenizers, "train")
    train = load_split(catalog, dataset, "train", vocabulary, cfg.text.max_tokens, extractor, cfg.data.captions)
    val = load_split(catalog, dataset, "val", vocabulary, cfg.text.max_tokens, extractor)
    if 0 < val.n_images < FEW_VAL_IMAGES:
        chance = chance_table(torch.from_numpy(val.caption_image), torch.from_numpy(val.caption_lang), val.languages)
        log.warning("validation has %d images with features (chance mR %.1f): the epoch kept is chosen on so few that "
                    "another draw of them moves its mR by points; judge settings on folds of the training photos "
                    "(bench/photo_folds.py, docs/real-photos.md)", val.n_images, mean_mr(chance))  # fmt: skip
    device = resolve_device(cfg.train.device)
    threads = use_cpu_threads(cfg.train.threads)  # in the key: the count changes the weights
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every run
    model = build_model(cfg.model, vocabulary, image_dim=train.features.shape[1])
    model.set_image_normalization(train.features)

    if cfg.pretrain.enabled and len(vocabulary.languages) < 2:
        log.info("LP needs two languages or more (the pretrain stage skipped it): the MULE layers start from the word vectors", extra=SHOWN)
    elif cfg.pretrain.enabled:  # the LP model is an entry it reads only then (its declaration: _LP)
        lp_file = catalog.lp_model_path(cfg)
        if not lp_file.exists():
            raise MissingPretrainError(
                f"LP is on (pretrain.enabled=true) but {lp_file} does not exist: run the pretrain stage first, "
                "or train without it: --set pretrain.enabled=false"
            )
        load_pretrained_mule(model, lp_file, vocabulary)
        log.info("MULE layers initialised from LP (%s)", lp_file, extra=SHOWN)

    counts = count_parameters(model)

    def validate(m):
        table = evaluate_split(m, val, device, cfg.eval.ks)
        return mean_mr(table), table

    trainer = JointTrainer(model, train, cfg.loss, cfg.train, device, validate=validate)
    log.info("training on %d images, %d captions; captions per image %s (a batch draws up to %s of an image's); "
             "%s parameters (%s language-specific); %s, %d CPU thread(s)", train.n_images, len(train.caption_image),
             captions_per_image(train.caption_image, train.caption_lang, train.languages),
             ", ".join(f"{lang} {n}" for lang, n in trainer.sentences_per_image.items()), f"{counts['total']:,}",
             f"{counts['language_specific']:,}", device, threads, extra=SHOWN)  # fmt: skip

    def metrics(result) -> dict:
        out = {f"train.{k}": v for k, v in result.losses.items()}
        out["train.sentences_per_second"] = result.sentences_per_second
        out["train.lr"] = trainer.optimizer.param_groups[0]["lr"]
        out["train.lc_scale"] = trainer.lc_scale()
        out["val.mean_mR"] = result.score
        return out | {f"val.{lang}.mR": row["mR"] for lang, row in (result.validation or {}).items()}

    path = wd.model_path(dataset, cfg.output.model_name)
    trained = {}

    def keep(history) -> None:
        best = next((r for r in history if r.epoch == trainer.best_epoch), None)
        # the training's identity, whatever precision stores it: the registry lets the same
        # training stored anew (another output.tables) serve in its place
        trained["digest"] = weights_digest(vocabulary.words, model.state_dict())
        # training is over: the model in hand becomes the one stored, so what the evaluate
        # stage, the registry and mule serve read is the model this stage returns
        tables = dict.fromkeys(model.languages, cfg.output.tables)
        round_tables(model, tables)
        save_model(path, model, cfg, vocabulary, tables=tables, kind="joint", dataset=dataset, extractor=extractor,
                   best_epoch=trainer.best_epoch, val_score=trainer.best_score,
                   val_table=best.validation if best else None, parameters=counts, tokenizers=tokenizers,
                   extractor_numerics=(catalog.extractor_info(dataset, extractor) or {}).get("numerics"))  # fmt: skip

    checkpoint = wd.checkpoint_path(dataset, cfg.output.model_name)
    history, seconds = fit_checkpointed(ctx, trainer, checkpoint, "train", metrics, keep)
    log.info("training done: best epoch %d of %d, val mean mR %.2f; model at %s",
             trainer.best_epoch, cfg.train.epochs, trainer.best_score, path, extra=SHOWN)  # fmt: skip
    return {"path": str(path), "best_epoch": trainer.best_epoch, "val_mean_mR": trainer.best_score,
            "seconds": seconds, "parameters": counts,
            "diverged": [r.epoch for r in history if r.divergence], "stopped": trainer.stopped,
            "sentences_per_image": trainer.sentences_per_image, "extractor": extractor,
            "languages": list(train.languages), "val_images": ids_digest(val.image_ids),
            "weights_digest": weights_digest(vocabulary.words, model.state_dict()),  # the model's identity
            "trained_digest": trained.get("digest", ""),  # its weights before the tables were rounded
            "examples": example_sentences(catalog, dataset, val), "phases": phase_seconds(history),
            "history": history_records(history)}  # fmt: skip


def example_sentences(catalog, dataset: str, val) -> list[tuple[str, str]]:
    """A validation sentence in each of the first two languages (the registered model's input example)."""
    picked = {}
    for index, lang in enumerate(val.languages):
        rows = (val.caption_lang == index).nonzero()[0]
        if len(rows) and len(picked) < 2:
            picked[lang] = val.caption_ids[rows[0]]
    texts = queries.caption_texts(catalog, dataset, list(picked.values()))
    return [(lang, texts[caption]) for lang, caption in picked.items() if caption in texts]
