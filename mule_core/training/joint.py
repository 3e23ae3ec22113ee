"""Joint training: images and sentences into one space (the paper's section 3.2). Its
losses: the image-sentence triplet loss, + NC at the MULE and the joint layer (+ LC, which
the shared loop adds); its settings: the `train` and `loss` sections, with the learning
rate's warm-up and step-counted decay and the weight average."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from mule.mule_core.batching import Batch
from mule.mule_core.model import MuleModel, TextEncoding
from mule.mule_core.split_tensors import SplitTensors
from mule.mule_core.training.loop import Trainer
from mule.mule_core.training.records import Constraints, Schedule, sentences_per_image

if TYPE_CHECKING:
    from mule.mule_core.settings import LossConfig, TrainConfig


class JointTrainer(Trainer):
    """The triplet loss between images and sentences (+ NC at both layers, + LC) for
    train.epochs at train.lr, every parameter that requires a gradient trained."""

    kind = "joint"
    joint_text = True

    def __init__(self, model: MuleModel, data: SplitTensors, loss: LossConfig, train: TrainConfig,
                 device: torch.device, *, validate: Callable[[MuleModel], tuple[float, dict]] | None = None):  # fmt: skip
        if data.features is None:
            raise ValueError("joint training needs image features; this split has none")
        schedule = Schedule(
            epochs=train.epochs, lr=train.lr, batch_images=train.batch_images, lr_decay=train.lr_decay,
            decay_steps=train.decay_steps, warmup_steps=train.warmup_steps,
            mining_warmup_steps=loss.mining_warmup_steps, margin=loss.margin, ema=train.ema,
            patience=train.patience, sentences_per_image=sentences_per_image(train, data),
        )  # fmt: skip
        super().__init__(model, data, loss, train, device, schedule, validate)
        self.features = data.features.to(device)

    def trained_parameters(self) -> Iterable[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def objective(self, batch: Batch, encoded: TextEncoding, mule: torch.Tensor | None,
                  c: Constraints) -> dict[str, torch.Tensor]:  # fmt: skip
        cfg = self.loss
        images = self.model.encode_image(self.features[batch.images.to(self.device, non_blocking=True)])
        match = self._image_sentence_loss(images, encoded.joint, c.sentence_image, c.margin, c.k, c.same_text)
        parts = {"match": cfg.match_weight * match}
        if cfg.nc:
            if mule is not None:
                parts["nc_mule"] = cfg.nc_weight * self._nc(mule, c)
            parts["nc_joint"] = cfg.nc_weight * self._nc(encoded.joint, c)
        return parts
