"""Content-addressed stages: a stage's key covers what it reads, the config it uses and
the code that matters to it; a rebuild runs a stage only when its key changed.

Inputs are digests of content (raw files, catalog tables, models), never paths or
timestamps, so a rebuild after editing one caption file reruns ingest and then only the
stages whose inputs really changed: the images table is the same, so features are
reused; the captions table is not, so the text side runs again. A stage's record
(state/stages/<dataset>/<stage>.json) keeps its key, the parts the key was made of
(to say why a stage ran), digests of its outputs (a deleted or edited output makes it
run again) and its result (what a reused stage returns).
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from data_catalog.catalog import Catalog, write_json_atomic
from data_catalog.content import FileHasher, arrow_digest, combine
from data_catalog.datasets import locate
from data_catalog.workdir import Workdir
from mule_core.config import MuleConfig, flatten
from mule_core.errors import is_user_error
from mule_core.text import tokenizer_version

from . import tracking
from .common import logger
from .features import extractor_for
from .model_io import model_digest
from .pretrain import lp_path
from .train import model_path, results_dir

REPO = Path(__file__).resolve().parents[1]

# The code each stage's output depends on (files or folders of the repository).
CODE = {
    "ingest": ["tasks/ingest.py", "data_catalog/readers", "data_catalog/embedded", "data_catalog/datasets.py",
               "data_catalog/schemas.py", "mule_core/text.py", "mule_core/languages.py"],
    "translate": ["tasks/translate.py", "tasks/googletrans_backend.py", "mule_core/translation.py",
                  "data_catalog/lexicons.py", "mule_core/text.py", "mule_core/languages.py"],
    "features": ["tasks/features.py", "mule_core/features.py", "mule_core/onnx_engine.py", "data_catalog/pretrained.py"],
    "text": ["tasks/text.py", "data_catalog/pretrained.py"],
    "pretrain": ["tasks/pretrain.py", "tasks/model_io.py", "tasks/training_common.py", "mule_core/model.py",
                 "mule_core/training.py", "mule_core/losses.py", "mule_core/batching.py"],
    "train": ["tasks/train.py", "tasks/model_io.py", "tasks/training_common.py", "mule_core/model.py",
              "mule_core/training.py", "mule_core/losses.py", "mule_core/batching.py", "mule_core/metrics.py"],
    "evaluate": ["tasks/evaluate.py", "tasks/report.py", "tasks/plots.py", "tasks/model_io.py",
                 "tasks/training_common.py", "mule_core/metrics.py", "mule_core/training.py", "mule_core/model.py"],
}  # fmt: skip
LIBRARIES = {"features": ["torch", "torchvision", "timm"], "text": ["fasttext-numpy2", "fasttext"],
             "pretrain": ["torch"], "train": ["torch"], "evaluate": ["torch"]}  # fmt: skip

# Options that change how fast a stage runs or where it runs, not what it produces.
OPERATIONAL = {"data.source", "data.images", "data.dictionaries", "features.runner", "features.dask_address",
               "features.dask_workers", "features.batch_size", "features.loader_workers", "features.shard_images",
               "features.engine", "features.device", "translate.concurrency", "translate.timeout_s",
               "translate.retries", "train.reuse", "text.fasttext_threads"}  # fmt: skip
TRAINING = ("model.", "loss.", "train.", "pretrain.")
# The config each stage reads: option prefixes (and single options).
CONFIG = {
    "ingest": ("data.",),
    "translate": ("translate.", "data.dataset", "data.languages", "data.format"),
    "features": ("features.",),
    "text": ("text.", "data.dataset", "data.languages", "data.captions", "data.seed"),
    "pretrain": (*TRAINING, "data.dataset", "data.languages", "data.captions", "text.max_tokens"),
    "train": (*TRAINING, "data.dataset", "data.languages", "data.captions", "text.max_tokens", "eval.ks",
              "features.arch", "features.weights", "features.input_size", "features.resize", "features.crops",
              "features.pool", "features.seed"),
    "evaluate": ("eval.", "data.dataset", "data.languages", "text.max_tokens", "train.model_name", "features.arch",
                 "features.weights", "features.input_size", "features.resize", "features.crops", "features.pool",
                 "features.seed"),
}  # fmt: skip
NOT_IN = {"ingest": {"data.captions"}, "pretrain": {"train.model_name", "train.add_language", "train.base_model"}}


@functools.cache
def code_digest(stage: str) -> str:
    parts = {}
    for name in CODE[stage]:
        path = REPO / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            parts[str(file.relative_to(REPO))] = hashlib.sha256(file.read_bytes()).hexdigest()
    for library in LIBRARIES.get(stage, []):
        try:
            parts[f"library {library}"] = version(library)
        except PackageNotFoundError:
            pass
    return combine(parts)[:16]


def config_parts(cfg: MuleConfig, stage: str) -> dict[str, str]:
    wanted, excluded = CONFIG[stage], OPERATIONAL | NOT_IN.get(stage, set())
    return {f"config {k}": v for k, v in flatten(cfg).items()
            if k not in excluded and any(k == w or (w.endswith(".") and k.startswith(w)) for w in wanted)}  # fmt: skip


def _images_digest(catalog: Catalog, dataset: str) -> str | None:
    """The images' identity, split and bytes (not their paths: a moved workdir keeps its key)."""
    if not catalog.has_table("images", dataset):
        return None
    rows = catalog.query('SELECT image_id, role, "exists", sha256 FROM images WHERE dataset = ? ORDER BY image_id',
                         [dataset])  # fmt: skip
    return arrow_digest(rows)[:16]


def _features_digest(hasher: FileHasher, wd: Workdir, dataset: str, extractor: str) -> str | None:
    folder = wd.features_dir(dataset, extractor)
    return (hasher.tree(folder, exclude=("extractor.json",)) or "")[:16] or None


def _file(hasher: FileHasher, path: Path) -> str | None:
    digest = hasher.digest(path)
    return digest[:16] if digest else None


def slot_for(wd: Workdir, catalog: Catalog, cfg: MuleConfig, stage: str) -> str:
    """Stages that write one of several files keep one record per file."""
    if stage == "pretrain":
        name = lp_path(wd, catalog, cfg).stem
        return "" if name == "pretrain" else name
    if stage in ("train", "evaluate"):
        return "" if cfg.train.model_name == "model" else cfg.train.model_name
    return ""


def input_parts(wd: Workdir, catalog: Catalog, cfg: MuleConfig, stage: str, hasher: FileHasher) -> dict[str, Any]:
    dataset, captions = cfg.data.dataset, cfg.data.captions
    parts: dict[str, Any] = {}

    def table(name: str, ds: str) -> str | None:
        return _file(hasher, wd.table_path(name, ds))

    with_mt = captions != "human"
    extractor = extractor_for(cfg.features)
    if stage == "ingest":
        source = locate(wd, cfg.data)
        parts["input raw files"] = (hasher.tree(source.root) or "")[:16] or None
        if not source.images.is_relative_to(source.root):
            parts["input image files"] = (hasher.tree(source.images) or "")[:16] or None
        parts |= {f"tokeniser {lang}": tokenizer_version(lang) for lang in cfg.data.languages}
    elif stage == "translate":
        parts["input captions"] = table("captions", dataset)
        if cfg.translate.backend == "lexicon":
            folder = cfg.data.dictionaries or str(locate(wd, cfg.data).root / "dictionaries")
            parts["input lexicons"] = (hasher.tree(Path(folder)) or "")[:16] or None
    elif stage == "features":
        parts["input images"] = _images_digest(catalog, dataset)
    else:
        parts["input captions"] = table("captions", dataset)
        if with_mt:
            parts["input machine translations"] = table("captions", f"{dataset}.mt")
    if stage == "text":
        parts |= {f"input vectors {lang}": _file(hasher, Path(path)) for lang, path in cfg.text.vectors.items()}
    if stage in ("pretrain", "train", "evaluate"):
        parts["input word vectors"] = table("word_vectors", dataset)
    if stage in ("train", "evaluate"):
        parts["input images"] = _images_digest(catalog, dataset)
        parts["input features"] = _features_digest(hasher, wd, dataset, extractor)
        if cfg.pretrain.enabled:
            parts["input LP model"] = model_digest(lp_path(wd, catalog, cfg))
    if stage == "evaluate":
        parts["input model"] = model_digest(model_path(wd, dataset, cfg.train.model_name))
    return parts


def output_paths(wd: Workdir, catalog: Catalog, cfg: MuleConfig, stage: str) -> list[Path]:
    dataset = cfg.data.dataset
    if stage == "ingest":
        return [wd.table_path(t, dataset) for t in ("images", "captions", "rejects")]
    if stage == "translate":
        return [p for p in (wd.table_path("captions", f"{dataset}.mt"), wd.table_path("translations", dataset))
                if p.exists()]  # fmt: skip
    if stage == "features":
        folder = wd.features_dir(dataset, extractor_for(cfg.features))
        return sorted(folder.glob("part-*.parquet"))
    if stage == "text":
        return [wd.table_path("word_vectors", dataset)]
    if stage == "pretrain":
        path = lp_path(wd, catalog, cfg)
        return [path] if path.exists() else []  # LP off, or one language: nothing written
    if stage == "train":
        return [model_path(wd, dataset, cfg.train.model_name)]
    if stage == "evaluate":
        return [results_dir(wd, dataset, cfg.train.model_name) / "evaluation.json"]
    raise ValueError(f"no stage key for {stage!r}")


@dataclass
class Decision:
    stage: str
    key: str
    parts: dict[str, Any]
    run: bool
    reason: str  # why it runs, or "key <key>" when reused
    record: dict | None = None  # the previous record
    slot: str = ""
    extra: dict = field(default_factory=dict)

    def describe(self) -> str:
        return f"ran ({self.reason})" if self.run else f"reused (key {self.key[:12]})"


def _changes(old: dict, new: dict, limit: int = 4) -> str:
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    names = [k.removeprefix("input ") + " changed" if k.startswith("input ") else
             (f"{k.removeprefix('config ')} {old.get(k)} -> {new.get(k)}" if k.startswith("config ") else f"{k} changed")
             for k in changed]  # fmt: skip
    more = f", and {len(names) - limit} more" if len(names) > limit else ""
    return "; ".join(names[:limit]) + more


def decide(wd: Workdir, cfg: MuleConfig, stage: str, force: bool = False) -> Decision:
    """Whether `stage` must run, and why: forced, never run, its key changed (saying which
    part), or an output missing or changed since it was written."""
    catalog, hasher = Catalog(wd), FileHasher(wd)
    try:
        slot = slot_for(wd, catalog, cfg, stage)
        parts = {"code": code_digest(stage), **config_parts(cfg, stage), **input_parts(wd, catalog, cfg, stage, hasher)}
    except Exception as error:  # an input is missing: the stage runs, and fails saying which
        if not (is_user_error(error) or isinstance(error, FileNotFoundError)):
            raise
        return Decision(stage, "", {}, True, f"its inputs cannot be read: {error}")
    key = combine(parts)[:24]
    path = wd.stage_record_path(cfg.data.dataset, stage, slot)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = None
    if force:
        reason = "forced with --force"
    elif record is None:
        reason = "no earlier run"
    elif record["key"] != key:
        reason = _changes(record["parts"], parts)
    else:
        reason = _outputs_changed(wd, hasher, record)
    hasher.save()
    return Decision(stage, key, parts, bool(reason), reason or f"key {key[:12]}", record, slot)


def _outputs_changed(wd: Workdir, hasher: FileHasher, record: dict) -> str:
    for name, digest in record["outputs"].items():
        now = hasher.digest(wd.root / name)
        if now is None:
            return f"output {name} missing"
        if now != digest:
            return f"output {name} changed since it was written"
    return ""


def record(wd: Workdir, cfg: MuleConfig, decision: Decision, result: Any, run_id: str | None) -> None:
    """After the stage ran: its key (of the inputs it started from), its outputs' digests
    and its result."""
    if not decision.key:  # no key could be taken before it ran: the next run takes one
        return
    catalog, hasher = Catalog(wd), FileHasher(wd)
    stage = decision.stage
    outputs = {str(p.relative_to(wd.root)): hasher.digest(p) for p in output_paths(wd, catalog, cfg, stage)}
    hasher.save()
    path = wd.stage_record_path(cfg.data.dataset, stage, decision.slot)
    write_json_atomic({"stage": stage, "key": decision.key, "parts": decision.parts, "outputs": outputs,
                       "result": result, "run_id": run_id, "finished": time.time(), "reason": decision.reason,
                       "root": str(wd.root)}, path)  # fmt: skip


def reused_result(decision: Decision, wd: Workdir) -> dict:
    """What a reused stage returns: the result it recorded (its paths in this workdir, if
    it was copied or moved since), marked as reused."""
    result = decision.record["result"] if isinstance(decision.record["result"], dict) else {}
    old = decision.record.get("root")
    if old and old != str(wd.root):
        result = _moved(result, old.rstrip("/") + "/", str(wd.root) + "/")
    return result | {"reused": True, "stage_key": decision.key, "reused_from_run": decision.record.get("run_id")}


def _moved(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return new + value[len(old) :] if value.startswith(old) else value
    if isinstance(value, dict):
        return {k: _moved(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, old, new) for v in value]
    return value


def as_dict(decision: Decision) -> dict:
    data = asdict(decision)
    data.pop("record")
    return data


def tags(decision: Decision) -> dict[str, str]:
    """What an MLflow run says about its stage: ran or reused, why, under which key."""
    values = {"mule.stage_status": "ran" if decision.run else "reused", "mule.stage_key": decision.key,
              "mule.stage_reason": decision.reason[:4900]}  # fmt: skip
    if not decision.run and decision.record and decision.record.get("run_id"):
        values["mule.reused_from_run"] = decision.record["run_id"]
    return values


@task(name="reuse-stage", task_run_name="{decision.stage}: reused", cache_policy=NO_CACHE)
def reuse_stage(wd: Workdir, cfg: MuleConfig, decision: Decision, parent_run_id: str | None) -> dict:
    """A stage whose key is unchanged: no work, an MLflow run that says so (and points at the
    run that produced what is reused), and the result that run recorded."""
    with tracking.run(wd, cfg, decision.stage, parent_run_id) as run_id:
        tracking.Tracker(wd, run_id).tags(tags(decision))
    logger().info("%s: %s, from MLflow run %s", decision.stage, decision.describe(), decision.record.get("run_id"))
    return reused_result(decision, wd)


def decisions_markdown(decisions: dict[str, str]) -> str:
    return "| stage | decision |\n|---|---|\n" + "\n".join(f"| {s} | {d} |" for s, d in decisions.items()) + "\n"


def report_decisions(wd: Workdir, cfg: MuleConfig, decisions: dict[str, str], run_id: str | None) -> None:
    """Ran or reused, stage by stage: in the log, on the parent MLflow run (a tag and
    stages.md) and as a Prefect artifact of the flow run."""
    markdown = decisions_markdown(decisions)
    ran = [s for s, d in decisions.items() if d.startswith("ran")]
    logger().info("stages: %s ran, %d reused\n%s", ", ".join(ran) or "none", len(decisions) - len(ran), markdown)
    tracker = tracking.Tracker(wd, run_id)
    tracker.tags({"mule.stages_ran": ",".join(ran) or "none",
                  "mule.stages_reused": ",".join(s for s in decisions if s not in ran) or "none"})  # fmt: skip
    tracker.text(markdown, "stages.md")
    try:
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(markdown=markdown, key=f"stages-{_artifact_key(cfg.data.dataset)}",
                                 description="What this rebuild ran, and what it reused")  # fmt: skip
    except Exception as error:  # noqa: BLE001 - the log and MLflow already say it
        logger().debug("no Prefect artifact: %s", error)


def _artifact_key(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower())
