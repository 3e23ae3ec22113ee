"""A damaged workdir is noticed: every kind of file a workdir holds, cut to half its size,
deleted, or overwritten with as many random bytes (what a full disk, an interrupted copy
or a sync tool leaves), then the next run.

What mule made, it makes again: a stage whose recorded output is damaged runs again
(saying which file), before any stage reads it; the catalog database (views only) is
rebuilt from the Parquet tables; an unreadable stage record counts as none; caches start
empty. What it cannot repair (the MLflow store, the Prefect database) stops the run
with one line that names the file and what to do. Each case ends, after the repair, with
the same tables and recalls as before the damage.

The stages run here without Prefect and MLflow (pipeline.runner, as the tests of keys
do); bench/damaged_workdir.py runs the same table through `mule demo` and prints it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from mule.config.resolution import resolve
from mule.data_catalog.tables import Catalog
from mule.mule_core.errors import is_user_error
from mule.pipeline import decisions, rebuild
from mule.pipeline.declaration import REBUILD
from mule.pipeline.runner import Runner, untracked
from mule.storage.workdir import Workdir

TINY = {"data.train_images": 24, "data.val_images": 8, "data.test_images": 8, "data.image_size": 48,
        "features.input_size": 32, "features.shard_images": 16, "vectors.fasttext_epochs": 2, "vectors.fasttext_buckets": 100_000, "text.word_dim": 64, "pretrain.epochs": 1,
        "pretrain.batch_images": 8, "train.epochs": 2, "train.batch_images": 8, "eval.examples": 1}  # fmt: skip

# kind -> (a file of that kind, the stage that runs again after a damage; None: none does)
STAGE_OUTPUTS = {
    "captions table": ("catalog/captions/embedded.parquet", "ingest"),
    "images table": ("catalog/images/embedded.parquet", "ingest"),
    "rejects table": ("catalog/rejects/embedded.parquet", "ingest"),
    "MT captions table": ("catalog/captions/embedded.mt.parquet", "translate"),
    "translations table": ("catalog/translations/embedded.parquet", "translate"),
    "image rejects table": ("catalog/rejects/embedded.images.parquet", "features"),
    "feature part": ("catalog/features/embedded/*/part-*-00001.parquet", "features"),
    "features pointer": ("catalog/features/embedded/current.json", "features"),
    "extractor description": ("catalog/features/embedded/*/extractor.json", "features"),
    "word vectors table": ("catalog/word_vectors/embedded.parquet", "text"),
    "LP model": ("models/embedded/pretrain.pt", "pretrain"),
    "model": ("models/embedded/model.pt", "train"),
    "evaluation": ("results/embedded/evaluation.json", "evaluate"),
}
DAMAGES = ("cut", "deleted", "garbage")


def damage(path: Path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "cut":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:  # the same size: only the content digest can tell
        path.write_bytes(os.urandom(max(path.stat().st_size, 16)))


def one(root: Path, pattern: str) -> Path:
    found = sorted(root.glob(pattern))
    assert found, f"no {pattern} in the built workdir"
    return found[0]


def next_run(wd: Workdir, cfg, stages=REBUILD) -> dict[str, decisions.Decision]:
    """What the next run does, stage by stage (as the rebuild flow does, without Prefect): decisions."""
    runner, decided = Runner(wd, untracked()), {}
    for name in rebuild.plan(wd, cfg, list(stages)).stages:
        decided[name] = runner.decide(cfg, name)
        runner.run(cfg, name, decision=decided[name])
    return decided


def outputs(wd: Workdir, cfg) -> dict[str, dict]:
    """Every stage's recorded output digests."""
    return {s: decisions.read_record(wd, cfg, s)["outputs"] for s in REBUILD}


def recalls(wd: Workdir) -> dict:
    return json.loads((wd.results_dir("embedded") / "evaluation.json").read_text())["table"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cfg = resolve("demo", TINY)
    wd = Workdir.at(tmp_path_factory.mktemp("damage") / "built")
    next_run(wd, cfg)
    return wd, cfg, json.loads((wd.results_dir("embedded") / "evaluation.json").read_text())


@pytest.fixture
def copy(built, tmp_path):
    wd, cfg, _ = built
    target = tmp_path / "work"
    shutil.copytree(wd.root, target, symlinks=True)
    copied = Workdir.at(target)
    from mule.experiments.relocation import adopt

    adopt(copied)  # as every command does first: a copy points its paths at itself (its images table changes)
    return copied, cfg, outputs(copied, cfg)


@pytest.mark.slow
@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("kind", list(STAGE_OUTPUTS))
def test_a_damaged_output_reruns_its_stage_first_saying_which_file(kind, how, built, copy):
    wd, cfg, before = copy
    pattern, stage = STAGE_OUTPUTS[kind]
    path = one(wd.root, pattern)
    name = str(path.relative_to(wd.root))
    damage(path, how)

    decisions = next_run(wd, cfg)

    ran = [s for s, d in decisions.items() if d.run]
    assert ran and ran[0] == stage, (kind, how, {s: d.reason for s, d in decisions.items()})
    reason = decisions[stage].reason
    assert name in reason and ("missing" if how == "deleted" else "changed since it was written") in reason
    # Repaired: the same recalls as before the damage (a model trained again is the same
    # model), and the run after reuses everything.
    assert recalls(wd) == recalls(built[0])
    assert not any(d.run for d in next_run(wd, cfg).values())


@pytest.mark.slow
@pytest.mark.parametrize("how", DAMAGES)
def test_a_run_of_one_stage_repairs_what_it_reads_first(how, built, copy):
    """`mule run evaluate` with the trained model damaged: train runs again before it. The
    model trained again has the same weights, so it is the same model to the registry
    (the identity it registers under), though its file is another (a new time in it)."""
    from mule.experiments.registry import model_identity
    from mule.pipeline.decisions import read_record

    wd, cfg, before = copy
    identity = model_identity(read_record(wd, cfg, "train"))
    damage(wd.model_path("embedded", "model"), how)
    decisions = next_run(wd, cfg, ["evaluate"])
    assert list(decisions) == ["train", "evaluate"] and decisions["train"].run
    assert recalls(wd) == recalls(built[0])
    assert read_record(wd, cfg, "train")["outputs"] != before["train"]  # another file
    assert model_identity(read_record(wd, cfg, "train")) == identity  # the same model


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.slow
def test_derived_files_are_rebuilt_and_caches_start_empty(how, built, copy):
    wd, cfg, before = copy
    for name in ("catalog.duckdb", "state/file_hashes.json", "workdir.json", "mule.lock"):
        if (wd.root / name).exists():
            damage(wd.root / name, how)
    from mule.experiments.relocation import adopt

    adopt(wd)
    decisions = next_run(wd, cfg)
    assert not any(d.run for d in decisions.values()), {s: d.reason for s, d in decisions.items() if d.run}
    assert Catalog(wd).query("SELECT count(*) AS n FROM images")["n"][0].as_py() == 40  # the views, rebuilt


@pytest.mark.parametrize("how", ("cut", "garbage"))
@pytest.mark.slow
def test_an_unreadable_stage_record_counts_as_none(how, built, copy):
    wd, cfg, before = copy
    damage(wd.stage_record_path("embedded", "text", ""), how)
    decisions = next_run(wd, cfg)
    assert [s for s, d in decisions.items() if d.run] == ["text"]
    assert "record state/stages/embedded/text.json is unreadable" in decisions["text"].reason
    assert outputs(wd, cfg)["text"] == before["text"]  # the same word vectors


@pytest.mark.parametrize("how", ("cut", "garbage"))
@pytest.mark.slow
def test_a_damaged_checkpoint_or_journal_is_left_behind(how, built, copy, caplog):
    """Files a stopped run leaves for the next one to resume from: a damaged one is not resumed from."""
    wd, cfg, before = copy
    checkpoint = wd.checkpoint_path("embedded", "model")
    checkpoint.write_bytes(wd.model_path("embedded", "model").read_bytes())
    damage(checkpoint, how)
    journal = wd.table_path("translations", "embedded").with_name("embedded.journal.jsonl")
    journal.write_bytes(b'{"backend": "lexicon"}\n[1, 2]\n' + os.urandom(64) + b"\n")
    runner = Runner(wd, untracked())
    runner.run(cfg, "translate", force=True)
    runner.run(cfg, "train", force=True)
    assert "training starts from epoch 1" in caplog.text
    assert recalls(wd) == recalls(built[0])


@pytest.mark.slow
@pytest.mark.parametrize("how", ("cut", "garbage"))
def test_what_mule_cannot_repair_is_one_line_naming_the_file(how, built, copy, monkeypatch):
    from mlflow.tracking import MlflowClient

    from mule.experiments import mlflow_store
    from mule.flows.environment import check_prefect_database

    wd, _, _ = copy
    MlflowClient(wd.mlflow_uri).create_experiment("mule/embedded")  # a real store (these stages ran untracked)
    store = wd.root / "mlflow.db"
    damage(store, how)
    with pytest.raises(Exception) as error:
        mlflow_store.check_store(wd)
    assert is_user_error(error.value) and str(store) in str(error.value) and "mv " in str(error.value)

    database = wd.root / "prefect" / "prefect.db"
    database.parent.mkdir(exist_ok=True)
    shutil.copy(store, database)  # as damaged
    monkeypatch.setenv("PREFECT_HOME", str(database.parent))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with pytest.raises(Exception) as error:
        check_prefect_database()
    assert is_user_error(error.value) and str(database) in str(error.value) and "rm -r" in str(error.value)


def test_a_typo_in_mule_s_own_sql_is_a_bug_not_a_missing_table(built, copy):
    import duckdb

    wd, _, _ = copy
    catalog = Catalog(wd)
    with pytest.raises(duckdb.CatalogException):  # keeps its traceback: not one of the user's errors
        catalog.query("SELECT * FROM captoins")
    (wd.catalog_dir / "word_vectors" / "embedded.parquet").unlink()
    catalog.refresh_views()
    with pytest.raises(Exception) as error:  # a table a stage has not written yet: the user's next step
        catalog.query("SELECT * FROM word_vectors")
    assert is_user_error(error.value) and "mule run text" in str(error.value)


def test_a_run_stopped_after_writing_its_output_and_before_its_record_is_finished_not_called_damage(copy,
        monkeypatch):  # fmt: skip
    """Ctrl-C the moment training is done: model.pt is rewritten, the record is not. The
    next run says it finishes that run (from its checkpoint), not that a file was damaged."""
    wd, cfg, _ = copy
    real_record = decisions.record

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(decisions, "record", stopped)
    with pytest.raises(KeyboardInterrupt):
        Runner(wd, untracked()).run(cfg, "train", force=True)
    monkeypatch.setattr(decisions, "record", real_record)
    decision = Runner(wd).decide(cfg, "train")
    assert decision.run and decision.reason.startswith("finishing its run of "), decision.reason
    assert "stopped before it was recorded; it resumes its checkpoint" in decision.reason
    assert "damaged" not in decision.reason
    Runner(wd, untracked()).run(cfg, "train", decision=decision)
    assert not Runner(wd).decide(cfg, "train").run  # recorded now: the marker is gone


@pytest.mark.slow
def test_a_deleted_mlflow_experiment_loses_no_model_even_after_mlflow_gc(copy, capsys):
    """Deleting the dataset's experiment in MLflow's UI keeps it, deleted, in the store, and
    MLflow refuses every run in it. mule sets it aside under a name of its own (still
    deleted, its runs and the champion's files kept: the champion still loads) and starts
    a new one, said in one line. When `mlflow gc` removes the set-aside runs anyway, the
    champion cannot be loaded: `mule search` says so and what publishes it again, and
    `mule run train`, with nothing to compute, publishes the workdir's model again, the new
    version the champion in the lost one's place."""
    import subprocess

    from mlflow.tracking import MlflowClient

    from mule.commands.main import main
    from mule.experiments import tracking

    wd, _, _ = copy
    options = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    assert main(["run", "train", "--workdir", str(wd.root), *options]) == 0  # published and registered: v1
    client = MlflowClient(wd.mlflow_uri)
    experiment = tracking.experiment_id(wd, "embedded")
    client.delete_experiment(experiment)
    capsys.readouterr()
    assert main(["run", "train", "--workdir", str(wd.root), "--force", "train", *options]) == 0
    said = capsys.readouterr().err
    assert f"the MLflow experiment 'mule/embedded' (id {experiment}) was deleted: set aside as 'mule/embedded (deleted, " \
           "set aside " in said and "this run starts a new one" in said  # fmt: skip
    assert client.get_experiment(experiment).lifecycle_stage == "deleted"  # still deleted, its runs kept
    assert client.get_experiment_by_name("mule/embedded").experiment_id != experiment
    assert main(["search", "a red circle", "--workdir", str(wd.root)]) == 0  # the champion loads
    # what the old advice said to do: remove the deleted experiment's runs for good
    gc = subprocess.run([sys.executable, "-m", "mlflow", "gc", "--backend-store-uri", wd.mlflow_uri,
                         "--experiment-ids", experiment], capture_output=True, text=True,
                        env={**os.environ, "MLFLOW_TRACKING_URI": wd.mlflow_uri})  # fmt: skip
    assert gc.returncode == 0, gc.stderr[-2000:]
    capsys.readouterr()
    assert main(["search", "a red circle", "--workdir", str(wd.root)]) == 2
    err = capsys.readouterr().err
    assert "publishes it again from the workdir" in err and "Traceback" not in err
    assert main(["run", "train", "--workdir", str(wd.root), *options]) == 0  # nothing to compute
    err = capsys.readouterr().err
    assert "train: the registered model cannot be loaded" in err and "publishing it again from" in err
    champion = client.get_model_version_by_alias("mule-embedded", "champion")
    assert champion.tags["mule.champion_decision"].startswith("champion v")
    assert "cannot be loaded" in champion.tags["mule.champion_decision"]
    assert main(["search", "a red circle", "--workdir", str(wd.root)]) == 0
