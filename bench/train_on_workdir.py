"""Joint training on a workdir's catalog, outside Prefect and MLflow: for choosing settings.

    python bench/train_on_workdir.py --workdir W [--dataset embedded] [--set K=V ...] [--test]

Reads what the train stage reads (train and val splits with their features, the word
vectors, LP's model when pretrain.enabled), trains with the resolved config and prints
every epoch (losses, language-classifier accuracy, validation mean mR, seconds), then the
best epoch and, with --test, the test split's mean mR. Nothing is written to the workdir.
"""

from __future__ import annotations

import argparse
import functools
import logging
import platform
import time

import torch

from data_catalog.catalog import Catalog
from data_catalog.workdir import Workdir
from mule_core.config import parse_assignments, resolve
from mule_core.metrics import mean_mr
from mule_core.training import Trainer, evaluate_split, resolve_device
from tasks.features import extractor_for
from tasks.model_io import build_model, load_split, load_vocabulary
from tasks.pretrain import lp_path
from tasks.train import load_pretrained_mule
from tasks.training_common import optim_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--dataset", default="embedded")
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--set", dest="assignments", action="append", default=[])
    parser.add_argument("--test", action="store_true", help="also evaluate the kept model on the test split")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("mule.training").setLevel(logging.WARNING)  # per-epoch lines are printed below

    overrides = {"data.dataset": args.dataset, **parse_assignments(args.assignments)}
    cfg = resolve(args.preset, overrides)
    wd = Workdir.at(args.workdir)
    catalog = Catalog(wd)
    extractor = extractor_for(cfg.features)
    reader = functools.partial(catalog.read_features, cfg.data.dataset)
    vocabulary = load_vocabulary(catalog, cfg.data.dataset, cfg.data.languages)
    load = functools.partial(load_split, catalog, cfg.data.dataset, vocabulary=vocabulary,
                             max_tokens=cfg.text.max_tokens, features=(extractor, reader))  # fmt: skip
    train, val = load("train", captions=cfg.data.captions), load("val")
    device = resolve_device(cfg.train.device)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg, vocabulary, image_dim=train.features.shape[1])
    model.set_image_normalization(train.features)
    if cfg.pretrain.enabled:
        load_pretrained_mule(model, lp_path(wd, catalog, cfg), vocabulary)
    print(f"machine: {platform.node()}, {torch.get_num_threads()} threads; {train.n_images} train images, "
          f"{len(train.caption_image)} captions; overrides {overrides}", flush=True)  # fmt: skip

    def validate(m):
        table = evaluate_split(m, val, device, cfg.eval.ks)
        return mean_mr(table), table

    trainer = Trainer(model, train, cfg.loss, optim_config(cfg, train, lp=False), device, validate=validate)
    started = time.perf_counter()

    def on_epoch(r) -> None:
        losses = " ".join(f"{k} {v:.3f}" for k, v in r.losses.items())
        flag = f" [{r.divergence}]" if getattr(r, "divergence", None) else ""
        print(f"epoch {r.epoch:>2}  val {r.score:5.1f}{'*' if r.is_best else ' '}  {losses}  "
              f"{r.seconds:.0f}s ({time.perf_counter() - started:.0f}s){flag}", flush=True)  # fmt: skip

    trainer.fit(on_epoch)
    print(f"best epoch {trainer.best_epoch}: val {trainer.best_score:.2f}; {time.perf_counter() - started:.0f}s")
    if args.test:
        test = load(cfg.eval.split)
        table = evaluate_split(model, test, device, cfg.eval.ks)
        print(f"test mean mR {mean_mr(table):.2f}: " + ", ".join(f"{k} {v['mR']:.1f}" for k, v in table.items()))


if __name__ == "__main__":
    main()
