
"""A new workdir's MLflow and Prefect databases are copies of templates made once
(storage/store_templates.py): each copy is its own, a damaged template is made
again, and without a writable cache the library makes its database as before."""

import sqlite3

import pytest

from mule.storage.store_templates import from_template
from mule.storage.workdir import Workdir


def make_table(calls: list):
    def make(path):
        calls.append(path)
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE t (x INTEGER)")

    return make


def tables(path) -> list[str]:
    with sqlite3.connect(path) as con:
        return [row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]


def test_made_once_then_copied(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls = []
    assert from_template(tmp_path / "a" / "x.db", "thing-1.0", make_table(calls))
    assert from_template(tmp_path / "b" / "x.db", "thing-1.0", make_table(calls))
    assert len(calls) == 1 and tables(tmp_path / "b" / "x.db") == ["t"]
    assert sorted(p.name for p in (tmp_path / "cache" / "mule" / "templates").iterdir()) == ["thing-1.0.db"]
    # an existing database is never replaced
    with sqlite3.connect(tmp_path / "a" / "x.db") as con:
        con.execute("INSERT INTO t VALUES (7)")
    assert not from_template(tmp_path / "a" / "x.db", "thing-1.0", make_table(calls))
    with sqlite3.connect(tmp_path / "a" / "x.db") as con:
        assert con.execute("SELECT x FROM t").fetchall() == [(7,)]
    with sqlite3.connect(tmp_path / "b" / "x.db") as con:  # copies are their own
        assert con.execute("SELECT x FROM t").fetchall() == []


def test_a_damaged_template_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    template = tmp_path / "cache" / "mule" / "templates" / "thing-1.0.db"
    template.parent.mkdir(parents=True)
    template.write_bytes(b"SQLite format 3\x00" + b"\x07" * 2000)
    calls = []
    assert from_template(tmp_path / "a.db", "thing-1.0", make_table(calls))
    assert len(calls) == 1 and tables(tmp_path / "a.db") == ["t"]


def test_no_template_leaves_the_database_to_its_library(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert not from_template(tmp_path / "a.db", "thing-1.0", make_table([]))
    assert not (tmp_path / "a.db").exists()

    def failing(path):
        raise RuntimeError("the library changed")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache2"))
    assert not from_template(tmp_path / "a.db", "thing-1.0", failing)
    assert not (tmp_path / "a.db").exists() and not list((tmp_path / "cache2" / "mule" / "templates").iterdir())


@pytest.mark.slow
def test_mlflow_store_from_the_template_is_a_working_store_of_this_workdir(tmp_path, monkeypatch):
    from mule.experiments import mlflow_store, tracking

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first, second = Workdir.at(tmp_path / "w1"), Workdir.at(tmp_path / "w2")
    assert mlflow_store.seed_store(first) and mlflow_store.seed_store(second)
    assert not mlflow_store.seed_store(first)
    experiment = tracking.experiment_id(first, "embedded")
    client = tracking.client(first)
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "val.mean_mR", 60.5)
    assert client.get_run(run.info.run_id).data.metrics == {"val.mean_mR": 60.5}
    assert tracking.client(second).get_experiment_by_name("mule/embedded") is None
    default = tracking.client(second).get_experiment("0")
    assert default.name == "Default" and default.artifact_location == str(second.artifacts_dir / "0")
    assert mlflow_store.recorded_artifact_root(second) is None  # a new workdir, not a moved one
    mlflow_store.check_self_contained(first)
    from importlib.metadata import version  # one template per MLflow version

    assert (tmp_path / "cache" / "mule" / "templates" / f"mlflow-{version('mlflow')}.db").exists()


@pytest.mark.slow
def test_a_store_first_opened_by_a_flow_comes_from_the_template_too(tmp_path, monkeypatch):
    """A stage flow run in-process or by a Prefect worker never goes through `mule`'s
    set-up: the first MLflow client of a workdir copies the template all the same."""
    from mule.experiments import mlflow_store, tracking

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    seeded, opened = Workdir.at(tmp_path / "seeded"), Workdir.at(tmp_path / "opened")
    mlflow_store.seed_store(seeded)
    default = tracking.client(opened).get_experiment("0")  # no seed_store before it
    assert default.artifact_location == str(opened.artifacts_dir / "0")  # MLflow's own store says ./mlruns
    assert tables(opened.root / "mlflow.db") == tables(seeded.root / "mlflow.db")


@pytest.mark.slow
def test_prefect_database_from_the_template_is_migrated_to_the_installed_version(tmp_path, monkeypatch):
    from mule.flows.environment import seed_prefect_home

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home1"))
    assert seed_prefect_home()  # makes the template (Prefect's own migrations, in a process of their own)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home2"))
    assert seed_prefect_home() and not seed_prefect_home()  # copied; then there, left alone
    with sqlite3.connect(tmp_path / "home2" / "prefect.db") as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall()
        assert con.execute("SELECT count(*) FROM flow_run").fetchone() == (0,)  # empty: no history carried
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home3"))
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "postgresql+asyncpg://db/prefect")
    assert not seed_prefect_home() and not (tmp_path / "home3").exists()  # the user's own database
