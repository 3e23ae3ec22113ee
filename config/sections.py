"""The pipeline's one typed config: its sections, each option keeping its dotted name.

The model and training sections are the model library's (mule_core/settings.py: model,
loss, train, pretrain, and the parts of text and features that using a model needs); the
sections only the pipeline reads are here (data, output: which model a run makes or
reads, the text stage's word vectors, the features stage's runner, add, eval, index,
translate, ablation). These types sit low enough
that every stage may name them; resolving a config (presets, a dataset's defaults,
overrides) is config/resolution.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from mule.mule_core import settings as model_settings
from mule.mule_core.settings import ConfigError, LossConfig, ModelConfig, PretrainConfig, flatten  # noqa: F401 - the pipeline's names


@dataclass
class DataConfig:
    dataset: str = "embedded"  # catalog name; "embedded" is generated when no source is given
    # layout of the raw files: multi30k (the official repository), coco (COCO + YJ/STAIR +
    # COCO-CN), or table (an image folder and one captions table; inferred when --source holds
    # metadata.jsonl/.csv/.parquet or captions.csv/.tsv/.jsonl/.parquet: datasets/readers/table.py)
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
    # More human captions of the dataset's own images, in IGLUE's xFlickr&CO layout
    # (<folder>/<lang>/<name>.jsonl: datasets/readers/xflickrco.py): the folder, and each
    # file's split by its name, for every language or one (train_100=train,ja/train_1500=train,
    # test=test_xflickrco). A split the dataset has adds them to its images; another name is a
    # split of its own over those images, kept apart (never trained on) and measured with
    # eval.split=<name>. Only data.languages are read.
    extra_captions: str = ""
    extra_files: dict[str, str] = field(default_factory=dict)
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
class VectorsConfig:
    """Where the text stage gets each language's word vectors (text.word_dim wide; the
    model library reads them, never these options)."""

    files: dict[str, str] = field(default_factory=dict)  # lang -> .bin/.vec file; the others start from `init`
    # Where the other languages' word vectors come from: "fasttext" (trained on the training
    # captions, one language at a time) or "multilingual-e5" (each vocabulary word through
    # the bundled multilingual-e5-small, every language projected by one shared PCA to
    # word_dim: aligned across languages from the start; needs the e5 extra,
    # words/encoder.py)
    init: str = "fasttext"
    fasttext_model: str = "skipgram"
    # fastText's own default. LP and joint training fine-tune the vectors: on the real
    # Multi30K text LP's validation R@1 over three seeds is 20 epochs' (the text stage
    # 1.9 min instead of 7), the demo's too (docs/training-at-scale.md, "fastText's epochs")
    fasttext_epochs: int = 5
    fasttext_min_count: int = 1
    # fastText's own default: the hashed rows its n-grams share, bucket x word_dim floats
    # in each worker (2.4 GB allocated at 300-d, most rows never touched on a caption corpus).
    # Fewer allocate less and start faster, with other vectors (so it is keyed); the
    # tests' tiny runs use 100,000.
    fasttext_buckets: int = 2_000_000
    # 1 keeps trained vectors reproducible; on several threads fastText trains other vectors on
    # every run (its updates race), so the count is part of the text stage's key
    fasttext_threads: int = 1


@dataclass
class OutputConfig:
    """Which of the dataset's models a run makes or reads: its file, results and index."""

    # models/<dataset>/<model_name>.pt, results/<dataset>/<model_name>/, the index's folder;
    # the ablation's rows and seeds train several ("ablation/embn-en", "seed1")
    model_name: str = "model"
    # How the trained model's word and n-gram tables (nearly all its weights) are stored:
    # float32, float16 or int8 with one float32 scale a row (mule_core.table_precision): the
    # file, its MLflow copy and its registered version 0.26 of float32's on the 7,478 real
    # photos (533 -> 139 MB), test mR 67.25 -> 67.23, the demo's three seeds within 0.012
    # (bench/table_precision.py). The train and extend stages round their model to it when
    # training ends, so the file evaluated and served is the model trained; training itself,
    # LP's file and checkpoints stay float32
    tables: str = "int8"


@dataclass
class AddConfig:
    """`mule run add-language`: the languages added to a trained model, the model, their
    captions and how a branch starts (pipeline/sweeps.py, tasks/extend.py)."""

    # The languages added, in order ("es" or "es,ja"): only each one's word embeddings and
    # MULE FC train (LP, then NC + the image-sentence loss), the shared model and the other
    # languages stay bit-identical. A language the dataset's languages lack (data.languages)
    # is added to base_model, else to the rebuild's model (output.model_name), nothing
    # retrained: from zero captions, from the dataset's own captions in it, or from
    # `captions`. One language of data.languages with no base_model is the study: trained
    # without it, added, and to compare, every language from scratch
    languages: str = ""
    base_model: str = ""
    # Tables of the added languages' captions of the dataset's images (`--captions FILE`, or
    # `--captions es=FILE` for one language): datasets/readers/added_captions.py
    captions: tuple[str, ...] = ()
    # How a branch starts: "aligned" (its captions' words and wordfreq's commonest `words`,
    # each at the MULE feature of its nearest trained words by multilingual-e5: it reads the
    # language zero-shot, captions or not; words/aligned.py) or "captions" (word vectors from
    # the text stage, the FC random: what the paper does). 50,000 words: 26.8 held-out val mR
    # against 23.7 for 20,000 and 18.4 for 5,000 (bench/aligned_start_val.py, docs/real-photos.md)
    start: str = "aligned"
    words: int = 50000

    @property
    def added(self) -> tuple[str, ...]:
        """The languages `languages` names, in order."""
        return tuple(x.strip() for x in self.languages.split(",") if x.strip())

    @property
    def adding(self) -> str:
        """The language an extend step trains: the last named (those before it are in its base)."""
        return self.added[-1] if self.added else ""

    @property
    def root_model(self) -> str:
        """The trained model the languages are added to: base_model, else (the study of one
        language of data.languages) without-<lang>."""
        return self.base_model or (f"without-{self.added[0]}" if self.added else "")

    @property
    def extended_model(self) -> str:
        """The model the extend step adds `adding` to: the root with every language named before it."""
        return self.root_model + "".join(f"+{lang}" for lang in self.added[:-1])

    @property
    def added_model(self) -> str:
        """The model with every named language added: <root>+es+ja."""
        return self.root_model + "".join(f"+{lang}" for lang in self.added)

    def caption_files(self, lang: str) -> list[str]:
        """The `captions` tables a language reads: those given for it (es=FILE) and those
        given for none (FILE: its rows in `lang`, by their lang column)."""
        return [path for given, path in map(caption_file, self.captions) if given in ("", lang)]


def caption_file(item: str) -> tuple[str, str]:
    """`es=FILE` as ("es", FILE); `FILE` as ("", FILE)."""
    head, sep, tail = str(item).partition("=")
    if sep and head and "/" not in head and "\\" not in head and len(head) <= 12:
        return head.strip(), tail.strip()
    return "", str(item).strip()


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
    # lexicon (MUSE files), induced (IBM Model 1 on task1), auto (induced for the pairs the
    # dataset's own parallel captions cover, the others left untranslated: what the
    # some-photos preset takes), aligned (each word's nearest word of the other language by
    # multilingual-e5: any pair, no parallel text), googletrans, argos
    backend: str = "lexicon"
    # "src-dest" pairs; empty: English into every other language and every other language into English
    pairs: tuple[str, ...] = ()
    splits: tuple[str, ...] = ("train", "val")  # test captions are never translated into training data
    concurrency: int = 4  # googletrans: requests in flight
    timeout_s: float = 10.0  # googletrans: per request
    retries: int = 5  # googletrans: per sentence, with exponential backoff and jitter
    induced_iterations: int = 5  # IBM Model 1 EM iterations
    # aligned: how many of the target language's commonest words (wordfreq) a caption word may
    # become, beside the target's own caption words
    aligned_words: int = 50_000


@dataclass
class AblationConfig:
    seeds: int = 1  # train every row with this many seeds (train.seed, +1, ...); the table shows mean and std


@dataclass
class MuleConfig:
    preset: str = "default"
    data: DataConfig = field(default_factory=DataConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    text: model_settings.TextConfig = field(default_factory=model_settings.TextConfig)
    vectors: VectorsConfig = field(default_factory=VectorsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: model_settings.TrainConfig = field(default_factory=model_settings.TrainConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    add: AddConfig = field(default_factory=AddConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    translate: TranslateConfig = field(default_factory=TranslateConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)


SECTIONS = tuple(f.name for f in dataclasses.fields(MuleConfig) if f.name != "preset")
