"""Language pretraining (LP): the MULE layers alone learn to put sentences of one image close,
across languages, before any image is seen (the paper's section 3.3). Its losses: NC at the
MULE layer (+ LC, which the shared loop adds); its settings: the `pretrain` section."""

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
    from mule.mule_core.settings import LossConfig, PretrainConfig, TrainConfig


class LPTrainer(Trainer):
    """NC at the MULE layer (+ LC) for pretrain.epochs at pretrain.lr in batches of
    pretrain.batch_images, mining after pretrain.mining_warmup_steps, decaying by
    pretrain.lr_decay each epoch, with no warm-up; the shared encoder and image branch are
    not trained (they keep their weights to the bit)."""

    kind = "lp"
    joint_text = False

    def __init__(self, model: MuleModel, data: SplitTensors, loss: LossConfig, train: TrainConfig,
                 device: torch.device, *, pretrain: PretrainConfig,
                 validate: Callable[[MuleModel], tuple[float, dict]] | None = None):  # fmt: skip
        if not model.has_mule:
            raise ValueError("LP pretrains the MULE layer; this model has none (model.sharing=parallel)")
        schedule = Schedule(
            epochs=pretrain.epochs, lr=pretrain.lr, batch_images=pretrain.batch_images, lr_decay=pretrain.lr_decay,
            decay_steps=0, warmup_steps=0, mining_warmup_steps=pretrain.mining_warmup_steps, margin=pretrain.margin,
            ema=pretrain.ema, patience=pretrain.patience, sentences_per_image=sentences_per_image(train, data, pretrain),
        )  # fmt: skip
        super().__init__(model, data, loss, train, device, schedule, validate)

    def trained_parameters(self) -> Iterable[torch.nn.Parameter]:
        return self.model.mule_parameters()

    def objective(self, batch: Batch, encoded: TextEncoding, mule: torch.Tensor | None,
                  c: Constraints) -> dict[str, torch.Tensor]:  # fmt: skip
        return {"nc_mule": self._nc(mule, c)}
