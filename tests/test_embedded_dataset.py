"""The embedded dataset: deterministic, in the official layout, grammatical."""

import gzip
import hashlib
import random
from pathlib import Path

import pytest

from mule.generators import lang_cs, lang_de, lang_en, lang_fr
from mule.generators.multi30k_layout import EmbeddedSpec, generate_multi30k
from mule.generators.plans import CaptionPlan, Mention
from mule.generators.scenes import SceneObject

SPEC = EmbeddedSpec(train_images=6, val_images=2, test_images=3, seed=7, image_size=48)


def digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "manifest.json"  # the manifest holds a creation time
    }


def read_gz(path: Path) -> list[str]:
    return gzip.open(path, "rt", encoding="utf-8").read().splitlines()


def test_same_seed_same_bytes_other_seed_other_data(tmp_path):
    a = digest(generate_multi30k(tmp_path / "a", SPEC))
    b = digest(generate_multi30k(tmp_path / "b", SPEC))
    c = digest(generate_multi30k(tmp_path / "c", EmbeddedSpec(6, 2, 3, seed=8, image_size=48)))
    assert a == b
    assert a["data/task1/raw/train.en.gz"] != c["data/task1/raw/train.en.gz"]
    assert a["images/train-000001.jpg"] != c["images/train-000001.jpg"]


def test_processes_rendering_the_images_write_the_same_bytes_as_one(tmp_path, monkeypatch):
    """Images rendered by a pool of processes (as `mule demo` renders them on several
    cores) are the same files, listed in the same order, as one process writes."""
    from mule.generators import multi30k_layout
    from mule.mule_core import devices

    pools = []
    started = devices.worker_processes
    monkeypatch.setattr(multi30k_layout, "PARALLEL_FROM", 0)  # a pool even for these few images
    monkeypatch.setattr(devices, "worker_processes", lambda n: pools.append(n) or started(n))
    spec = EmbeddedSpec(train_images=150, val_images=20, test_images=30, seed=3, image_size=48)
    alone = digest(generate_multi30k(tmp_path / "alone", spec))
    assert pools == []
    pooled = digest(generate_multi30k(tmp_path / "pooled", spec, processes=2))
    assert pools == [2]
    assert pooled == alone and len(alone) > 200


def test_test_split_does_not_depend_on_the_training_size(tmp_path):
    small = generate_multi30k(tmp_path / "small", SPEC)
    large = generate_multi30k(tmp_path / "large", EmbeddedSpec(9, 2, 3, seed=7, image_size=48))
    assert read_gz(small / "data/task2/raw/test_2016.1.en.gz") == read_gz(large / "data/task2/raw/test_2016.1.en.gz")


def test_official_layout_and_counts(tmp_path):
    root = generate_multi30k(tmp_path / "d", SPEC)
    for stem, n in (("train", 6), ("val", 2), ("test_2016_flickr", 3)):
        names = (root / f"data/task1/image_splits/{stem}.txt").read_text().split()
        assert len(names) == n and all((root / "images" / name).exists() for name in names)
        for lang in ("en", "de", "fr", "cs"):
            assert len(read_gz(root / f"data/task1/raw/{stem}.{lang}.gz")) == n
    for stem, n in (("train", 6), ("val", 2), ("test_2016", 3)):
        assert len((root / f"data/task2/image_splits/{stem}_images.txt").read_text().split()) == n
        for k in range(1, 6):
            for lang in ("en", "de"):
                assert len(read_gz(root / f"data/task2/raw/{stem}.{k}.{lang}.gz")) == n
    assert (root / "dictionaries/en-de.txt").read_text().count("\n") > 50


def test_task1_english_repeats_one_of_the_five_task2_lines(tmp_path):
    root = generate_multi30k(tmp_path / "d", SPEC)
    task1 = read_gz(root / "data/task1/raw/train.en.gz")
    task2 = [read_gz(root / f"data/task2/raw/train.{k}.en.gz") for k in range(1, 6)]
    for i, line in enumerate(task1):
        assert line in [task2[k][i] for k in range(5)]


def test_generation_is_skipped_when_the_spec_matches_and_redone_when_not(tmp_path):
    root = generate_multi30k(tmp_path / "d", SPEC)
    marker = root / "images" / "train-000001.jpg"
    before = marker.stat().st_mtime_ns
    generate_multi30k(root, SPEC)
    assert marker.stat().st_mtime_ns == before
    generate_multi30k(root, EmbeddedSpec(2, 1, 1, seed=7, image_size=48))
    assert len((root / "data/task1/image_splits/train.txt").read_text().split()) == 2
    assert not list(tmp_path.glob("d.tmp-*"))  # no temporary folder left behind


def test_the_dataset_is_written_again_by_other_generator_code(tmp_path, repo_copy):
    from mule.storage.code_digests import code_digest
    from tests.conftest import edit

    root = generate_multi30k(tmp_path / "d", SPEC, code="generator-a")
    marker = root / "images" / "train-000001.jpg"
    before = marker.stat().st_mtime_ns
    generate_multi30k(root, SPEC, code="generator-a")
    assert marker.stat().st_mtime_ns == before  # same spec, same code: kept
    generate_multi30k(root, SPEC, code="generator-b")
    assert marker.stat().st_mtime_ns != before  # same spec, other code: written again
    # The code is the writer's import closure (as the ceiling's is): an edit to a language's
    # grammar changes it, an edit to the ceiling's computation does not.
    layout = "mule.generators.multi30k_layout"
    first = code_digest(layout, repo_copy)
    edit(repo_copy / "generators" / "ceiling.py")
    assert code_digest(layout, repo_copy) == first
    edit(repo_copy / "generators" / "lang_de.py")
    assert code_digest(layout, repo_copy) != first


def plan(*mentions, background=None, count=None):
    return CaptionPlan(tuple(mentions), background, count)


def obj(shape, color="red", size="small", place="left"):
    return SceneObject(shape, color, size, place)


def realisations(module, p, n=60):
    return {module.realise(p, random.Random(seed)) for seed in range(n)}


def test_german_case_and_gender_agreement():
    # A masculine noun after "es gibt" takes the accusative: "einen roten Kreis" / "einen roten Stern".
    outputs = realisations(lang_de, plan(Mention(obj("star"), color=True, size=False, place=False)))
    accusative = [s for s in outputs if s.startswith("Es gibt")]
    assert accusative and all("einen roten Stern" in s for s in accusative)
    dative = [s for s in outputs if "mit" in s]
    assert dative and all("einem roten Stern" in s for s in dative)
    neuter = realisations(lang_de, plan(Mention(obj("triangle", "blue"), color=True, size=True, place=False)))
    assert all("kleines blaues Dreieck" in s or "kleinen blauen Dreieck" in s for s in neuter)


def test_french_size_before_and_colour_after_the_noun_with_agreement():
    outputs = realisations(lang_fr, plan(Mention(obj("star", "green"), color=True, size=True, place=False)))
    assert all("une petite étoile verte" in s.lower() for s in outputs)
    masculine = realisations(
        lang_fr, plan(Mention(obj("square", "white", "large"), color=True, size=True, place=False))
    )
    assert all(("un grand carré blanc" in s.lower()) or ("un gros carré blanc" in s.lower()) for s in masculine)


def test_czech_cases_and_preposition_vocalisation():
    outputs = realisations(lang_cs, plan(Mention(obj("star", "green"), color=True, size=False, place=False)), n=120)
    assert any(s.startswith("Vidíme zelenou hvězd") for s in outputs)  # accusative
    assert any(s.startswith("Obrázek se zelenou hvězd") for s in outputs)  # instrumental, "se" before z
    blue = realisations(lang_cs, plan(Mention(obj("circle", "blue"), color=True, size=False, place=False)), n=120)
    assert any(s.startswith("Obrázek s modrým kruhem") or s.startswith("Obrázek s modrým kolečkem") for s in blue)


def test_english_articles():
    outputs = realisations(lang_en, plan(Mention(obj("hexagon", "orange"), color=True, size=False, place=False)))
    assert all("an orange hexagon" in s.lower() for s in outputs)


@pytest.mark.parametrize("module", [lang_en, lang_de, lang_fr, lang_cs])
def test_every_language_mentions_background_and_count(module):
    p = plan(Mention(obj("heart"), True, False, False), Mention(obj("cross", "blue"), True, False, True),
             background="gray", count=2)  # fmt: skip
    words = {"en": ("two", "gr"), "de": ("zwei", "grau"), "fr": ("deux", "gris"), "cs": ("dva", "šed")}
    number, gray = words[module.__name__.rsplit("_", 1)[1]]
    for sentence in realisations(module, p, n=10):
        assert number in sentence.lower() and gray in sentence.lower()
