"""The champion alias moves only on improvement, among comparable models, and is a fact
after any stop in publishing (real MLflow, SQLite in a temp dir)."""

import pytest

from mule.experiments import registry, tracking
from mule.mule_core.metrics import measure_of
from mule.storage.workdir import Workdir

MEASURE = measure_of((1, 5, 10))


def toy_run(client, experiment: str) -> str:
    """A run holding a model (its model.pt), as a train run that registers one does."""
    run = client.create_run(experiment).info.run_id
    client.log_text(run, "weights", "model.pt")
    return run


def test_the_champion_moves_only_when_a_comparable_model_is_better_and_test_results_are_tagged(tmp_path):
    wd = Workdir.at(tmp_path)
    client = tracking.client(wd)
    experiment = tracking.experiment_id(wd, "toy")

    def candidate(val_mr: float, val_images: list[str], languages=("en", "de"), split="test") -> registry.Candidate:
        run = toy_run(client, experiment)
        return registry.Candidate("toy", run, f"runs:/{run}/model", val_mr, languages,
                                  registry.split_digest(val_images), split, measure=MEASURE)  # fmt: skip

    val = ["img-3", "img-1", "img-2"]
    decisions = [
        registry.register(wd, candidate(50.0, val)),  # v1: the first is champion
        registry.register(wd, candidate(40.0, val)),  # v2: worse, stays behind
        registry.register(wd, candidate(60.0, list(reversed(val)))),  # v3: better (same images, any order)
        registry.register(wd, candidate(70.0, ["img-9"])),  # v4: other validation images: not comparable
        registry.register(wd, candidate(75.0, val, ("en",))),  # v5: other languages: not comparable
        registry.register(wd, candidate(60.0, val)),  # v6: a tie does not beat
        # v7: evaluated on another split (eval.split=test_2017): validation is what is compared
        registry.register(wd, candidate(65.0, val, split="test_2017")),
    ]
    assert [d["version"] for d in decisions] == [1, 2, 3, 4, 5, 6, 7]
    assert [d["champion"] for d in decisions] == [True, False, True, False, False, False, True]
    assert client.get_model_version_by_alias("mule-toy", "champion").version == 7
    assert decisions[0]["why"] == "first model of this dataset"
    assert decisions[2]["why"] == "val mR 60.00 beats champion v1 (50.00)"
    assert decisions[3]["why"].startswith("not comparable with champion v3")
    assert decisions[4]["why"].startswith("not comparable with champion v3")
    assert decisions[5]["why"] == "val mR 60.00 does not beat champion v3 (60.00)"
    version = client.get_model_version("mule-toy", "2")
    assert version.tags["mule.val_mR"] == "40.0000" and version.tags["mule.languages"] == "en,de"
    assert version.tags["mule.champion_decision"] == decisions[1]["why"]

    # The evaluate stage adds the mR of the split it measured to the version its model's train run registered.
    table = {"en": {"mR": 41.25}}
    run = client.get_model_version("mule-toy", "5").run_id
    assert registry.tag_test_results(wd, "toy", {"run_id": run}, "test_2016", 41.25, table) == 5
    tags = client.get_model_version("mule-toy", "5").tags
    assert tags["mule.test_2016.mR"] == "41.2500" and tags["mule.test_2016.mR.en"] == "41.2500"
    assert registry.tag_test_results(wd, "toy", {"run_id": "no-such-run"}, "test_2016", 41.25, table) is None


def test_a_model_extending_the_champion_takes_its_place_and_one_reading_fewer_languages_never_does(tmp_path):
    """A language added to the champion (its weights unchanged: the version names the models
    it extends) becomes the champion; a base trained again, better on validation but without
    the added language, stays behind with the command that adds it; added to, it competes."""
    wd = Workdir.at(tmp_path)
    client = tracking.client(wd)
    experiment = tracking.experiment_id(wd, "toy")
    val = registry.split_digest(["img-1", "img-2"])

    def candidate(val_mr: float, languages, identity: str, extends=()) -> registry.Candidate:
        run = toy_run(client, experiment)
        return registry.Candidate("toy", run, f"runs:/{run}/model", val_mr, languages, val, "test", identity, MEASURE,
                                  extends)  # fmt: skip

    base = registry.register(wd, candidate(50.0, ("en", "de"), "base-1"))
    added = registry.register(wd, candidate(50.0, ("en", "de", "es"), "base-1+es", ("base-1",)))
    retrained = registry.register(wd, candidate(60.0, ("en", "de"), "base-2"))
    readded = registry.register(wd, candidate(60.0, ("en", "de", "es"), "base-2+es", ("base-2",)))
    assert [d["champion"] for d in (base, added, retrained, readded)] == [True, True, False, True]
    assert added["why"] == "champion v1 with es added (its languages read by the same weights: bit-identical)"
    assert retrained["why"].startswith("reads fewer languages than champion v2 (not es): add them to it (mule run "
                                       "add-language --lang es)")  # fmt: skip
    assert readded["why"] == "val mR 60.00 beats champion v2 (50.00)"
    assert client.get_model_version("mule-toy", "2").tags["mule.extends"] == "base-1"


def test_the_champion_s_training_stored_at_another_precision_takes_its_place_and_a_tie_never_does(tmp_path):
    """Upgrading: the champion stored its tables in float32 (its weights are its training's);
    the same training stored in int8 is another file, but the same model measured the same:
    it serves in its place, as does a float16 store after it. Another training tying on
    validation stays behind, as a tie always does."""
    wd = Workdir.at(tmp_path)
    client = tracking.client(wd)
    experiment = tracking.experiment_id(wd, "toy")
    val = registry.split_digest(["img-1", "img-2"])

    def candidate(identity: str, trained: str = "") -> registry.Candidate:
        run = toy_run(client, experiment)
        return registry.Candidate("toy", run, f"runs:/{run}/model", 61.5, ("en", "de"), val, "test", identity,
                                  MEASURE, trained_identity=trained)  # fmt: skip

    float32 = registry.register(wd, candidate("a" * 16))  # stored before tables were rounded: no trained identity
    int8 = registry.register(wd, candidate("b" * 16, trained="a" * 16))
    other = registry.register(wd, candidate("c" * 16, trained="c" * 16))  # another training, the same val mR
    float16 = registry.register(wd, candidate("d" * 16, trained="a" * 16))
    assert [d["champion"] for d in (float32, int8, other, float16)] == [True, True, False, True]
    assert int8["why"] == "the training of champion v1, stored anew (another output.tables): it serves in its place"
    assert other["why"] == "val mR 61.50 does not beat champion v2 (61.50)"
    assert float16["why"].startswith("the training of champion v2, stored anew")
    assert client.get_model_version("mule-toy", "2").tags["mule.trained_identity"] == "a" * 16
    assert client.get_model_version_by_alias("mule-toy", "champion").version == 4


def test_a_trained_model_is_registered_once_whoever_publishes_it(tmp_path):
    """The train publisher asks first whether its model (train key and weights' digest) is
    registered already: a run stopped after registering, before its record said so, leaves
    one version, not two, when the next run publishes."""
    wd = Workdir.at(tmp_path)
    client = tracking.client(wd)
    experiment = tracking.experiment_id(wd, "toy")
    record = {"key": "k1", "outputs": {"models/toy/model.pt": "abc"}}
    identity = registry.model_identity(record)
    assert identity != registry.model_identity({**record, "outputs": {"models/toy/model.pt": "other weights"}})
    assert registry.registered_for(wd, "toy", identity) is None
    run = toy_run(client, experiment)
    first = registry.register(wd, registry.Candidate("toy", run, f"runs:/{run}/model", 50.0, ("en",),
                                                     registry.split_digest(["a"]), "test", identity, MEASURE))  # fmt: skip
    again = registry.registered_for(wd, "toy", identity)
    assert again["version"] == first["version"] == 1 and again["champion"] is True
    later = toy_run(client, experiment)  # the run that published it after the stop
    assert registry.tag_test_results(wd, "toy", {**record, "run_id": later}, "test_2016", 41.0, {"en": {"mR": 41.0}}) == 1


@pytest.mark.slow
def test_mlflow_checks_a_model_s_requirements_with_mule_s_cached_package_map():
    """Logging or loading a model, MLflow maps every installed module to its distribution
    (1.4-2 s of RECORD files per process); it gets mule's cached map instead, and still
    warns about a requirement the environment does not meet. In a fresh process, where
    MLflow has built no map yet; reading RECORD files there would raise."""
    import subprocess
    import sys

    script = """
import importlib_metadata, logging, sys
def no(*args, **kwargs):
    raise AssertionError("MLflow read every RECORD file")
importlib_metadata.packages_distributions = no
from mlflow.utils import requirements_utils
from mule.experiments.tracking import mlflow_knows_installed_packages
mlflow_knows_installed_packages()
assert requirements_utils.importlib_metadata is importlib_metadata  # put back
assert requirements_utils._MODULES_TO_PACKAGES["duckdb"] == ["duckdb"]
seen = []
logging.getLogger("mlflow.utils.requirements_utils").addHandler(logging.Handler())
logging.Handler.emit = lambda self, record: seen.append(record.getMessage())
requirements_utils.warn_dependency_requirement_mismatches(["duckdb==0.0.1", "numpy"])
print(seen)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    warning = done.stdout
    assert "duckdb (current: " in warning and "required: duckdb==0.0.1" in warning and "numpy" not in warning


@pytest.mark.slow
def test_comparable_means_the_same_language_set_validation_images_and_measure(tmp_path):
    """A model validated with eval.ks=1,5,10,16 has a higher mR for the same ranking (R@16
    is easier): never compared with one over 1,5,10. The same languages in another order
    are the same languages. A version registered before versions carried their measure is
    read from its train run's eval.ks."""
    wd = Workdir.at(tmp_path)
    client = tracking.client(wd)
    experiment = tracking.experiment_id(wd, "toy")
    val = registry.split_digest(["img-1", "img-2"])

    def publish(val_mr: float, languages=("en", "de", "fr", "cs"), ks=(1, 5, 10), tagged=True) -> dict:
        run = toy_run(client, experiment)
        client.log_param(run, "eval.ks", ",".join(map(str, ks)))  # as every stage run logs its config
        return registry.register(wd, registry.Candidate("toy", run, f"runs:/{run}/model", val_mr, languages, val, "test",
                                                        f"model-{val_mr}", measure_of(ks) if tagged else ""))  # fmt: skip

    first = publish(36.68)
    wider = publish(44.49, ks=(1, 5, 10, 16))
    reordered = publish(40.0, languages=("de", "en", "fr", "cs"))
    untagged = publish(41.0, tagged=False)
    assert [first["champion"], wider["champion"], reordered["champion"], untagged["champion"]] == [True, False, True, True]
    assert wider["why"] == ("not comparable with champion v1 (other measure: v1 mean of R@1,5,10 against v2 mean "
                            "of R@1,5,10,16 (VSE++ R@K both directions, ties against the model)); promote it by hand "
                            "if it should serve")  # fmt: skip
    assert reordered["why"] == "val mR 40.00 beats champion v1 (36.68)"
    assert untagged["why"] == "val mR 41.00 beats champion v3 (40.00)"
    assert client.get_model_version("mule-toy", "2").tags["mule.val_measure"] == measure_of((16, 10, 5, 1))
    english = publish(90.0, languages=("en",))
    assert english["why"].startswith("not comparable with champion v4 (other languages: v4 cs,de,en,fr against v5 en)")


def test_a_model_with_the_weights_of_a_registered_version_is_that_version():
    """A model's identity is its weights' digest, which its train stage's result carries: a
    model.pt damaged and trained again to the same weights (a new file, a new time in it)
    is the version it was; other weights are another model."""
    record = {"key": "k1", "outputs": {"models/toy/model.pt": "file digest 1"}, "result": {"weights_digest": "w1"}}
    again = {"key": "k1", "outputs": {"models/toy/model.pt": "file digest 2"}, "result": {"weights_digest": "w1"}}
    other = {**record, "result": {"weights_digest": "w2"}}
    assert registry.model_identity(record) == registry.model_identity(again) == "w1" != registry.model_identity(other)


def test_a_version_registered_before_identities_were_weights_is_found_by_its_weights(tmp_path):
    """A version registered under the identity mule used before (a digest of the train
    stage's key and files, 24 digits long): after upgrading, the train stage runs again to
    the same weights, and the registry finds that version by its run's model.pt (and tags
    it with its weights' digest, so the next look reads no file)."""
    import torch

    from mule.config.resolution import resolve
    from mule.data_catalog.model_files import model_digest, save_model
    from mule.mule_core.model import MuleModel
    from mule.mule_core.vocabulary import Vocab, Vocabulary

    wd = Workdir.at(tmp_path)
    cfg = resolve("demo", {"text.word_dim": 2, "model.subwords": "false"})
    torch.manual_seed(0)
    model = MuleModel(["en"], {"en": 3}, 2, None, cfg.model)
    file = tmp_path / "model.pt"
    save_model(file, model, cfg, Vocabulary(["en"], {"en": Vocab(["<pad>", "<unk>", "dog"])}, {"en": torch.randn(3, 2)}))
    client = tracking.client(wd)
    run = toy_run(client, tracking.experiment_id(wd, "toy"))
    client.log_artifact(run, str(file))
    old = registry.model_identity({"key": "k1", "outputs": {"models/toy/model.pt": "file digest"}})
    assert len(old) == 24
    registry.register(wd, registry.Candidate("toy", run, f"runs:/{run}/model", 50.0, ("en",), registry.split_digest(["a"]),
                                             "test", old, MEASURE))  # fmt: skip
    weights = model_digest(file)
    found = registry.registered_for(wd, "toy", weights)
    assert found is not None and found["version"] == 1
    assert client.get_model_version("mule-toy", "1").tags["mule.model_identity"] == weights
    assert registry.registered_for(wd, "toy", "0123456789abcdef") is None  # other weights: another model


class Stopped(KeyboardInterrupt):
    """A Ctrl-C between two of the registry's writes."""


class StoppingClient:
    """MLflow's client, stopped (Ctrl-C) just before its n-th write; counts the writes."""

    WRITES = ("create_registered_model", "create_model_version", "set_registered_model_alias", "set_model_version_tag",
              "set_tag", "delete_tag")  # fmt: skip

    def __init__(self, client, stop_before: int | None):
        self.client, self.stop_before, self.writes = client, stop_before, 0

    def __getattr__(self, name):
        attribute = getattr(self.client, name)
        if name not in self.WRITES:
            return attribute

        def write(*args, **kwargs):
            self.writes += 1
            if self.writes == self.stop_before:
                raise Stopped()
            return attribute(*args, **kwargs)

        return write


def _state(wd: Workdir) -> list[tuple]:
    """The registry as a user sees it: each model's version, its decision, whether it is champion."""
    client = tracking.client(wd)
    champion = client.get_model_version_by_alias("mule-toy", "champion").version
    return sorted((int(v.version), v.tags.get("mule.model_identity"), v.tags.get("mule.val_mR"),
                   v.tags.get("mule.champion_decision"), v.version == champion)
                  for v in client.search_model_versions("name = 'mule-toy'"))  # fmt: skip


@pytest.mark.parametrize("history", [(), (50.0,), (70.0,), (90.0, 40.0)],
                         ids=["first model", "a better one", "a worse one", "two before"])
@pytest.mark.parametrize("next_model", ["the same model", "another model"])
@pytest.mark.slow
def test_the_champion_is_a_fact_after_a_stop_between_any_two_registry_writes(tmp_path, monkeypatch, history, next_model):
    """Publishing a model (val mR 60) stopped before each of its registry writes in turn;
    then the next run publishes either the same model again (registered_for, then register
    when nothing was registered, as the train publisher does) or another model (val mR 55:
    the settings changed). The registry then holds what an uninterrupted run leaves: one
    version per model, the same decisions, the same champion; a model stopped before its
    first write (the intent on its run) was never published, and is not there."""
    real_client = tracking.client

    def publish(wd: Workdir, val_mr: float, identity: str, stop_before: int | None = None) -> int:
        client = StoppingClient(real_client(wd), stop_before)
        monkeypatch.setattr(tracking, "client", lambda _wd: client)
        try:
            if registry.registered_for(wd, "toy", identity) is None:
                run = toy_run(client, tracking.experiment_id(wd, "toy"))
                registry.register(wd, registry.Candidate("toy", run, f"runs:/{run}/model", val_mr, ("en",),
                                                         registry.split_digest(["a"]), "test", identity, MEASURE))  # fmt: skip
        finally:
            monkeypatch.setattr(tracking, "client", real_client)
        return client.writes

    def earlier(wd: Workdir) -> None:
        for n, val_mr in enumerate(history):
            publish(wd, val_mr, f"earlier-{n}")

    following = (60.0, "new") if next_model == "the same model" else (55.0, "other")
    reference = Workdir.at(tmp_path / "reference")
    earlier(reference)
    writes = publish(reference, 60.0, "new")
    assert writes >= 5 - (1 if history else 0)  # the intent, the version, its decision, the alias (or not), settled
    publish(reference, *following)
    expected = _state(reference)
    never = Workdir.at(tmp_path / "never-published")
    earlier(never)
    publish(never, *following)
    for stop_before in range(1, writes + 1):
        wd = Workdir.at(tmp_path / f"stopped-before-write-{stop_before}")
        earlier(wd)
        with pytest.raises(Stopped):
            publish(wd, 60.0, "new", stop_before)
        publish(wd, *following)  # the next run
        want = _state(never) if stop_before == 1 and following[1] == "other" else expected
        assert _state(wd) == want, f"stopped before write {stop_before}"
        publish(wd, *following)  # and the one after changes nothing
        assert _state(wd) == want


def _publish(wd: Workdir, val_mr: float, identity: str) -> dict:
    """What the train publisher does with a trained model: the version its weights have, else a new one."""
    client = tracking.client(wd)
    found = registry.registered_for(wd, "toy", identity)
    if found is not None:
        return found
    run = toy_run(client, tracking.experiment_id(wd, "toy"))
    return registry.register(wd, registry.Candidate("toy", run, f"runs:/{run}/model", val_mr, ("en",),
                                                    registry.split_digest(["a"]), "test", identity, MEASURE))  # fmt: skip


def test_a_version_deleted_by_hand_never_comes_back_and_a_champion_set_by_hand_stays(tmp_path):
    """docs/operations.md: delete the champion in MLflow's UI and set `champion` on another
    version; the next model published (worse than the deleted one, not better than the one
    chosen) is registered beside them, and the choice stands."""
    wd = Workdir.at(tmp_path)
    client = tracking.client(wd)
    assert [_publish(wd, mr, f"model-{mr:g}")["version"] for mr in (31.72, 37.72)] == [1, 2]
    assert str(client.get_model_version_by_alias("mule-toy", "champion").version) == "2"
    client.delete_model_version("mule-toy", "2")  # as MLflow's UI does
    client.set_registered_model_alias("mule-toy", "champion", "1")

    decided = _publish(wd, 29.74, "model-29.74")
    versions = {str(v.version): v.tags["mule.val_mR"] for v in client.search_model_versions("name = 'mule-toy'")}
    assert versions == {"1": "31.7200", "3": "29.7400"}  # v2 stays deleted
    assert {k: v for k, v in decided.items() if k != "run_id"} == {
        "model": "mule-toy", "version": 3, "champion": False, "why": "val mR 29.74 does not beat champion v1 (31.72)"}
    assert str(client.get_model_version_by_alias("mule-toy", "champion").version) == "1"
    assert _publish(wd, 33.0, "model-33")["champion"] is True  # until a better comparable model comes
    assert not any(registry.INTENT in r.data.tags for r in client.search_runs([tracking.experiment_id(wd, "toy")]))


def test_a_registered_model_deleted_by_hand_starts_again_with_the_next_model_alone(tmp_path):
    wd = Workdir.at(tmp_path)
    client = tracking.client(wd)
    for mr in (40.0, 50.0):
        _publish(wd, mr, f"model-{mr:g}")
    client.delete_registered_model("mule-toy")
    decided = _publish(wd, 45.0, "model-45")
    assert [(str(v.version), v.tags["mule.val_mR"]) for v in client.search_model_versions("name = 'mule-toy'")] == [
        ("1", "45.0000")]
    assert decided["champion"] is True and decided["why"] == "first model of this dataset"


def test_an_intent_written_before_intents_ended_is_not_carried_out(tmp_path):
    """Workdirs from before: every registered run still carries its intent, without
    `"ends": true`. Such an intent is taken as ended (and removed), so a version deleted
    before the upgrade does not come back either."""
    import dataclasses
    import json

    wd = Workdir.at(tmp_path)
    client = tracking.client(wd)
    _publish(wd, 40.0, "model-40")
    run = toy_run(client, tracking.experiment_id(wd, "toy"))
    old = registry.Candidate("toy", run, f"runs:/{run}/model", 90.0, ("en",), registry.split_digest(["a"]), "test",
                             "deleted-by-hand", MEASURE)  # fmt: skip
    client.set_tag(run, registry.INTENT, json.dumps(dataclasses.asdict(old)))  # as mule wrote it before
    _publish(wd, 45.0, "model-45")
    assert sorted(v.tags["mule.val_mR"] for v in client.search_model_versions("name = 'mule-toy'")) == [
        "40.0000", "45.0000"]
    assert registry.INTENT not in client.get_run(run).data.tags


def test_a_version_that_is_not_there_is_said_with_the_versions_that_are(tmp_path):
    wd = Workdir.at(tmp_path)
    for mr in (40.0, 50.0):
        _publish(wd, mr, f"model-{mr:g}")
    with pytest.raises(registry.RegistryError, match=r"^registered model mule-toy has no version 99 in .* \(its "
                                                     r"versions: 1, 2\): pass one of them, or --run RUN_ID$"):  # fmt: skip
        registry.resolve_model_file(wd, "toy", version="99")
