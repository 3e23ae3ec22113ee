"""The typed config: presets, overrides from strings and dicts, clear errors."""

import pytest

from mule.config.overrides import from_dict, option_names, parse_assignments, to_dict
from mule.config.resolution import PHOTO_PRESETS, count_image_files, default_preset, resolve
from mule.config.sections import flatten
from mule.mule_core.settings import ConfigError


def test_presets_differ_where_the_paper_does():
    demo, paper = resolve("demo"), resolve("paper")
    assert (paper.model.mule_dim, paper.model.lstm_dim, paper.model.joint_dim, paper.model.image_hidden) == (
        512, 1024, 512, 2048,
    )  # fmt: skip
    assert (paper.features.arch, paper.features.crops, paper.features.input_size) == ("resnet152", 10, 448)
    assert (paper.train.batch_images, paper.train.epochs, paper.loss.top_k) == (450, 20, 10)
    assert paper.train.sentences_per_image_many == 2 and demo.train.sentences_per_image_many == 3
    assert paper.pretrain.sentences_per_image_many == 2 and demo.pretrain.sentences_per_image_many == 5  # LP
    # The paper's optimiser settings (lr 1e-4, margin 0.05) collapse at 29,000 images here: the
    # preset keeps its dimensions and batch, and trains like the demo (docs/training-at-scale.md)
    assert (paper.train.lr, paper.loss.margin, paper.loss.mining_warmup_steps) == (1e-3, 0.2, 500)
    assert (paper.pretrain.mining_warmup_steps, paper.pretrain.margin) == (500, 0.2)  # LP as measured in that table
    assert paper.loss.lc_weight == 1e-6 and paper.text.word_dim == 300
    assert demo.model.lstm_dim < paper.model.lstm_dim and demo.features.weights == "imagenet"
    assert demo.features.arch == "efficientnet_lite0"  # ImageNet weights that install offline


def test_a_run_without_a_preset_gets_its_datasets():
    # the generated Multi30K-style dataset (mule demo, at any size) gets the demo preset;
    # the real datasets (their photos unknown: see below), the other generated layouts keep the defaults
    assert resolve().preset == "demo" and resolve(None, {"data.dataset": "embedded"}).preset == "demo"
    for dataset in ("multi30k", "coco", "embedded-coco", "embedded-table", "my-photos"):
        assert resolve(None, {"data.dataset": dataset}).preset == "default"
    demo, default = flatten(resolve("demo")), flatten(resolve("default"))
    # the demo preset is the defaults with LP's batch and length and the LSTM sized for the
    # generated data, and joint training's batch doubled with its step-counted schedules halved
    assert {k for k in demo if demo[k] != default[k]} == {"preset", "pretrain.batch_images", "pretrain.epochs",
                                                          "model.lstm_dim", "train.batch_images",
                                                          "loss.mining_warmup_steps", "loss.lc_ramp_steps",
                                                          "train.ema"}  # fmt: skip
    assert (demo["pretrain.batch_images"], demo["pretrain.epochs"], demo["model.lstm_dim"]) == ("64", "4", "64")
    assert 2 * int(default["train.batch_images"]) == int(demo["train.batch_images"])
    assert 2 * int(demo["loss.mining_warmup_steps"]) == int(default["loss.mining_warmup_steps"])
    assert 2 * int(demo["loss.lc_ramp_steps"]) == int(default["loss.lc_ramp_steps"])
    assert 2 * (1 - float(default["train.ema"])) == pytest.approx(1 - float(demo["train.ema"]))  # 1 / (1 - ema) steps
    assert (default["pretrain.batch_images"], default["pretrain.epochs"]) == ("256", "10")


def test_cli_strings_are_converted_to_the_field_types():
    cfg = resolve("demo", parse_assignments(["train.epochs=3", "loss.lc=false", "loss.margin=0.3",
                                             "data.languages=en,fr", "train.sentences_per_image=en=2,fr=1"]))  # fmt: skip
    assert cfg.train.epochs == 3 and cfg.loss.lc is False and cfg.loss.margin == 0.3
    assert cfg.data.languages == ("en", "fr")
    assert cfg.train.sentences_per_image == {"en": 2, "fr": 1}


def test_flow_parameters_may_be_json_values():
    cfg = resolve(
        "demo", {"train.epochs": 4, "loss.nc": False, "data.languages": ["de"], "vectors.files": {"en": "x.vec"}}
    )
    assert cfg.train.epochs == 4 and cfg.loss.nc is False and cfg.data.languages == ("de",)
    assert cfg.vectors.files == {"en": "x.vec"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"train.epoch": 3}, "unknown config option 'train.epoch'"),
        ({"nosuch.x": 1}, "unknown config option"),
        ({"train.epochs": "three"}, "train.epochs"),
        ({"loss.lc": "maybe"}, "expected true or false"),
        ({"features.crops": 3}, "features.crops must be 1, 5 or 10"),
        ({"features.weights": "coco"}, "features.weights"),
        ({"train.epochs": 0}, "train.epochs must be at least 1"),
        ({"pretrain.margin": 0}, r"pretrain.margin must be in \(0, 2\), got 0"),
        ({"loss.margin": 2.5}, r"loss.margin must be in \(0, 2\)"),
        ({"vectors.fasttext_buckets": 0}, "vectors.fasttext_buckets must be at least 1, got 0"),
    ],
)
def test_bad_options_name_the_option(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve("demo", overrides)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="presets are: default, demo, few-photos, paper"):
        resolve("huge")


def test_round_trip_and_flat_params():
    cfg = resolve("paper", {"data.languages": "en,de", "train.sentences_per_image": "en=2"})
    assert from_dict(to_dict(cfg)) == cfg
    flat = flatten(cfg)
    assert flat["preset"] == "paper" and flat["data.languages"] == "en,de" and flat["model.lstm_dim"] == "1024"
    assert set(flat) - {"preset"} == set(option_names())


def test_assignments_need_an_equals_sign():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_assignments(["train.epochs"])


def test_an_unknown_language_code_is_an_error_at_config_time():
    with pytest.raises(ConfigError, match="data.languages: 'jp' is not a language code"):
        resolve("demo", {"data.languages": "en,jp"})
    with pytest.raises(ConfigError, match="data.languages: write 'EN' as 'en'"):
        resolve("demo", {"data.languages": "EN,de"})
    with pytest.raises(ConfigError, match="text.tokenizers: th='icu' is not a tokeniser; choose one of moses"):
        resolve("demo", {"text.tokenizers": "th=icu"})
    assert resolve("demo", {"data.languages": "es,pl,th"}).data.languages == ("es", "pl", "th")


def test_a_source_folder_with_a_captions_table_is_the_table_layout(tmp_path):
    (tmp_path / "metadata.jsonl").write_text("{}\n")
    assert resolve("demo", {"data.dataset": "mine", "data.source": str(tmp_path)}).data.format == "table"
    assert resolve("demo", {"data.dataset": "mine", "data.source": str(tmp_path),
                            "data.format": "multi30k"}).data.format == "multi30k"  # fmt: skip
    (tmp_path / "metadata.jsonl").unlink()
    (tmp_path / "data" / "task1").mkdir(parents=True)
    assert resolve("demo", {"data.dataset": "mine", "data.source": str(tmp_path)}).data.format == "multi30k"
    with pytest.raises(ConfigError, match="data.val_share and data.test_share must be shares"):
        resolve("demo", {"data.val_share": 0.5, "data.test_share": 0.5})
    with pytest.raises(ConfigError, match="data.encoding: 'utf-9' is not a text encoding"):
        resolve("demo", {"data.encoding": "utf-9"})


def test_a_source_folder_in_no_layout_says_what_each_layout_needs_and_what_it_holds(tmp_path):
    """`--source` pointed at the photos (not the folder with their captions table), at an
    empty folder, at a folder of other files or at no folder: one error, before any stage,
    naming every layout looked for, what each needs, and what the folder holds."""
    from PIL import Image

    def error(source) -> str:
        with pytest.raises(ConfigError) as raised:
            resolve(None, {"data.dataset": "shop", "data.source": str(source)})
        return str(raised.value)

    photos = tmp_path / "photos"
    photos.mkdir()
    for n in range(3):
        Image.new("RGB", (8, 8)).save(photos / f"p{n}.jpg")
    said = error(photos)
    assert all(f"  - {layout}: " in said for layout in ("multi30k", "coco", "table")), said
    assert "data/task1" in said and "captions_*.json" in said and "captions.csv" in said
    assert "It holds 3 image file(s) and no captions table" in said and f"--images {photos}" in said
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hello")
    assert "It holds 1 file(s): readme.txt" in error(tmp_path / "notes")
    (tmp_path / "empty").mkdir()
    assert "It holds no files." in error(tmp_path / "empty")
    assert "does not exist" in error(tmp_path / "nowhere")
    assert resolve(None, {"data.dataset": "shop", "data.source": str(photos), "data.format": "table"}).data.format == "table"


def test_a_coco_dataset_implies_its_reader_languages_and_sampling_unless_set():
    coco = resolve("demo", {"data.dataset": "coco", "data.source": "/data/coco"})
    assert (coco.data.format, coco.data.languages, coco.train.balance_language_groups) == (
        "coco",
        ("en", "ja", "zh"),
        True,
    )
    assert (coco.data.val_images, coco.data.test_images) == (1000, 1000)  # the paper's split
    generated = resolve("demo", {"data.dataset": "embedded-coco"})
    assert (generated.data.train_images, generated.data.val_images, generated.data.test_images) == (4500, 200, 300)
    mine = resolve("demo", {"data.dataset": "coco", "data.languages": "en,ja", "data.test_images": 500})
    assert mine.data.languages == ("en", "ja") and mine.data.test_images == 500 and mine.data.format == "coco"
    assert resolve("demo").data.format == "multi30k"


def test_a_model_file_s_config_with_a_retired_option_still_reads():
    stored = to_dict(resolve("default"))
    stored["loss"]["warmup_epochs"] = 3  # written by mule before schedules counted steps
    assert from_dict(stored).loss.mining_warmup_steps == 150
    with pytest.raises(ConfigError, match="unknown config option 'loss.warmup_epochs'"):
        resolve("demo", {"loss.warmup_epochs": 3})  # but it is no option to set


@pytest.mark.parametrize("key,value,message", [
    ("train.divergence", "explode", "rollback, stop, warn or off"),
    ("train.divergence_drop", "1.5", "between 0 and 1"),
    ("train.divergence_lr_factor", "0", "in \\(0, 1\\]"),
    ("loss.mining_warmup_steps", "-1", "at least 0"),
    ("pretrain.mining_warmup_steps", "-1", "at least 0"),
])  # fmt: skip
def test_guard_and_schedule_options_are_checked(key, value, message):
    with pytest.raises(ConfigError, match=message):
        resolve("demo", {key: value})


def test_the_few_photos_preset_is_the_defaults_with_ten_crops_and_24_epochs():
    # chosen on folds of the real Multi30K photos (docs/real-photos.md); nothing else moves
    few, default = flatten(resolve("few-photos")), flatten(resolve("default"))
    changed = {k for k in default if few[k] != default[k]}
    assert changed == {"preset", "features.crops", "train.epochs"}
    assert (few["features.crops"], few["train.epochs"]) == ("10", "24")


def test_the_some_photos_preset_is_the_defaults_with_ten_crops_batches_of_128_mt_and_patience_3():
    # chosen on the 242 val photos of 7,478 real Multi30K photos, three seeds (docs/real-photos.md);
    # patience 3 kept the very model of all 16 epochs on every run measured (bench/patience_from_logs.py)
    some, default = flatten(resolve("some-photos")), flatten(resolve("default"))
    changed = {k for k in default if some[k] != default[k]}
    assert changed == {"preset", "features.crops", "train.batch_images", "train.patience", "data.captions",
                       "translate.backend"}  # fmt: skip
    assert (some["features.crops"], some["train.batch_images"], some["train.patience"]) == ("10", "128", "3")
    assert (some["data.captions"], some["translate.backend"]) == ("human+mt", "auto")  # +MT where translations teach it


@pytest.mark.parametrize("dataset, photos, preset", [
    ("multi30k", 872, "few-photos"), ("multi30k", 1_999, "few-photos"),  # the 872 of flickr-photos' train
    ("multi30k", 2_000, "some-photos"), ("multi30k", 7_478, "some-photos"), ("coco", 14_999, "some-photos"),
    ("multi30k", 15_000, "default"), ("coco", 123_287, "default"),  # the defaults were chosen at 29,000
    ("multi30k", None, "default"), ("multi30k", 0, "default"),  # photos unknown: the defaults
    ("embedded", 300, "demo"), ("embedded-table", 300, "default"),  # generated pictures are not photos
])  # fmt: skip
def test_a_run_naming_no_preset_is_sized_by_its_photos(dataset, photos, preset):
    assert default_preset(dataset, photos) == preset


def test_the_features_stage_tells_one_crop_of_few_photos_at_the_few_photos_bound():
    from mule.tasks.features import FEW_PHOTOS  # kept in that file: a change there reruns every extraction

    assert PHOTO_PRESETS[0] == (FEW_PHOTOS, "few-photos")


def test_the_photos_counted_are_the_image_files_below_the_folder_named(tmp_path):
    photos = tmp_path / "photos"
    (photos / "nested").mkdir(parents=True)
    for name in ("a.jpg", "b.JPEG", "nested/c.png", "notes.txt", "nested/captions.csv"):
        (photos / name).write_bytes(b"")  # names only: nothing is opened
    (photos / "nested" / "loop").symlink_to(photos, target_is_directory=True)  # a link back up: counted once
    assert count_image_files(photos) == 3 and count_image_files(tmp_path / "absent") == 0
    cfg = resolve(None, {"data.dataset": "mine", "data.format": "table", "data.images": str(photos)})
    assert (cfg.preset, cfg.features.crops, cfg.train.epochs) == ("few-photos", 10, 24)
    # the source's images folder when --images is not given; a preset named wins
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "images").symlink_to(photos, target_is_directory=True)
    by_source = {"data.dataset": "mine", "data.format": "table", "data.source": str(tmp_path / "source")}
    assert resolve(None, by_source).preset == "few-photos"
    assert resolve("default", {"data.dataset": "mine", "data.images": str(photos)}).features.crops == 1
    assert resolve(None, {"data.dataset": "mine", "data.format": "table", "data.images": str(tmp_path / "x")}).preset == "default"


def test_every_option_is_defined_once_across_the_model_library_and_the_pipeline():
    """Each section is one class: the model library's own (text, model, loss, train,
    pretrain), or the pipeline's; only features extends the library's extractor with the
    stage's runner options, each field defined once, the library's or the pipeline's."""
    import dataclasses

    from mule.config.sections import MuleConfig
    from mule.mule_core import settings

    library = {"features": settings.ExtractorConfig, "text": settings.TextConfig, "model": settings.ModelConfig,
               "loss": settings.LossConfig, "train": settings.TrainConfig, "pretrain": settings.PretrainConfig}
    twice = []
    for section in dataclasses.fields(MuleConfig):
        if not isinstance(section.type, str) or section.name == "preset":
            continue
        cls = type(getattr(MuleConfig(), section.name))
        if section.name in library:
            assert issubclass(cls, library[section.name]), f"{section.name}: {cls} is not the library's section"
            assert cls is library[section.name] or section.name == "features", f"{section.name}: {cls} is a second class"
        for base in cls.__mro__[1:]:
            twice += [f"{section.name}.{name}" for name in vars(cls).get("__annotations__", {})
                      if name in vars(base).get("__annotations__", {})]  # fmt: skip
    assert not twice, f"defined in the library and again in the pipeline: {twice}"


def test_options_that_moved_section_are_read_under_their_new_names_said_once(caplog):
    """add-language's options moved from `train` to `add`, the word vectors' from `text`
    to `vectors`, and the model's name from `train` to `output`: a preset, a saved deployment or a --set with the old name still runs,
    saying once what to write instead; a config stored with a model is read in silence."""
    import logging

    from mule.config import overrides

    overrides._said_renamed.clear()
    with caplog.at_level(logging.WARNING, logger="mule.config"):
        cfg = resolve("demo", {"text.fasttext_epochs": 2, "text.init": "multilingual-e5", "text.vectors": {"en": "x.vec"},
                               "train.base_model": "model", "train.add_words": 1000, "train.model_name": "seed1"})  # fmt: skip
        again = resolve("demo", {"text.fasttext_epochs": 2})
    assert (cfg.vectors.fasttext_epochs, cfg.vectors.init, cfg.vectors.files) == (2, "multilingual-e5", {"en": "x.vec"})
    assert (cfg.add.base_model, cfg.add.words, again.vectors.fasttext_epochs) == ("model", 1000, 2)
    assert cfg.output.model_name == "seed1" and not hasattr(cfg.train, "model_name")
    said = [r.getMessage() for r in caplog.records if "is now" in r.getMessage()]
    assert sorted(said) == sorted(["text.fasttext_epochs is now vectors.fasttext_epochs: read as it (write vectors.fasttext_epochs=...)",
                                   "text.init is now vectors.init: read as it (write vectors.init=...)",
                                   "text.vectors is now vectors.files: read as it (write vectors.files=...)",
                                   "train.base_model is now add.base_model: read as it (write add.base_model=...)",
                                   "train.add_words is now add.words: read as it (write add.words=...)",
                                   "train.model_name is now output.model_name: read as it (write output.model_name=...)"])  # fmt: skip
    assert not hasattr(cfg.text, "fasttext_epochs") and "fasttext_epochs" not in to_dict(cfg)["text"]
    # a model file's config from before: its text section held the vectors' options
    stored = to_dict(cfg)
    stored["text"] |= stored.pop("vectors") | {"vectors": {"en": "x.vec"}}
    stored["text"].pop("files")
    stored["train"]["model_name"] = stored.pop("output")["model_name"]
    caplog.clear()
    overrides._said_renamed.clear()
    with caplog.at_level(logging.WARNING, logger="mule.config"):
        read = from_dict(stored)
        assert read.vectors == cfg.vectors and read.output == cfg.output
    assert not [r for r in caplog.records if "is now" in r.getMessage()]
