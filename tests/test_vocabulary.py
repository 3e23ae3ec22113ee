"""A model's vocabulary is what training sees: the validation and test captions teach it
nothing, and their words outside it are read the same way wherever a sentence is embedded
(mule_core.vocabulary.Vocabulary.encode)."""

import gzip
import shutil

import pytest

from mule.config.resolution import resolve
from mule.data_catalog.tables import Catalog
from mule.pipeline.runner import run_alone
from mule.storage.workdir import Workdir
from tests.conftest import STEMS, write_gz

pytestmark = pytest.mark.slow  # the whole file: it shares one fixture of tens of seconds, or runs real processes

OTHER_WORDS = "zebras graze quietly beside seventeen lighthouses"


def _replace_captions(root, split: str) -> None:
    """Every caption of the split becomes a sentence of words no training caption has."""
    task1, task2 = STEMS[split]
    for path in [*(root / "data/task1/raw").glob(f"{task1}.*.gz"), *(root / "data/task2/raw").glob(f"{task2}.*.gz")]:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            count = len(handle.read().splitlines())
        write_gz(path, [f"{OTHER_WORDS} {n}." for n in range(count)])


def test_the_vocabulary_and_its_ngrams_do_not_depend_on_the_validation_and_test_captions(tiny_multi30k, tmp_path):
    other = tmp_path / "other-multi30k"
    shutil.copytree(tiny_multi30k, other)
    for split in ("val", "test"):
        _replace_captions(other, split)
    tables, summaries = [], []
    for name, source in (("as-given", tiny_multi30k), ("other", other)):
        cfg = resolve("demo", {"data.dataset": "tiny", "data.source": str(source), "text.word_dim": 8,
                               "vectors.fasttext_epochs": 2, "vectors.fasttext_buckets": 100_000, "model.ngram_lengths": "3"})  # fmt: skip
        wd = Workdir.at(tmp_path / name)
        run_alone(wd, cfg, "ingest")
        summaries.append(run_alone(wd, cfg, "text"))
        catalog = Catalog(wd)
        tables.append({t: catalog.read_table(t, "tiny") for t in ("word_vectors", "subword_vectors")})
    for table in ("word_vectors", "subword_vectors"):
        assert tables[0][table].num_rows > 0, table
        assert tables[0][table].equals(tables[1][table]), table
    assert "seventeen" not in tables[0]["word_vectors"]["token"].to_pylist()
    # the text stage counts the other splits' words outside it
    assert summaries[1]["en"]["unseen_in_train"] >= len(OTHER_WORDS.split())
