"""Training (LP and joint) and encoding of a split. Pure PyTorch: callers bring tensors.

The trainer keeps the epoch with the best validation score and can be checkpointed
after every epoch (state_dict / load_state_dict) so an interrupted run resumes.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .batching import Batch, ImageBatchSampler
from .config import LossConfig
from .losses import image_sentence_loss, language_classifier_loss, neighborhood_loss
from .metrics import per_language_recalls
from .model import MuleModel, TextBatch
from .progress import Progress, format_seconds

log = logging.getLogger("mule.training")


@dataclass
class SplitTensors:
    """One split, ready for the model. Captions are rows; images are rows of `features`."""

    languages: list[str]
    tokens: torch.Tensor  # N x T, padded
    lengths: torch.Tensor  # N
    caption_lang: np.ndarray  # N, index into languages
    caption_image: np.ndarray  # N, row of the caption's image
    image_ids: list[str]
    features: torch.Tensor | None = None  # n_images x F; None for a text-only dataset
    caption_ids: list[str] | None = None  # N, for showing the sentences behind results

    @property
    def n_images(self) -> int:
        return len(self.image_ids)

    def text_batch(self, rows: torch.Tensor, groups: list[tuple[str, int, int]]) -> TextBatch:
        lengths = self.lengths[rows]
        tokens = self.tokens[rows, : int(lengths.max())]
        return TextBatch(tokens, lengths, groups)

    def images_with(self, lang: str) -> SplitTensors:
        """The images that have a caption in `lang`, with all their captions."""
        keep_image = np.zeros(self.n_images, dtype=bool)
        keep_image[self.caption_image[self.caption_lang == self.languages.index(lang)]] = True
        new_row = np.cumsum(keep_image) - 1
        rows = np.nonzero(keep_image[self.caption_image])[0]
        index = torch.from_numpy(rows)
        return SplitTensors(
            self.languages, self.tokens[index], self.lengths[index], self.caption_lang[rows],
            new_row[self.caption_image[rows]], [i for i, k in zip(self.image_ids, keep_image) if k],
            self.features[torch.from_numpy(np.nonzero(keep_image)[0])] if self.features is not None else None,
            [self.caption_ids[r] for r in rows] if self.caption_ids is not None else None,
        )  # fmt: skip


@dataclass
class OptimConfig:
    epochs: int
    lr: float
    lr_decay: float = 1.0
    word_lr_scale: float = 1.0
    grad_clip: float = 0.0
    batch_images: int = 128
    sentences_per_image: dict[str, int] = field(default_factory=dict)
    seed: int = 0
    balance_language_groups: bool = False
    amp: bool = True  # CUDA only
    compile: bool = False


@dataclass
class EpochResult:
    epoch: int  # 1-based
    losses: dict[str, float]
    seconds: float
    sentences_per_second: float
    score: float | None = None  # validation score (higher is better)
    validation: dict | None = None
    is_best: bool = False


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Trainer:
    """Trains MULE for `optim.epochs` epochs.

    mode "joint": image-sentence triplet loss (+ NC at both layers, + LC).
    mode "lp":    language pretraining of the MULE layers: NC at the MULE layer (+ LC).
    """

    def __init__(
        self,
        model: MuleModel,
        data: SplitTensors,
        loss: LossConfig,
        optim: OptimConfig,
        device: torch.device,
        mode: str = "joint",
        validate: Callable[[MuleModel], tuple[float, dict]] | None = None,
    ):
        if mode not in ("joint", "lp"):
            raise ValueError(f"mode must be 'joint' or 'lp', got {mode!r}")
        if mode == "lp" and not model.has_mule:
            raise ValueError("LP pretrains the MULE layer; this model has none (model.sharing=parallel)")
        if mode == "joint" and data.features is None:
            raise ValueError("joint training needs image features; this split has none")
        self.model, self.data, self.loss, self.optim, self.mode = model.to(device), data, loss, optim, mode
        self.device, self.validate = device, validate
        self.features = data.features.to(device) if data.features is not None and mode == "joint" else None
        torch.manual_seed(optim.seed)
        params = model.mule_parameters() if mode == "lp" else [p for p in model.parameters() if p.requires_grad]
        words = {id(b.embed.weight) for b in model.branches.values()}
        self.optimizer = torch.optim.Adam(
            [
                {"params": [p for p in params if id(p) not in words]},
                {"params": [p for p in params if id(p) in words], "lr": optim.lr * optim.word_lr_scale},
            ],
            lr=optim.lr,
        )
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, gamma=optim.lr_decay)
        self.sampler = ImageBatchSampler(
            data.caption_image,
            data.caption_lang,
            data.languages,
            optim.sentences_per_image,
            optim.batch_images,
            optim.seed,
            balance_groups=optim.balance_language_groups,
        )
        self.amp = optim.amp and device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp)
        self._image_sentence_loss, self._neighborhood_loss = image_sentence_loss, neighborhood_loss
        if optim.compile:
            self._image_sentence_loss = torch.compile(image_sentence_loss, dynamic=True)
            self._neighborhood_loss = torch.compile(neighborhood_loss, dynamic=True)
        self.epoch = 0
        self.best_score = -math.inf
        self.best_epoch = 0
        self.best_state: dict | None = None
        self.history: list[EpochResult] = []

    # -- one step -------------------------------------------------------------------
    def losses(self, batch: Batch) -> dict[str, torch.Tensor]:
        cfg, dev = self.loss, self.device
        k = cfg.top_k if self.epoch >= cfg.warmup_epochs else self.optim.batch_images * 64  # warm-up: all negatives
        text = self.data.text_batch(batch.captions, batch.groups).to(dev)
        encoded = self.model.encode_text(text, joint=self.mode == "joint")
        sentence_image = batch.sentence_image.to(dev, non_blocking=True)
        pairs = tuple(t.to(dev, non_blocking=True) for t in batch.same_image_pairs)
        parts: dict[str, torch.Tensor] = {}
        # Without a MULE layer (PARALLEL-EmbN, EmbN) there is no MULE-layer NC and no LC.
        mule = F.normalize(encoded.mule, dim=-1) if encoded.mule is not None else None
        if self.mode == "lp":
            parts["nc_mule"] = self._neighborhood_loss(mule, sentence_image, pairs, cfg.margin, k)
        else:
            images = self.model.encode_image(self.features[batch.images.to(dev, non_blocking=True)])
            parts["match"] = cfg.match_weight * self._image_sentence_loss(
                images, encoded.joint, sentence_image, cfg.margin, k
            )
            if cfg.nc:
                if mule is not None:
                    parts["nc_mule"] = cfg.nc_weight * self._neighborhood_loss(
                        mule, sentence_image, pairs, cfg.margin, k
                    )
                parts["nc_joint"] = cfg.nc_weight * self._neighborhood_loss(
                    encoded.joint, sentence_image, pairs, cfg.margin, k
                )
        if cfg.lc and mule is not None and len(batch.groups) > 1:
            logits = self.model.classify_language(encoded.mule)
            language = batch.sentence_lang.to(dev, non_blocking=True)
            parts["lc"] = cfg.lc_weight * language_classifier_loss(logits, language)
            parts["lc_accuracy"] = (logits.argmax(1) == language).float().mean().detach()
        if cfg.word_l2 > 0 and any(b.embed.weight.requires_grad for b in self.model.branches.values()):
            parts["word_l2"] = cfg.word_l2 * self.model.word_drift()
        return parts

    # -- epochs ---------------------------------------------------------------------
    def _train_mode(self) -> None:
        """Training mode, except that a frozen BatchNorm keeps its statistics: adding a
        language to a trained model must leave the image branch exactly as it was."""
        self.model.train()
        for module in self.model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and not any(
                p.requires_grad for p in module.parameters()
            ):
                module.eval()

    def run_epoch(self) -> EpochResult:
        self._train_mode()
        epoch = self.epoch + 1
        sums: dict[str, float] = {}
        steps = 0
        sentences = 0
        started = time.perf_counter()
        progress = Progress(
            f"{self.mode} epoch {epoch}/{self.optim.epochs}", len(self.sampler), unit="batches", logger=log
        )
        for batch in self.sampler.batches(epoch):
            with torch.autocast("cuda", dtype=torch.float16, enabled=self.amp):
                parts = self.losses(batch)
                total = sum(v for k, v in parts.items() if k != "lc_accuracy")
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(total).backward()
            if self.optim.grad_clip > 0:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim.grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            parts["total"] = total
            for key, value in parts.items():  # summed on the device: no host sync per step
                sums[key] = sums.get(key, 0.0) + value.detach().float()
            steps += 1
            sentences += len(batch.captions)
            progress.update(1)
        self.scheduler.step()
        seconds = time.perf_counter() - started
        result = EpochResult(
            epoch, {k: float(v) / max(steps, 1) for k, v in sums.items()}, seconds, sentences / seconds
        )
        if self.validate is not None:
            result.score, result.validation = self.validate(self.model)
            if result.score > self.best_score:
                result.is_best = True
                self.best_score, self.best_epoch = result.score, epoch
                self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        self.epoch = epoch
        self.history.append(result)
        return result

    def fit(self, on_epoch_end: Callable[[EpochResult], None] | None = None) -> list[EpochResult]:
        started, first_epoch = time.perf_counter(), self.epoch
        while self.epoch < self.optim.epochs:
            result = self.run_epoch()
            per_epoch = (time.perf_counter() - started) / (self.epoch - first_epoch)  # validation included
            eta = format_seconds(per_epoch * (self.optim.epochs - self.epoch))
            losses = ", ".join(f"{k} {v:.4f}" for k, v in result.losses.items())
            score = "" if result.score is None else f"; val {result.score:.2f}{' (best)' if result.is_best else ''}"
            log.info("%s epoch %d/%d: %s; %.0f sentences/s%s; ETA %s", self.mode, result.epoch, self.optim.epochs,
                     losses, result.sentences_per_second, score, eta)  # fmt: skip
            if on_epoch_end is not None:
                on_epoch_end(result)
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)
        return self.history

    # -- checkpoints ----------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": self.epoch,
            "best_score": self.best_score,
            "best_epoch": self.best_epoch,
            "best_state": self.best_state,
            "history": [vars(r) for r in self.history],
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.epoch = state["epoch"]
        self.best_score, self.best_epoch, self.best_state = (
            state["best_score"],
            state["best_epoch"],
            state["best_state"],
        )
        self.history = [EpochResult(**r) for r in state["history"]]


# -- encoding and evaluation ----------------------------------------------------------
@torch.no_grad()
def encode_split(
    model: MuleModel, data: SplitTensors, device: torch.device, batch_size: int = 1024, joint: bool = True
) -> dict[str, torch.Tensor]:
    """Embeddings of every caption (MULE and multimodal) and every image of a split."""
    model.eval().to(device)
    mule_parts, joint_parts, order = [], [], []
    for index, lang in enumerate(data.languages):
        rows = np.nonzero(data.caption_lang == index)[0]
        for start in range(0, len(rows), batch_size):
            chunk = torch.from_numpy(rows[start : start + batch_size])
            encoded = model.encode_text(data.text_batch(chunk, [(lang, 0, len(chunk))]).to(device), joint=joint)
            if encoded.mule is not None:  # models without a MULE layer have none
                mule_parts.append(encoded.mule)
            if joint:
                joint_parts.append(encoded.joint)
            order.append(chunk)
    inverse = torch.argsort(torch.cat(order)).to(device)  # back to caption-row order
    out = {"caption_mule": torch.cat(mule_parts)[inverse]} if mule_parts else {}
    if joint:
        out["caption_joint"] = torch.cat(joint_parts)[inverse]
    if joint and data.features is not None and model.image_branch is not None:
        feats = data.features
        out["image"] = torch.cat(
            [model.encode_image(feats[s : s + batch_size].to(device)) for s in range(0, len(feats), batch_size)]
        )
    return out


def evaluate_split(model: MuleModel, data: SplitTensors, device: torch.device, ks=(1, 5, 10)) -> dict:
    """Per-language recall table (see metrics.per_language_recalls)."""
    encoded = encode_split(model, data, device)
    return per_language_recalls(
        encoded["image"],
        encoded["caption_joint"],
        torch.from_numpy(data.caption_image).to(device),
        torch.from_numpy(data.caption_lang).to(device),
        data.languages,
        ks,
    )
