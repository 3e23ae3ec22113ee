"""Content-addressed stages: a stage's key covers what it reads, the config it uses and
the code that computes it; a stage runs only when its key changed (or an output it wrote
was deleted or changed since). The one way mule decides reuse: the rebuild's stages and
the sweeps' steps (every ablation model, every added language) alike.

Everything about a stage comes from its declaration (pipeline.declaration): its code is
the import closure of its computing module (storage.code_digests; publishing,
tracking and orchestration are not in it), its config the options it declares (less the
operational ones), its inputs the digests of the catalog entries it reads
(data_catalog.entries), its outputs those it writes. Inputs are digests of
content, never paths or timestamps, so a rebuild after editing one caption file reruns
ingest and then only the stages whose inputs really changed: the images table is the
same, so features are reused; the captions table is not, so the text side runs again. A
stage's record (state/stages/<dataset>/<stage>.json) keeps its key, the parts the key was
made of (to say why a stage ran), digests of its outputs (a deleted or edited output
makes it run again) and its result (what a reused stage returns).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mule.config.sections import MuleConfig, flatten
from mule.data_catalog.entries import ENTRIES, output_files
from mule.data_catalog.tables import Catalog, write_json_atomic
from mule.mule_core.errors import is_user_error
from mule.pipeline.declaration import BY_NAME, Stage
from mule.storage import code_digests
from mule.storage.content_digests import FileHasher, arrow_digest, combine
from mule.storage.workdir import Workdir


def logger() -> logging.Logger:
    return logging.getLogger("mule.pipeline")


def config_parts(cfg: MuleConfig, stage: Stage) -> dict[str, str]:
    excluded = stage.operational | stage.ignores
    return {f"config {k}": ("given" if v else "none") if k in stage.presence else v for k, v in flatten(cfg).items()
            if k not in excluded and any(k == w or (w.endswith(".") and k.startswith(w)) for w in stage.config)}  # fmt: skip


def runtime_parts(cfg: MuleConfig, stage: Stage) -> dict[str, str]:
    """What the machine contributes to a training stage's model: the device and arithmetic
    it trains in (CPU float32 and CUDA mixed precision make other models). Not the thread
    count: that follows the machine (a workdir copied to a bigger one, taskset, a container's
    CPU limit) and moves the weights only within rounding (tests/test_training.py); it is
    recorded with the run instead."""
    if not stage.threaded:
        return {}
    from mule.mule_core.devices import training_arithmetic

    return {"runtime arithmetic": training_arithmetic(cfg.train.device, cfg.train.amp)}


def _images_digest(wd: Workdir, catalog: Catalog, dataset: str, hasher: FileHasher) -> str | None:
    """The images' identity, split and bytes (not their paths: a moved workdir keeps its
    key), remembered by the images table's file digest (DuckDB is imported once per table)."""
    file_digest = hasher.digest(wd.table_path("images", dataset))
    if file_digest is None:
        return None
    return hasher.derived("images", file_digest, lambda: arrow_digest(catalog.image_identity(dataset))[:16])


def _model_digest(path: Path, hasher: FileHasher) -> str | None:
    """A model's weights and vocabularies (data_catalog.model_files.model_digest), remembered by
    the file's digest: torch is imported only for a model not seen before."""
    file_digest = hasher.digest(path)
    if file_digest is None:
        return None
    return hasher.derived("model", file_digest, lambda: _load_model_digest(path))


def _load_model_digest(path: Path) -> str | None:
    from mule.data_catalog.model_files import model_digest

    return model_digest(path)


def entry_digest(name: str, wd: Workdir, catalog: Catalog, cfg: MuleConfig, hasher: FileHasher) -> str | None:
    entry = ENTRIES[name]
    if entry.kind == "images":
        return _images_digest(wd, catalog, cfg.data.dataset, hasher)
    paths = entry.locate(wd, catalog, cfg)
    if not paths:  # nothing there for this config (random weights, no features extracted yet)
        return None
    if entry.kind == "model":
        return _model_digest(paths[0], hasher)
    if entry.kind == "tree":
        digests = [hasher.tree(p) for p in paths]
        return combine({str(i): d for i, d in enumerate(digests)})[:16] if any(digests) else None
    if entry.kind == "parts":  # the parts' contents, whatever their names
        digests = sorted(hasher.digest(part) for p in paths for part in p.glob("part-*.parquet"))
        return combine({str(i): d for i, d in enumerate(digests)})[:16] if digests else None
    digests = [hasher.digest(p) for p in paths]
    if entry.kind == "tables":  # by table name: the same tables in a moved workdir are the same entry
        return combine({f"{p.parent.name}/{p.name}": d for p, d in zip(paths, digests)})[:16]
    if entry.kind == "files":
        return combine({str(p): d for p, d in zip(paths, digests)})[:16]
    if entry.kind == "contents":  # files given by the user: what they hold, wherever they are
        return combine({str(i): d or "missing" for i, d in enumerate(digests)})[:16]
    return digests[0][:16] if digests[0] else None


def input_parts(wd: Workdir, catalog: Catalog, cfg: MuleConfig, stage: Stage, hasher: FileHasher) -> dict[str, Any]:
    return {f"input {name}": entry_digest(name, wd, catalog, cfg, hasher) for name in stage.entries_read(cfg)}


def code_parts(stage: Stage, repo: Path | None = None) -> dict[str, str]:
    """ "code tasks/train.py", "code library torch": so a rerun's reason names the file.
    The computing module's closure only: its publisher (pipeline.publish) is not in it."""
    return {f"code {k.removeprefix('file ')}": v
            for k, v in code_digests.code_parts(stage.module, repo or code_digests.REPO).items()}  # fmt: skip


def slot_for(wd: Workdir, catalog: Catalog, cfg: MuleConfig, stage: Stage) -> str:
    """Stages that write one of several files (LP per caption selection, a model per
    name: the ablation's, add-language's) keep one record per file, named after it; the
    default file has the plain name."""
    if stage.slot is None:
        return ""
    path = ENTRIES[stage.slot].locate(wd, catalog, cfg)[0]
    if not path.is_relative_to(wd.models_dir(cfg.data.dataset)):  # a table: its file's name (an added language's)
        return path.stem
    name = str(path.relative_to(wd.models_dir(cfg.data.dataset)).with_suffix("")).replace("/", "--")
    return "" if name in ("pretrain", "model") else name


def output_paths(wd: Workdir, catalog: Catalog, cfg: MuleConfig, stage: Stage) -> list[Path]:
    return [
        path for name in stage.writes for path in output_files(ENTRIES[name], ENTRIES[name].locate(wd, catalog, cfg))
    ]


@dataclass
class Decision:
    stage: str
    key: str
    parts: dict[str, Any]
    run: bool
    reason: str  # why it runs, or "key <key>" when reused
    record: dict | None = None  # the previous record
    slot: str = ""
    forced: bool = False
    extra: dict = field(default_factory=dict)

    def describe(self) -> str:
        if self.run:
            return f"ran ({self.reason})"
        if publish_pending(self):
            return f"reused (key {self.key[:12]}), published now: the run that computed it stopped before publishing"
        return f"reused (key {self.key[:12]})"


def _changes(old: dict, new: dict, limit: int = 4) -> str:
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    names = [k.removeprefix("input ") + " changed" if k.startswith("input ") else
             f"{k.removeprefix('config ')} {old.get(k)} -> {new.get(k)}" if k.startswith(("config ", "code library ",
                                                                                    "runtime "))
             else f"{k} changed" for k in changed]  # fmt: skip
    more = f", and {len(names) - limit} more" if len(names) > limit else ""
    return "; ".join(names[:limit]) + more


def decide(wd: Workdir, cfg: MuleConfig, name: str, force: bool = False, repo: Path | None = None,
           hasher: FileHasher | None = None) -> Decision:  # fmt: skip
    """Whether stage `name` must run, and why: forced, never run, its key changed (saying
    which part: a file of its code, an option, an input), or an output missing or changed
    since it was written. `repo`: the code to key (default: this checkout); `hasher`: one
    shared by the stages decided together (its cache of file digests read once, not once
    a stage)."""
    stage = BY_NAME[name]
    catalog, hasher = Catalog(wd), hasher or FileHasher(wd)
    try:
        slot = slot_for(wd, catalog, cfg, stage)
        parts = {**code_parts(stage, repo), **config_parts(cfg, stage), **runtime_parts(cfg, stage),
                 **input_parts(wd, catalog, cfg, stage, hasher)}  # fmt: skip
    except Exception as error:  # an input is missing: the stage runs, and fails saying which
        if not (is_user_error(error) or isinstance(error, FileNotFoundError)):
            raise
        return Decision(name, "", {}, True, f"its inputs cannot be read: {error}", forced=force)
    key = combine(parts)[:24]
    record_path = wd.stage_record_path(cfg.data.dataset, name, slot)
    record = _read_record(record_path)
    interrupted = _interrupted(record_path, key)
    if force:
        reason = "forced with --force"
    elif interrupted:
        reason = interrupted + (f"; it resumes {stage.resumes}" if stage.resumes else "")
    elif record is None and record_path.exists():
        reason = f"its record {record_path.relative_to(wd.root)} is unreadable (damaged), so it counts as none"
    elif record is None:
        reason = "no earlier run"
    elif record["key"] != key:
        reason = _changes(record["parts"], parts)
    else:
        reason = _outputs_changed(wd, hasher, record)
    hasher.save()
    return Decision(name, key, parts, bool(reason), reason or f"key {key[:12]}", record, slot, force)


RECORD_FIELDS = {"key": str, "parts": dict, "outputs": dict}


def running_path(record_path: Path) -> Path:
    """Beside a stage's record while the stage computes: which key, since when. A run
    stopped before its record was written leaves it, so the next run can say so (its
    outputs may already be rewritten: they are unfinished work, not damage)."""
    return record_path.with_name(record_path.name + ".running")


def mark_running(wd: Workdir, cfg: MuleConfig, decision: Decision) -> None:
    if decision.key:
        path = running_path(wd.stage_record_path(cfg.data.dataset, decision.stage, decision.slot))
        write_json_atomic({"key": decision.key, "started": time.time()}, path)


def _interrupted(record_path: Path, key: str) -> str:
    """Why the stage runs when its last run under this key stopped before recording: "" if it did not."""
    try:
        running = json.loads(running_path(record_path).read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(running, dict) or running.get("key") != key:
        return ""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(running.get("started") or 0))
    return f"finishing its run of {when}, stopped before it was recorded"


def _read_record(path: Path) -> dict | None:
    """A stage's record; None when there is none, or it cannot be read or is not one (a
    damaged record counts as no record: the stage runs again)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or any(not isinstance(record.get(k), t) for k, t in RECORD_FIELDS.items()):
        return None
    return record


def damaged_upstream(wd: Workdir, cfg: MuleConfig, stages: list[str]) -> dict[str, str]:
    """The stages not among `stages` that write what they read (directly or not) and whose
    recorded outputs are missing or changed since (damaged, or edited by hand): stage ->
    why. They run first, so no stage reads a damaged file. Cheap: each output's size and
    time first, its content only when those changed (FileHasher)."""
    from mule.pipeline.declaration import writers_upstream

    catalog, hasher, damaged = Catalog(wd), FileHasher(wd), {}
    for name in writers_upstream(stages, cfg):
        if name in stages:
            continue
        slot = slot_for(wd, catalog, cfg, BY_NAME[name])
        record = _read_record(wd.stage_record_path(cfg.data.dataset, name, slot))
        reason = _outputs_changed(wd, hasher, record) if record else ""
        if reason:
            damaged[name] = reason
    hasher.save()
    return damaged


def read_record(wd: Workdir, cfg: MuleConfig, name: str) -> dict | None:
    """The record stage `name` last left for this config's slot (None when it never ran)."""
    slot = slot_for(wd, Catalog(wd), cfg, BY_NAME[name])
    return _read_record(wd.stage_record_path(cfg.data.dataset, name, slot))


def previous_record(wd: Workdir, cfg: MuleConfig, decision: Decision) -> dict | None:
    """The record a decision taken elsewhere (by the rebuild) was made against."""
    return _read_record(wd.stage_record_path(cfg.data.dataset, decision.stage, decision.slot))


def _outputs_changed(wd: Workdir, hasher: FileHasher, record: dict) -> str:
    for name, digest in record["outputs"].items():
        now = hasher.digest(wd.root / name)
        if now is None:
            return f"output {name} missing"
        if now != digest:
            return f"output {name} changed since it was written (damaged, or edited)"
    return ""


def record(wd: Workdir, cfg: MuleConfig, decision: Decision, result: Any, run_id: str | None,
           seconds: float | None = None, cpu_seconds: float | None = None) -> None:  # fmt: skip
    """As soon as the stage's computation returned, before anything is published: its key
    (of the inputs it started from), its outputs' digests and its result, "published":
    false. A stop while publishing then loses nothing: the next run reuses the stage and
    publishes it (publish_pending)."""
    if not decision.key:  # no key could be taken before it ran: the next run takes one
        return
    catalog, hasher = Catalog(wd), FileHasher(wd)
    stage = decision.stage
    outputs = {str(p.relative_to(wd.root)): hasher.digest(p) for p in output_paths(wd, catalog, cfg, BY_NAME[stage])}
    hasher.save()
    path = wd.stage_record_path(cfg.data.dataset, stage, decision.slot)
    write_json_atomic({"stage": stage, "key": decision.key, "parts": decision.parts, "outputs": outputs,
                       "result": result, "run_id": run_id, "finished": time.time(), "reason": decision.reason,
                       "root": str(wd.root), "published": False, **runtime_record(cfg, BY_NAME[stage]),
                       "seconds": None if seconds is None else round(seconds, 2),
                       # this process's CPU time over the computation (its threads; not child processes')
                       "cpu_seconds": None if cpu_seconds is None else round(cpu_seconds, 2)}, path)  # fmt: skip
    running_path(path).unlink(missing_ok=True)


def runtime_record(cfg: MuleConfig, stage: Stage) -> dict[str, Any]:
    """What a stage's record (and its MLflow run) says of the machine it ran on, beside its key."""
    if not stage.threaded:
        return {}
    from mule.mule_core.devices import cpu_threads

    return {"cpu_threads": cpu_threads(cfg.train.threads)}


def mark_published(wd: Workdir, cfg: MuleConfig, decision: Decision, result: Any, run_id: str | None,
                   seconds: float | None = None, key: str | None = None) -> None:  # fmt: skip
    """The stage's publishing is done (in run `run_id`): its record says so, with what the
    publisher added to the result (a registered version). `key`: the record's, when it is
    not the decision's (a pending result published before a run under a new key replaces it)."""
    key = key or decision.key
    if not key:
        return
    path = wd.stage_record_path(cfg.data.dataset, decision.stage, decision.slot)
    current = _read_record(path)
    if current is None or current["key"] != key:
        return
    write_json_atomic({**current, "result": result, "published": True, "published_in_run": run_id,
                       "publish_seconds": None if seconds is None else round(seconds, 2)}, path)  # fmt: skip


def publish_pending(decision: Decision) -> bool:
    """The stage was computed and recorded, and its run stopped before publishing it."""
    return bool(decision.record) and decision.record.get("published") is False


def registered_model_gone(wd: Workdir, decision: Decision) -> bool:
    """A registered model's file is gone from the run it was published in (`mlflow gc`, a
    hand in the artifact store): told from the files alone, without MLflow, so a run with
    nothing to compute still publishes it again (pipeline.hooks)."""
    record = decision.record or {}
    registered = (record.get("result") or {}).get("registry")
    if not isinstance(registered, dict):
        return False
    run = registered.get("run_id") or record.get("published_in_run")  # the version's run: where its files are
    if not run:
        return False
    # the workdir's artifact store: <run>/artifacts/ (an experiment's folder above it in stores made elsewhere)
    return not any(wd.artifacts_dir.glob(f"{run}/artifacts/model.pt")) and \
        not any(wd.artifacts_dir.glob(f"*/{run}/artifacts/model.pt"))  # fmt: skip


def pending_changed(wd: Workdir, decision: Decision) -> str:
    """Why the unpublished result of `decision.record` can no longer be published as it was
    computed (an output missing or changed since: edited, or damaged); "" when it can."""
    return _outputs_changed(wd, FileHasher(wd), decision.record) if decision.record else "no record"


def recorded_config(cfg: MuleConfig, record: dict) -> MuleConfig:
    """The config a recorded result was computed under, as far as the stage reads it: `cfg`
    with the options its record's key was made of (a pending result is published with the
    settings that made it, not those of the run that publishes it)."""
    from mule.config.overrides import apply_overrides
    from mule.mule_core.settings import ConfigError

    stage = BY_NAME[record.get("stage") or ""] if record.get("stage") in BY_NAME else None
    presence = stage.presence if stage else frozenset()
    options = {k.removeprefix("config "): v for k, v in record.get("parts", {}).items()
               if k.startswith("config ") and k.removeprefix("config ") not in presence}  # fmt: skip
    try:
        return apply_overrides(cfg, options)
    except (ConfigError, ValueError, TypeError):  # an option since renamed or retired: today's value
        return cfg


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
