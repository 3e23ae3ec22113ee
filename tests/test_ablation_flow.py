"""The ablation sweep end to end on a tiny generated dataset (real Prefect and MLflow):
`mule run ablation` runs what it needs first, then every row's models, each decided by
the stage's key for its config; a rerun trains nothing."""

import csv

import pytest
from mlflow.tracking import MlflowClient

from mule.config.overrides import apply_overrides
from mule.config.resolution import resolve
from mule.experiments.report import ablation_markdown
from mule.mule_core.metrics import chance_recalls
from mule.pipeline.sweeps import CHANCE, RUN_ORDER, RowResult, compare, english_models, grid, row_result
from mule.storage.workdir import Workdir

TINY = {
    "data.train_images": 32,
    "data.val_images": 12,
    "data.test_images": 16,
    "data.image_size": 48,
    "features.input_size": 32,
    "vectors.fasttext_epochs": 2,
    "vectors.fasttext_buckets": 100_000,
    "text.word_dim": 64,  # the mechanics, not the default dimension: faster
    "pretrain.epochs": 1,
    "pretrain.batch_images": 16,
    "train.epochs": 2,
    "train.batch_images": 16,
    "loss.mining_warmup_steps": 2,  # one epoch of 32 images
    "pretrain.mining_warmup_steps": 2,
    "eval.examples": 0,
}
ROWS = ["EmbN (one model per language)", "Translate the query (EmbN en + word table)", "PARALLEL-EmbN", "MULE EmbN",
        "MULE + NC", "MULE + NC + LC", "MULE + NC + LC + LP (full)"]  # fmt: skip


def test_the_grid_names_the_paper_rows_and_switches_one_thing_at_a_time():
    rows = grid(["en", "de", "fr", "cs"])
    assert [r.name for r in rows] == [n for n in ROWS if not n.startswith("Translate")]
    assert [m.overrides["data.languages"] for m in rows[0].models] == ["en", "de", "fr", "cs"]
    mule = {r.name: r.models[0].overrides for r in rows[2:]}
    switches = [(o["loss.nc"], o["loss.lc"], o["pretrain.enabled"]) for o in mule.values()]
    assert switches == [(False, False, False), (True, False, False), (True, True, False), (True, True, True)]
    names = [m.overrides["output.model_name"] for r in rows for m in r.models]
    assert len(names) == len(set(names))  # one model file (and one record) per model
    # Table 2 is human captions only, even under a preset that reads MT (some-photos)
    assert {m.overrides["data.captions"] for r in rows for m in r.models} == {"human"}


def test_rows_train_the_most_wanted_answer_first():
    """A run stopped halfway holds the full model and what LP, LC, NC and the MULE layer each
    add (the run order); the report keeps the paper's order."""
    every = [r.name for r in grid(["en", "de"], with_mt=True)]
    assert sorted(RUN_ORDER) == sorted(every)
    assert RUN_ORDER[:5] == ("MULE + NC + LC + LP (full)", "MULE + NC + LC", "MULE + NC", "MULE EmbN", "PARALLEL-EmbN")
    assert RUN_ORDER.index("EmbN (one model per language)") < RUN_ORDER.index("MULE full + MT")


def test_table_4_rows_come_with_the_translate_stages_output():
    assert [r.name for r in grid(["en", "de"])] == [r.name for r in grid(["en", "de"], with_mt=False)]
    rows = {r.name: r for r in grid(["en", "de"], with_mt=True)}
    assert list(rows)[-4:] == ["EmbN + MT", "PARALLEL-EmbN + MT", "MULE full + MT", "MULE full, MT only"]
    assert [m.overrides["data.captions"] for m in rows["EmbN + MT"].models] == ["human+mt", "human+mt"]
    assert rows["MULE full + MT"].models[0].overrides["data.captions"] == "human+mt"
    assert rows["MULE full + MT"].models[0].overrides["pretrain.enabled"] is True
    assert rows["MULE full, MT only"].models[0].overrides["data.captions"] == "mt"
    slugs = [m.slug for r in rows.values() for m in r.models]
    assert len(slugs) == len(set(slugs))  # every model its own file
    # translate-the-query keeps using the English EmbN trained on human captions only
    english = english_models([m for r in rows.values() for m in r.models])
    assert [m.overrides["output.model_name"] for m in english] == ["ablation/embn-en"]


def test_markdown_table():
    text = ablation_markdown([RowResult("A", {"en": 10.0, "fr": 20.0}, 1000, 10)], ["en", "de", "fr"])
    assert "| A | 10.0 | – | 20.0 | 15.0 |  | 1,000 | 10 | – | – |" in text
    seeded = ablation_markdown([RowResult("B", {"en": 10.0}, 5, 1, std={"en": 0.5}, seeds=3,
                                          by_seed={0: 9.5, 1: 10.0, 2: 10.5}, val=11.25, minutes=3.04)], ["en"])  # fmt: skip
    assert "| B | 10.0 ± 0.5 | 10.0 ± 0.5 |  | 5 | 1 | 11.2 | 3.0 |" in seeded


def _row(name: str, seeds_by_language: dict[str, list[float]]):
    """A row_result from hand-written mR per language, seeds 0, 1, 2 in order."""
    configs = [resolve("demo", {"train.seed": s}) for s in range(3)]
    training = {"parameters": {"total": 1, "language_specific": 1}}
    evaluations = [{"table": {lang: {"mR": v[s]} for lang, v in seeds_by_language.items()}} for s in range(3)]
    return row_result(name, [(cfg, training, e) for cfg, e in zip(configs, evaluations)])


def test_each_row_is_compared_with_the_row_it_adds_to_seed_by_seed():
    # per-seed means over en, fr: base 10, 12, 14; NC 13, 14, 18 (+3, +2, +4: a gain, 3 ± 1);
    # LC 14, 13, 18 against NC (+1, -1, 0: none, although its mean is 0 above NC's spread)
    base = _row("MULE EmbN", {"en": [12, 14, 16], "fr": [8, 10, 12]})
    nc = _row("MULE + NC", {"en": [15, 16, 20], "fr": [11, 12, 16]})
    lc = _row("MULE + NC + LC", {"en": [16, 15, 20], "fr": [12, 11, 16]})
    assert base.by_seed == {0: 10, 1: 12, 2: 14} and base.mean == 12 and base.mean_std == 2
    baselines = {row.name: row.baseline for row in grid(["en", "fr"])}
    assert baselines["MULE + NC"] == "MULE EmbN" and baselines["MULE + NC + LC"] == "MULE + NC"
    assert (
        baselines["MULE + NC + LC + LP (full)"] == "MULE + NC + LC" and baselines["EmbN (one model per language)"] == ""
    )
    compare([base, nc, lc], baselines)
    assert base.difference is None
    assert (nc.baseline, nc.difference.mean, nc.difference.spread, nc.difference.verdict) == ("MULE EmbN", 3, 1, "gain")
    assert (lc.difference.mean, lc.difference.verdict) == (0, "none")
    text = ablation_markdown([base, nc, lc], ["en", "fr"])
    assert "| MULE + NC | 17.0 ± 2.6 | 13.0 ± 2.6 | 15.0 ± 2.6 | +3.0 ± 1.0 (gain) vs MULE EmbN |" in text
    assert "| MULE + NC + LC | 17.0 ± 2.6 | 13.0 ± 2.6 | 15.0 ± 2.6 | +0.0 ± 1.0 (none) vs MULE + NC |" in text


def test_several_seeds_average_each_language_and_count_parameters_once():
    row = grid(["en", "fr"], seeds=[0, 1])[1]  # PARALLEL-EmbN
    assert [m.slug for m in row.models] == ["parallel", "parallel-s1"]
    assert [m.overrides["train.seed"] for m in row.models] == [0, 1]
    evaluations = [
        {"table": {"en": {"mR": 10.0}, "fr": {"mR": 4.0}}},
        {"table": {"en": {"mR": 14.0}, "fr": {"mR": 6.0}}},
    ]
    trainings = [{"parameters": {"total": 100, "language_specific": 30}, "val_mean_mR": val, "seconds": seconds,
                  "lp_seconds": lp} for val, seconds, lp in ((20.0, 60.0, 30.0), (22.0, 120.0, 30.0))]  # fmt: skip
    configs = [apply_overrides(resolve("demo", {"data.languages": "en,fr"}), m.overrides) for m in row.models]
    result = row_result(row.name, [(cfg, training, evaluation)
                                   for cfg, training, evaluation in zip(configs, trainings, evaluations)])  # fmt: skip
    assert result.mr == {"en": 12.0, "fr": 5.0} and result.parameters == 100 and result.seeds == 2
    assert result.val == 21.0 and result.minutes == 2.0  # (90 s + 150 s) over 2 seeds
    assert round(result.std["en"], 3) == round(2 * 2**0.5, 3)
    embn = grid(["en", "fr"], seeds=[0, 1])[0]
    assert [m.slug for m in embn.models] == ["embn-en", "embn-en-s1", "embn-fr", "embn-fr-s1"]
    # translate-the-query reads every seed's English model, and only those
    assert [m.overrides["output.model_name"] for m in english_models(embn.models)] == [
        "ablation/embn-en",
        "ablation/embn-en-s1",
    ]
    assert english_models(row.models) == []


@pytest.mark.slow
def test_ablation_end_to_end(tmp_path, repo_copy):
    from mule.flows.stages import rebuild_flow

    first = rebuild_flow(workdir=str(tmp_path), overrides=TINY, stages=["ablation"])
    assert list(first["stages"]) == ["ingest", "features", "text", "ablation"]  # what its steps read, first
    summary = first["ablation"]
    rows = {r["model"]: r for r in summary["rows"]}
    assert list(rows) == [*ROWS, CHANCE]  # chance last: a random ranking of the same test images
    # 16 test images, five English captions and one French caption each
    assert rows[CHANCE]["en"] == pytest.approx(chance_recalls([5] * 16)["mR"], abs=0.01)
    assert rows[CHANCE]["fr"] == pytest.approx(chance_recalls([1] * 16)["mR"], abs=0.01)
    assert rows[CHANCE]["parameters"] == 0 and "| – | – |" in summary["markdown"].splitlines()[-1]
    for row in rows.values():
        assert {"en", "de", "fr", "cs"} <= set(row) and all(0 <= row[lang] <= 100 for lang in ("en", "de", "fr", "cs"))
    # Parameters: four EmbN models cost more than one PARALLEL model, which costs more than MULE.
    assert rows["EmbN (one model per language)"]["parameters"] > rows["PARALLEL-EmbN"]["parameters"]
    assert rows["PARALLEL-EmbN"]["parameters"] > rows["MULE EmbN"]["parameters"] == rows["MULE + NC"]["parameters"]
    assert set(summary["steps"].values()) == {"ran"}
    wd = Workdir.at(tmp_path)
    with open(wd.results_dir("embedded") / "ablation" / "ablation.csv") as handle:
        assert [r["model"] for r in csv.DictReader(handle)] == [*ROWS, CHANCE]
    client = MlflowClient(wd.mlflow_uri)
    experiment = client.get_experiment_by_name("mule/embedded")
    runs = client.search_runs([experiment.experiment_id])
    def children(run):
        return sorted(
            r.info.run_name for r in runs if r.data.tags.get("mlflow.parentRunId") == run.info.run_id
        )  # noqa: E731
    (rebuild,) = [r for r in runs if r.info.run_name == "run: ablation"]
    assert children(rebuild) == sorted(["ingest", "features", "text", "ablation"])
    (parent,) = [r for r in runs if r.info.run_name == "ablation"]
    models = [f"ablation: EmbN {lang}" for lang in ("en", "de", "fr", "cs")] + [
        "ablation: PARALLEL-EmbN", "ablation: MULE EmbN", "ablation: MULE + NC", "ablation: MULE + NC + LC",
        "ablation: MULE full", "ablation: translate the query with EmbN en"]  # fmt: skip
    assert children(parent) == sorted(models)
    (full,) = [r for r in runs if r.info.run_name == "ablation: MULE full"]
    assert children(full) == ["evaluate", "pretrain", "train"]  # each step a stage run of its own
    assert "ablation.png" in {a.path for a in client.list_artifacts(parent.info.run_id)}

    # Run again as a user does: every step of every model is up to date, so the command
    # records the reuse and prints the table without starting (or importing) Prefect.
    import subprocess
    import sys

    settings = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    script = ("import sys; from mule.commands.main import main; code = main(sys.argv[1:]); "
              "print('prefect imported:', 'prefect' in sys.modules); sys.exit(code)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script, "run", "ablation", "--workdir", str(tmp_path), *settings],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "every stage is up to date" in done.stdout and "prefect imported: False" in done.stdout
    assert f"  ablation   reused ({len(summary['steps'])} steps)" in done.stdout, done.stdout
    assert summary["markdown"].splitlines()[3] in done.stdout  # the same table, from the reused results
    runs = client.search_runs([experiment.experiment_id], "tags.mlflow.runName = 'train'",
                              order_by=["attributes.start_time DESC"])  # fmt: skip
    newest = [r for r in runs if r.info.start_time > parent.info.end_time]
    assert len(newest) == sum(1 for step in summary["steps"] if step.endswith(": train"))
    assert all(r.data.tags["mule.stage_status"] == "reused" for r in newest)  # nothing trains twice
    # each model's key covers its code: an edit the training reaches retrains it
    from mule.pipeline import decisions
    from tests.conftest import edit

    (model,) = [m for row in grid(["en", "de", "fr", "cs"]) for m in row.models if m.slug == "mule-full"]
    variant = apply_overrides(resolve("demo", TINY), model.overrides)
    assert not decisions.decide(wd, variant, "train", repo=repo_copy).run
    edit(repo_copy / "mule_core" / "losses.py")
    decision = decisions.decide(wd, variant, "train", repo=repo_copy)
    assert decision.run and decision.reason == "code mule_core/losses.py changed", decision.reason
