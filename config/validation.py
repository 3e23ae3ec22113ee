"""Whether a resolved config makes sense: every option in its range, names that exist."""

from __future__ import annotations

from mule.config.sections import IndexConfig, MuleConfig, caption_file
from mule.datasets.formats import FORMATS
from mule.mule_core.languages import language_code, language_pair, tokenizer_name
from mule.mule_core.settings import TABLE_PRECISIONS, ConfigError
from mule.storage.workdir import MODEL_FOLDERS, BadNameError, check_name


def validate(cfg: MuleConfig) -> None:
    """Raises ConfigError, naming the option, at the first option out of its range; each
    section's checks are a function below."""
    validate_index(cfg.index)
    _names(cfg)
    _features_text_and_model(cfg)
    _data(cfg)
    _translate(cfg)
    _counts(cfg)
    _add(cfg)
    _train(cfg)


def _names(cfg: MuleConfig) -> None:
    """Names that become paths inside the workdir."""
    try:
        check_name(cfg.data.dataset, "data.dataset")
        check_name(cfg.output.model_name, "output.model_name", MODEL_FOLDERS)
        if cfg.add.base_model:
            check_name(cfg.add.base_model, "add.base_model", MODEL_FOLDERS)
    except BadNameError as error:
        raise ConfigError(str(error)) from None
    if cfg.output.tables not in TABLE_PRECISIONS:
        raise ConfigError(f"output.tables must be one of {', '.join(TABLE_PRECISIONS)}, got {cfg.output.tables!r}")


def _features_text_and_model(cfg: MuleConfig) -> None:
    """The image features, the word vectors and the model's shape."""
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
    if cfg.vectors.init not in ("fasttext", "multilingual-e5"):
        raise ConfigError(f"vectors.init must be 'fasttext' or 'multilingual-e5', got {cfg.vectors.init!r}")
    if cfg.vectors.fasttext_buckets < 1:  # fastText takes an n-gram's row modulo the count
        raise ConfigError(f"vectors.fasttext_buckets must be at least 1, got {cfg.vectors.fasttext_buckets}")
    if cfg.model.subwords and (not cfg.model.ngram_lengths or min(cfg.model.ngram_lengths) < 1):
        raise ConfigError(f"model.ngram_lengths must be positive lengths (e.g. 3,4,5), got {cfg.model.ngram_lengths}")
    for name, value in (("train.patience", cfg.train.patience), ("pretrain.patience", cfg.pretrain.patience)):
        if value < 0:
            raise ConfigError(f"{name} must be 0 (run every epoch) or a number of epochs, got {value}")
    if cfg.model.sharing not in ("mule", "parallel"):
        raise ConfigError(f"model.sharing must be 'mule' or 'parallel', got {cfg.model.sharing!r}")


def _data(cfg: MuleConfig) -> None:
    """The dataset: its format, splits, encoding, languages and tokenizers."""
    d = cfg.data
    if d.format not in FORMATS:
        raise ConfigError(f"data.format must be one of {', '.join(FORMATS)} (datasets/formats.py), got {d.format!r}")
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


def _translate(cfg: MuleConfig) -> None:
    """Machine translation."""
    d = cfg.data
    t = cfg.translate
    if t.backend not in ("lexicon", "induced", "auto", "aligned", "googletrans", "argos"):
        raise ConfigError(f"translate.backend must be lexicon, induced, auto, aligned, googletrans or argos, got {t.backend!r}")
    for pair in t.pairs:  # read as languages are everywhere: a region or script is kept (en-pt-BR)
        try:
            source, target = language_pair(pair, ("en", *d.languages))
        except ValueError as error:
            raise ConfigError(f"translate.pairs: {error}") from None
        if pair not in (f"{source}-{target}", f"{source}:{target}"):
            raise ConfigError(f"translate.pairs: write {pair!r} as '{source}-{target}'")
    if t.aligned_words < 0:
        raise ConfigError(f"translate.aligned_words must be 0 or more, got {t.aligned_words}")
    if any(s.startswith("test") for s in t.splits):
        raise ConfigError("translate.splits: test captions are never translated into training data")


def _counts(cfg: MuleConfig) -> None:
    """Counts that must be at least 1."""
    for key, value in (
        ("loss.top_k", cfg.loss.top_k),
        ("train.epochs", cfg.train.epochs),
        ("train.batch_images", cfg.train.batch_images),
        ("text.word_dim", cfg.text.word_dim),
        ("ablation.seeds", cfg.ablation.seeds),
    ):
        if value < 1:
            raise ConfigError(f"{key} must be at least 1, got {value}")


def _add(cfg: MuleConfig) -> None:
    """Add-language: its languages, caption files and start."""
    added = cfg.add.added
    for lang in added:
        try:
            code = language_code(lang)
        except ValueError as error:
            raise ConfigError(f"add.languages: {error}") from None
        if code != lang:
            raise ConfigError(f"add.languages: write {lang!r} as {code!r}")
    if len(set(added)) < len(added):
        raise ConfigError(f"add.languages={cfg.add.languages!r} names a language twice")
    for item in cfg.add.captions:
        given, path = caption_file(item)
        if not path:
            raise ConfigError(f"add.captions: {item!r} names no file (FILE, or LANG=FILE)")
        if given and given not in added:
            raise ConfigError(f"add.captions: {item!r} is for {given}, which add.languages "
                              f"({cfg.add.languages or 'empty'}) does not add")  # fmt: skip
    if cfg.add.captions and not added:
        raise ConfigError("add.captions (--captions) gives captions of a language to add: name it with "
                          "add.languages (mule run add-language --lang es --captions FILE)")  # fmt: skip
    if cfg.add.languages and cfg.model.sharing != "mule":
        raise ConfigError(
            "add.languages needs model.sharing=mule: a language is added through its own MULE branch"
        )


def _train(cfg: MuleConfig) -> None:
    """Training's schedules, guards and margins."""
    tr = cfg.train
    if cfg.add.start not in ("aligned", "captions"):
        raise ConfigError(f"add.start must be aligned or captions, got {cfg.add.start!r}")
    if cfg.add.words < 0:
        raise ConfigError(f"add.words must be 0 or more, got {cfg.add.words}")
    if tr.divergence not in ("rollback", "stop", "warn", "off"):
        raise ConfigError(f"train.divergence must be rollback, stop, warn or off, got {tr.divergence!r}")
    if tr.word_updates not in ("rows", "dense"):
        raise ConfigError(f"train.word_updates must be rows or dense, got {tr.word_updates!r}")
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


def validate_index(index: IndexConfig) -> None:
    """The index section alone (what `mule serve` is given, without a whole config)."""
    if index.kind not in ("hnsw-sq8", "ivf-sq8", "flat"):
        raise ConfigError(f"index.kind must be 'hnsw-sq8', 'ivf-sq8' or 'flat', got {index.kind!r}")
    if min(index.cells, index.breadth, index.min_images) < 0:
        raise ConfigError("index.cells, index.breadth and index.min_images must not be negative")
