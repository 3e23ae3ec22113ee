"""One typed configuration for the whole pipeline, with named presets.

The model and training sections are the model library's (mule_core/config.py: model,
loss, train, pretrain, and the parts of text and features that using a model needs); the
sections only the pipeline reads are here (data, the text stage's word vectors, the
features stage's runner, eval, index, translate, ablation), each option keeping its name.

    cfg = resolve("demo", {"train.epochs": 3, "loss.lc": "false"})
    cfg = resolve(None, {"data.dataset": "multi30k"})  # the dataset's preset: here "default"

Every option has a dotted name (section.field). Overrides come from the CLI
(`--set train.epochs=3`) or from flow parameters (a dict); strings are converted to
the field's type, and an unknown name is an error that lists the valid ones.
`flatten(cfg)` is what MLflow records as the run's params.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mule.mule_core import config as model_settings
from mule.mule_core.config import ConfigError, LossConfig, ModelConfig, PretrainConfig, TrainConfig, flatten  # noqa: F401 - the pipeline's names
from mule.mule_core.languages import language_code, tokenizer_name


@dataclass
class DataConfig:
    dataset: str = "embedded"  # catalog name; "embedded" is generated when no source is given
    # layout of the raw files: multi30k (the official repository), coco (COCO + YJ/STAIR +
    # COCO-CN), or table (an image folder and one captions table; inferred when --source holds
    # metadata.jsonl/.csv/.parquet or captions.csv/.tsv/.jsonl/.parquet: data_catalog/readers/table.py)
    format: str = "multi30k"
    source: str = ""  # raw dataset folder; empty: <workdir>/raw/embedded for the embedded dataset
    images: str = ""  # image folder; empty: <source>/images
    dictionaries: str = ""  # MUSE bilingual lexicons (en-<lang>.txt); empty: <source>/dictionaries
    languages: tuple[str, ...] = ("en", "de", "fr", "cs")
    strict: bool = False  # every bad line or image (a reject) stops the run instead
    # Training captions: "human", "human+mt" (plus the translate stage's), or "mt" (the
    # non-English human captions replaced by translations of the English ones, as in the paper)
    captions: str = "human"
    max_caption_bytes: int = 2000  # longer caption lines are rejected (the longest in Multi30K: ~400)
    # COCO: val_images / test_images drawn (split_seed) from the images with captions in every
    # language ("trilingual", the paper), or COCO-CN's official split, or Karpathy's
    coco_split: str = "trilingual"
    split_seed: int = 0
    # The table layout: its file (relative to the source; empty: found there), the columns
    # by role when their names are not the usual ones (image=photo,caption=text,lang=language,
    # split=fold, or caption_es=beschreibung for a wide table), the file's text encoding, and
    # the shares of images drawn (by split_seed, per image: stable when rows are added) for
    # val and test when the table has no split column
    table: str = ""
    columns: dict[str, str] = field(default_factory=dict)
    encoding: str = "utf-8"
    val_share: float = 0.1
    test_share: float = 0.1
    japanese: str = "all"  # COCO: which Japanese files to read when both are there: all, yj or stair
    # Embedded datasets' sizes (for COCO, val_images and test_images are the split's sizes)
    train_images: int = 3000
    val_images: int = 500
    test_images: int = 1000
    seed: int = 0
    image_size: int = 128


@dataclass
class FeaturesConfig(model_settings.ExtractorConfig):
    """The extractor's setting (mule_core) and how the features stage runs it."""

    engine: str = "auto"  # "torch", "onnxruntime" (CPU), or "auto": onnxruntime on the CPU when installed
    batch_size: int = 0  # images per forward pass; 0: chosen from the device, input size and crops
    loader_workers: int = -1  # decoding threads; -1: one per spare core beside a GPU, none on the CPU
    shard_images: int = 2048  # images per Parquet part; a rerun resumes after the last part
    runner: str = "inprocess"  # "inprocess" (shard after shard) or "dask" (shards over Dask workers)
    dask_address: str = ""  # an existing scheduler (tcp://host:8786); "" starts a LocalCluster
    dask_workers: int = 0  # LocalCluster workers; 0: one per GPU, else 2 (or 1 on a single core)
    device: str = "auto"


@dataclass
class TextConfig(model_settings.TextConfig):
    """The sentence's length and dimension (mule_core), and where the text stage gets word vectors."""

    vectors: dict[str, str] = field(default_factory=dict)  # lang -> .bin/.vec file; the others start from `init`
    # Where the other languages' word vectors come from: "fasttext" (trained on the training
    # captions, one language at a time) or "multilingual-e5" (each vocabulary word through
    # the bundled multilingual-e5-small, every language projected by one shared PCA to
    # word_dim: aligned across languages from the start; needs the e5 extra,
    # tasks/support/multilingual_encoder.py)
    init: str = "fasttext"
    fasttext_model: str = "skipgram"
    # fastText's own default. LP and joint training fine-tune the vectors: on the real
    # Multi30K text LP's validation R@1 over three seeds is 20 epochs' (the text stage
    # 1.9 min instead of 7), the demo's too (docs/training-at-scale.md, "fastText's epochs")
    fasttext_epochs: int = 5
    fasttext_min_count: int = 1
    # 1 keeps trained vectors reproducible; on several threads fastText trains other vectors on
    # every run (its updates race), so the count is part of the text stage's key
    fasttext_threads: int = 1


@dataclass
class EvalConfig:
    # What the evaluate stage measures: a split name (test_2016), a role (test, val), several
    # separated by commas, or "tests" (every test split the dataset has); the first is the
    # headline (the recall table, the registry's tags). Metrics carry the split's name.
    split: str = "test"
    ks: tuple[int, ...] = (1, 5, 10)
    examples: int = 3  # queries per language in the retrieved-images figure


@dataclass
class IndexConfig:
    """The gallery's approximate index (the index stage; mule serve searches it past min_images)."""

    kind: str = "hnsw-sq8"  # hnsw-sq8 | ivf-sq8 (FAISS, one byte a dimension; data_catalog/ann.py) | flat (exact)
    cells: int = 0  # ivf-sq8's k-means cells; 0: about 4 sqrt(images)
    # Serving options, given to `mule serve --set ...` (never read from a trained model's config):
    breadth: int = 0  # search breadth (HNSW efSearch, IVF nprobe); 0: the kind's default (128, cells / 32)
    min_images: int = 100_000  # below this, mule serve scans every vector exactly (8 ms at 100k, 128-d)


@dataclass
class TranslateConfig:
    backend: str = "lexicon"  # lexicon (MUSE files), induced (IBM Model 1 on task1), googletrans, argos
    # "src-dest" pairs; empty: English into every other language and every other language into English
    pairs: tuple[str, ...] = ()
    splits: tuple[str, ...] = ("train", "val")  # test captions are never translated into training data
    concurrency: int = 4  # googletrans: requests in flight
    timeout_s: float = 10.0  # googletrans: per request
    retries: int = 5  # googletrans: per sentence, with exponential backoff and jitter
    induced_iterations: int = 5  # IBM Model 1 EM iterations


@dataclass
class AblationConfig:
    seeds: int = 1  # train every row with this many seeds (train.seed, +1, ...); the table shows mean and std


@dataclass
class MuleConfig:
    preset: str = "default"
    data: DataConfig = field(default_factory=DataConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    text: TextConfig = field(default_factory=TextConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    translate: TranslateConfig = field(default_factory=TranslateConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)


SECTIONS = tuple(f.name for f in dataclasses.fields(MuleConfig) if f.name != "preset")

# Presets are overrides on the defaults. "default" is the defaults themselves, chosen on the
# real Multi30K text's validation split (docs/training-at-scale.md); a run that names no
# preset gets "demo" on the generated Multi30K-style dataset and "default" on any other
# (default_preset).
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    # The generated dataset's (its languages have 65 to 131 words): LP in batches of 64
    # images for 4 epochs instead of 256 for 10 (LP 7 s instead of 39 s there), and a
    # 64-d LSTM (joint training a fifth faster); validation over three seeds is higher
    # than the defaults' (docs/training-at-scale.md, "The demo preset"). Joint training in
    # batches of 128 images, its step-counted schedules (mining warm-up, the adversary's
    # ramp, LP's too, and the weight average) halved to stay the same in epochs: a tenth faster, the
    # same validation over three seeds. The real text and the 29k figures keep the defaults.
    "demo": {"pretrain.batch_images": 64, "pretrain.epochs": 4, "model.lstm_dim": 64,
             "train.batch_images": 128, "loss.mining_warmup_steps": 75, "loss.lc_ramp_steps": 1000, "train.ema": 0.98},
    # Few photographs beside much text (all of a dataset's captions, part of its photos):
    # ten crops of each photo instead of one, and 24 joint epochs instead of 16. On the 872
    # real Multi30K training photos, three folds x three seeds, held-out folds: 10 crops
    # +1.5 ± 0.7 mR after 16 epochs, and 24 epochs +2.2 ± 0.1 more (+3.7 ± 0.7 in all,
    # every seed); the features stage costs 10x (109 s for 937 photos here), training
    # half as long again. EfficientNet-Lite1 and -Lite2 did not gain (docs/real-photos.md).
    "few-photos": {"features.crops": 10, "train.epochs": 24},
    "paper": {
        "features.arch": "resnet152",
        "features.weights": "imagenet",
        "features.input_size": 448,
        "features.resize": 512,
        "features.crops": 10,
        "text.word_dim": 300,
        "text.fasttext_threads": 8,
        "model.mule_dim": 512,
        "model.lstm_dim": 1024,
        "model.joint_dim": 512,
        "model.image_hidden": 2048,
        "model.subwords": False,  # the paper fine-tunes one vector per word
        "loss.top_k": 10,
        "loss.lc_weight": 1e-6,
        "train.epochs": 20,
        "train.batch_images": 450,
        "train.sentences_per_image_many": 2,
        "train.lr_decay": 0.9,
        "pretrain.epochs": 10,
        "pretrain.batch_images": 450,
        # Departures from the paper, chosen on validation at 29,000 images: with its margin
        # 0.05, learning rates 1e-4 (words too) and mining after 100 steps, LP stays at chance
        # (every MULE vector one point) and joint training at val mR 6.6 after 20 epochs here
        # (docs/training-at-scale.md). These learn: val mR 77.4 after 20 epochs.
        "loss.margin": 0.2,
        "train.lr": 1e-3,
        "train.warmup_steps": 200,
        "train.word_lr_scale": 10.0,
        "loss.mining_warmup_steps": 500,
        "pretrain.mining_warmup_steps": 500,
        "pretrain.margin": 0.2,
        "pretrain.sentences_per_image_many": 2,  # the paper's batches
        "pretrain.lr": 1e-3,
        "pretrain.ema": 0.0,  # LP as measured at 29,000 images (the last weights)
    },
}


# A dataset name implies its reader, languages and sampling unless they are set: the
# COCO family is English, Japanese and Chinese, unbalanced (the paper samples by language group).
_COCO = {"data.format": "coco", "data.languages": ("en", "ja", "zh"), "train.balance_language_groups": True}
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "coco": {**_COCO, "data.val_images": 1000, "data.test_images": 1000},
    # the generated COCO-style dataset: 5000 images, val and test drawn from its trilingual ones
    "embedded-coco": {**_COCO, "data.train_images": 4500, "data.val_images": 200, "data.test_images": 300},
    # the generated table layout: English and Spanish, a language outside the published datasets'
    "embedded-table": {"data.format": "table", "data.languages": ("en", "es")},
}


class UndeclaredSectionError(RuntimeError):
    """A stage's computation read a config section its declaration does not name: a bug,
    since the option would not be part of the stage's key."""


class Undeclared:
    """Stands in a stage's config for each section the stage does not declare."""

    def __init__(self, stage: str, section: str):
        object.__setattr__(self, "_where", (stage, section))

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        stage, section = object.__getattribute__(self, "_where")
        raise UndeclaredSectionError(
            f"stage {stage} read {section}.{name}, and its declaration (pipeline/declaration.py) names no "
            f"{section} option: declare what it reads, so that the stage's key holds it"
        )

    def __deepcopy__(self, memo):
        return self

    def __repr__(self) -> str:
        stage, section = object.__getattribute__(self, "_where")
        return f"<{section}: not declared by stage {stage}>"


def declared_sections(cfg: MuleConfig, stage: str, sections: frozenset[str]) -> MuleConfig:
    """`cfg` as a stage's computation gets it: the sections it declares, and in place of
    every other an object that fails loudly when read."""
    return dataclasses.replace(cfg, **{name: Undeclared(stage, name) for name in SECTIONS if name not in sections})


def _field_types(section_cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(section_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(section_cls)}


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Converts a CLI string (or a JSON value from a flow parameter) to the field's type."""
    origin = typing.get_origin(annotation)
    try:
        if annotation is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"expected true or false, got {value!r}")
        if annotation is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(f"expected an integer, got {value!r}")
            return int(value)
        if annotation is float:
            return float(value)
        if annotation is str:
            return str(value)
        if origin is tuple:
            (item_type, _) = typing.get_args(annotation)
            items = value if isinstance(value, (list, tuple)) else [v for v in str(value).split(",") if v.strip()]
            return tuple(_coerce(v.strip() if isinstance(v, str) else v, item_type, key) for v in items)
        if origin is dict:
            _, value_type = typing.get_args(annotation)
            if isinstance(value, dict):
                pairs = value.items()
            else:
                pairs = []
                for part in (p for p in str(value).split(",") if p.strip()):
                    if "=" not in part:
                        raise ValueError(f"expected lang=value pairs separated by commas, got {part!r}")
                    k, v = part.split("=", 1)
                    pairs.append((k.strip(), v.strip()))
            return {str(k): _coerce(v, value_type, key) for k, v in pairs}
    except (TypeError, ValueError) as error:
        raise ConfigError(f"config option {key}: {error}") from None
    raise ConfigError(f"config option {key}: unsupported type {annotation}")  # pragma: no cover


def option_names() -> list[str]:
    return [f"{s}.{name}" for s in SECTIONS for name in _field_types(type(getattr(MuleConfig(), s)))]


def apply_overrides(cfg: MuleConfig, overrides: dict[str, Any] | None) -> MuleConfig:
    cfg = dataclasses.replace(cfg, **{s: dataclasses.replace(getattr(cfg, s)) for s in SECTIONS})
    for key, value in (overrides or {}).items():
        section, _, name = key.partition(".")
        if section not in SECTIONS or not name:
            raise ConfigError(f"unknown config option {key!r}; options are: {', '.join(option_names())}")
        section_obj = getattr(cfg, section)
        types_ = _field_types(type(section_obj))
        if name not in types_:
            raise ConfigError(f"unknown config option {key!r}; options are: {', '.join(option_names())}")
        setattr(section_obj, name, _coerce(value, types_[name], key))
    validate(cfg)
    return cfg


def default_preset(dataset: str) -> str:
    """The preset of a run that names none: "demo" for the generated Multi30K-style
    dataset (what `mule demo` makes, at any size), "default" for every other."""
    return "demo" if dataset == "embedded" else "default"


def resolve(preset: str | None = None, overrides: dict[str, Any] | None = None) -> MuleConfig:
    """The config of a preset (None: default_preset of the dataset) with these overrides."""
    if preset is None:
        preset = default_preset(str((overrides or {}).get("data.dataset", DataConfig.dataset)))
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; presets are: {', '.join(PRESETS)}")
    cfg = apply_overrides(MuleConfig(preset=preset), PRESETS[preset])
    dataset = str((overrides or {}).get("data.dataset", cfg.data.dataset))
    implied = {k: v for k, v in DATASET_DEFAULTS.get(dataset, {}).items() if k not in (overrides or {})}
    source = (overrides or {}).get("data.source")
    if source and "data.format" not in (overrides or {}) and "data.format" not in implied:
        from mule.data_catalog.sources import table_in

        if table_in(Path(str(source)).expanduser(), str((overrides or {}).get("data.table", ""))):
            implied["data.format"] = "table"  # a folder with a captions table is the table layout
    return apply_overrides(apply_overrides(cfg, implied), overrides)


def parse_assignments(assignments: list[str]) -> dict[str, str]:
    """['train.epochs=3', ...] from the CLI -> {'train.epochs': '3'}."""
    out = {}
    for item in assignments:
        if "=" not in item:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = value
    return out


def validate(cfg: MuleConfig) -> None:
    if cfg.index.kind not in ("hnsw-sq8", "ivf-sq8", "flat"):
        raise ConfigError(f"index.kind must be 'hnsw-sq8', 'ivf-sq8' or 'flat', got {cfg.index.kind!r}")
    if min(cfg.index.cells, cfg.index.breadth, cfg.index.min_images) < 0:
        raise ConfigError("index.cells, index.breadth and index.min_images must not be negative")
    f = cfg.features
    if f.weights not in ("imagenet", "random"):
        raise ConfigError(f"features.weights must be 'imagenet' or 'random', got {f.weights!r}")
    if f.crops not in (1, 5, 10):
        raise ConfigError(f"features.crops must be 1, 5 or 10, got {f.crops}")
    backbones = [f"resnet{d}" for d in (18, 34, 50, 101, 152)] + [f"efficientnet_lite{v}" for v in (0, 1, 2)]
    if f.arch not in backbones:
        raise ConfigError(f"features.arch must be one of {', '.join(backbones)}, got {f.arch!r}")
    if f.engine not in ("auto", "torch", "onnxruntime"):
        raise ConfigError(f"features.engine must be 'auto', 'torch' or 'onnxruntime', got {f.engine!r}")
    if f.runner not in ("inprocess", "dask"):
        raise ConfigError(f"features.runner must be 'inprocess' or 'dask', got {f.runner!r}")
    if f.pool not in ("avg", "avg+grid"):
        raise ConfigError(f"features.pool must be 'avg' or 'avg+grid', got {f.pool!r}")
    if f.resize and f.resize < f.input_size:
        raise ConfigError(f"features.resize ({f.resize}) must be at least features.input_size ({f.input_size})")
    if cfg.text.init not in ("fasttext", "multilingual-e5"):
        raise ConfigError(f"text.init must be 'fasttext' or 'multilingual-e5', got {cfg.text.init!r}")
    if cfg.model.subwords and (not cfg.model.ngram_lengths or min(cfg.model.ngram_lengths) < 1):
        raise ConfigError(f"model.ngram_lengths must be positive lengths (e.g. 3,4,5), got {cfg.model.ngram_lengths}")
    if cfg.model.sharing not in ("mule", "parallel"):
        raise ConfigError(f"model.sharing must be 'mule' or 'parallel', got {cfg.model.sharing!r}")
    d = cfg.data
    if d.format not in ("multi30k", "coco", "table"):
        raise ConfigError(f"data.format must be 'multi30k', 'coco' or 'table', got {d.format!r}")
    if d.val_share < 0 or d.test_share < 0 or d.val_share + d.test_share >= 1:
        raise ConfigError(f"data.val_share and data.test_share must be shares that leave images to train, "
                          f"got {d.val_share} and {d.test_share}")  # fmt: skip
    import codecs

    try:
        codecs.lookup(d.encoding)
    except LookupError:
        raise ConfigError(f"data.encoding: {d.encoding!r} is not a text encoding Python knows (e.g. utf-8, cp1252, latin-1)") from None
    if not d.languages:
        raise ConfigError("data.languages must name at least one language")
    for lang in d.languages:
        try:
            code = language_code(lang)
        except ValueError as error:
            raise ConfigError(f"data.languages: {error}") from None
        if code != lang:
            raise ConfigError(f"data.languages: write {lang!r} as {code!r}")
    for lang in cfg.text.tokenizers:
        try:
            tokenizer_name(lang, cfg.text.tokenizers)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    if d.coco_split not in ("trilingual", "coco-cn", "karpathy"):
        raise ConfigError(f"data.coco_split must be 'trilingual', 'coco-cn' or 'karpathy', got {d.coco_split!r}")
    if d.japanese not in ("all", "yj", "stair"):
        raise ConfigError(f"data.japanese must be 'all', 'yj' or 'stair', got {d.japanese!r}")
    if cfg.data.captions not in ("human", "human+mt", "mt"):
        raise ConfigError(f"data.captions must be 'human', 'human+mt' or 'mt', got {cfg.data.captions!r}")
    t = cfg.translate
    if t.backend not in ("lexicon", "induced", "googletrans", "argos"):
        raise ConfigError(f"translate.backend must be lexicon, induced, googletrans or argos, got {t.backend!r}")
    for pair in t.pairs:
        if pair.count("-") != 1 or pair.split("-")[0] == pair.split("-")[1]:
            raise ConfigError(f"translate.pairs: {pair!r} is not 'src-dest' (e.g. en-de)")
    if any(s.startswith("test") for s in t.splits):
        raise ConfigError("translate.splits: test captions are never translated into training data")
    for key, value in (
        ("loss.top_k", cfg.loss.top_k),
        ("train.epochs", cfg.train.epochs),
        ("train.batch_images", cfg.train.batch_images),
        ("text.word_dim", cfg.text.word_dim),
        ("ablation.seeds", cfg.ablation.seeds),
    ):
        if value < 1:
            raise ConfigError(f"{key} must be at least 1, got {value}")
    if cfg.train.add_language and cfg.train.add_language not in cfg.data.languages:
        raise ConfigError(
            f"train.add_language={cfg.train.add_language!r} is not in data.languages {list(cfg.data.languages)}"
        )
    if cfg.train.add_language and cfg.model.sharing != "mule":
        raise ConfigError(
            "train.add_language needs model.sharing=mule: a language is added through its own MULE branch"
        )
    tr = cfg.train
    if tr.divergence not in ("rollback", "stop", "warn", "off"):
        raise ConfigError(f"train.divergence must be rollback, stop, warn or off, got {tr.divergence!r}")
    if not 0 < tr.divergence_drop < 1:
        raise ConfigError(f"train.divergence_drop must be between 0 and 1, got {tr.divergence_drop}")
    for key, value in (("train.ema", tr.ema), ("pretrain.ema", cfg.pretrain.ema)):
        if not 0 <= value < 1:
            raise ConfigError(f"{key} must be in [0, 1), got {value}")
    for key, value in (("train.lr_decay", tr.lr_decay), ("pretrain.lr_decay", cfg.pretrain.lr_decay)):
        if not 0 < value <= 1:
            raise ConfigError(f"{key} must be in (0, 1], got {value}")
    if not 0 < tr.divergence_lr_factor <= 1:
        raise ConfigError(f"train.divergence_lr_factor must be in (0, 1], got {tr.divergence_lr_factor}")
    for key, value in (("train.warmup_steps", tr.warmup_steps), ("train.decay_steps", tr.decay_steps),
                       ("loss.mining_warmup_steps", cfg.loss.mining_warmup_steps),
                       ("pretrain.mining_warmup_steps", cfg.pretrain.mining_warmup_steps),
                       ("train.divergence_retries", tr.divergence_retries), ("train.threads", tr.threads),
                       ("loss.lc_ramp_steps", cfg.loss.lc_ramp_steps)):  # fmt: skip
        if value < 0:
            raise ConfigError(f"{key} must be at least 0, got {value}")
    for key, value in (("loss.margin", cfg.loss.margin), ("pretrain.margin", cfg.pretrain.margin)):
        if not 0 < value < 2:  # cosine similarities: a margin of 2 or more is never met
            raise ConfigError(f"{key} must be in (0, 2), got {value}")
    for key, value in (("train.sentences_per_image_many", tr.sentences_per_image_many),
                       ("pretrain.sentences_per_image_many", cfg.pretrain.sentences_per_image_many)):  # fmt: skip
        if value < 1:
            raise ConfigError(f"{key} must be at least 1, got {value}")
    for lang, n in cfg.train.sentences_per_image.items():
        if n < 1:
            raise ConfigError(f"train.sentences_per_image.{lang} must be at least 1, got {n}")


def to_dict(cfg: MuleConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


# Options that existed once. Model files keep the config they were trained with, so these
# are dropped when such a file is read: they only steered training, never how a model is used.
RETIRED_OPTIONS = {
    "loss.warmup_epochs",  # now loss.mining_warmup_steps (schedules count steps: one config for every size)
    "train.reuse",  # a model is reused when the train stage's key is unchanged (pipeline.reuse), never by a flag
}


# Options added later whose default changed what a model is: a stored config without them
# was trained as this value says, whatever today's default (mule_core.config.INTRODUCED).
INTRODUCED_OPTIONS = {f"{section}.{name}": value for section, options in model_settings.INTRODUCED.items()
                      for name, value in options.items()}  # fmt: skip


def from_dict(data: dict[str, Any]) -> MuleConfig:
    """Inverse of to_dict (for configs stored next to models)."""
    preset = data.get("preset", "default")  # a label: the sections hold every value
    overrides = {f"{s}.{k}": v for s in SECTIONS for k, v in data.get(s, {}).items()}
    overrides = {**INTRODUCED_OPTIONS, **overrides}
    overrides = {k: v for k, v in overrides.items() if k not in RETIRED_OPTIONS}
    return apply_overrides(MuleConfig(preset=preset), overrides)
