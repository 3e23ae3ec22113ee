"""MLflow, with explicit run ids.

Stages log through `Tracker(workdir, run_id)` rather than MLflow's thread-local active
run, because Prefect may run a task on another thread than its flow. One experiment
per dataset ("mule/<dataset>"); the store is SQLite in the workdir and the artifacts
sit beside it, so `mule ui` shows everything a workdir ever ran.

MLflow stores artifact locations as absolute URIs. `relocate_store` rewrites them when
a workdir was copied or moved, so the copy never logs into the original's artifacts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import getpass
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mule.experiments.mlflow_store import WorkdirError, seed_store, store_exists
from mule.mule_core.errors import is_user_error
from mule.mule_core.progress import SHOWN
from mule.mule_core.settings import flatten
from mule.stopping import interrupts
from mule.storage.workdir import Workdir

if TYPE_CHECKING:  # MLflow is imported when a run is tracked, not by checking the store (seconds)
    from mlflow.tracking import MlflowClient

_INVALID_METRIC_CHARS = re.compile(r"[^A-Za-z0-9_\-. :/]")
# MLflow 3's UI opens an experiment without this tag in its GenAI (traces) view.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}

class _CachedPackages:
    """importlib_metadata with packages_distributions() answered from mule's cache."""

    def __init__(self, module) -> None:
        self._module = module

    def __getattr__(self, name: str):
        return getattr(self._module, name)

    @staticmethod
    def packages_distributions() -> dict[str, list[str]]:
        from mule.storage.code_digests import installed_packages

        return installed_packages()


def mlflow_knows_installed_packages() -> None:
    """Before MLflow logs or loads a model, which checks the model's requirements against
    what is installed: MLflow first maps every installed module to its distribution by
    reading every distribution's RECORD (importlib_metadata.packages_distributions(),
    1.4-2 s in each process). It gets the map mule keeps in its cache for as long as the
    same distributions are installed (storage.code_digests) instead. MLflow's map is a
    private global of mlflow.utils.requirements_utils: where it is not (another MLflow),
    MLflow builds its own as before."""
    from mlflow.utils import requirements_utils

    if getattr(requirements_utils, "_MODULES_TO_PACKAGES", ()) is not None:
        return  # built already (or this MLflow keeps no such map)
    real = getattr(requirements_utils, "importlib_metadata", None)
    if real is None or not hasattr(requirements_utils, "_init_modules_to_packages_map"):
        return
    requirements_utils.importlib_metadata = _CachedPackages(real)
    try:
        requirements_utils._init_modules_to_packages_map()
    finally:
        requirements_utils.importlib_metadata = real


def metric_name(key: str) -> str:
    """MLflow allows letters, digits and _-. :/ in metric names; 'en->de' becomes 'en_to_de'."""
    return _INVALID_METRIC_CHARS.sub("_", key.replace("->", "_to_").replace("@", "_at_"))


def client(workdir: Workdir) -> MlflowClient:
    """The workdir's MLflow client. A workdir without a store gets one copied from the
    template (seed_store), whoever opens it first: `mule`, a flow a Prefect worker runs, a
    test; MLflow would migrate one from nothing, about 1 s of each new workdir's run."""
    from mlflow.tracking import MlflowClient

    if not store_exists(workdir):
        seed_store(workdir)
    return MlflowClient(tracking_uri=workdir.mlflow_uri)


def experiment_id(workdir: Workdir, dataset: str) -> str:
    c = client(workdir)
    name = f"mule/{dataset}"
    experiment = c.get_experiment_by_name(name)
    if experiment is not None and experiment.lifecycle_stage == "deleted":
        set_aside(workdir, experiment)  # its runs and models kept; the name free for a new one
        experiment = None
    if experiment is None:
        workdir.artifacts_dir.mkdir(parents=True, exist_ok=True)
        note = f"mule runs on dataset {dataset}: one parent run per rebuild, a child run per stage."
        tags = EXPERIMENT_KIND | {"mlflow.note.content": note}
        return c.create_experiment(name, artifact_location=workdir.artifacts_dir.as_uri(), tags=tags)
    for key, value in EXPERIMENT_KIND.items():  # experiments made before the tag existed
        if experiment.tags.get(key) != value:
            c.set_experiment_tag(experiment.experiment_id, key, value)
    return experiment.experiment_id


def set_aside(workdir: Workdir, experiment) -> str:
    """A dataset's experiment deleted by hand (MLflow's UI keeps it, deleted, and refuses
    every run in it, and its name) set aside under a name of its own, still deleted: its
    runs, their artifacts and the registered models they hold are kept (restore it in the UI
    to see them), and the next run starts a new experiment. Never `mlflow gc`, which removes
    every run's artifacts, the registered champion's model with them. Returns its new name."""
    from mlflow.exceptions import MlflowException

    c = client(workdir)
    aside = f"{experiment.name} (deleted, set aside {time.strftime('%Y-%m-%d %H:%M:%S')})"
    try:
        c.restore_experiment(experiment.experiment_id)  # MLflow renames only active experiments
        c.rename_experiment(experiment.experiment_id, aside)
        c.delete_experiment(experiment.experiment_id)
    except MlflowException as error:
        raise WorkdirError(f"the MLflow experiment {experiment.name!r} (id {experiment.experiment_id}) in "
                           f"{workdir.mlflow_uri.removeprefix('sqlite:///')} was deleted, and could not be set aside "
                           f"({str(error).splitlines()[0][:160]}): restore it in MLflow's UI (`MLFLOW_TRACKING_URI="
                           f"{workdir.mlflow_uri} mlflow experiments restore --experiment-id "
                           f"{experiment.experiment_id}`)") from None  # fmt: skip
    logging.getLogger("mule.tracking").warning(
        "the MLflow experiment %r (id %s) was deleted: set aside as %r, still deleted, with its runs and models "
        "(restore it in MLflow's UI to see them); this run starts a new one", experiment.name,
        experiment.experiment_id, aside, extra=SHOWN)  # fmt: skip
    return aside


def run_alive(workdir: Workdir, run_id: str | None) -> bool:
    """Whether the run is in the store and not deleted (by hand, in MLflow's UI)."""
    from mlflow.exceptions import MlflowException

    if not run_id:
        return False
    try:
        return client(workdir).get_run(run_id).info.lifecycle_stage == "active"
    except MlflowException:
        return False


def finish_stopped_run(workdir: Workdir, run_id: str, by_run: str | None) -> None:
    """A run that stopped before publishing what it computed, once a later run (`by_run`)
    published it into it: it ends FINISHED, saying by whom."""
    c = client(workdir)
    c.set_tag(run_id, "mule.published_by_run", by_run or "a run without MLflow")
    if c.get_run(run_id).info.status != "FINISHED":
        c.set_terminated(run_id, "FINISHED")


def runs_address(workdir: Workdir, base: str, dataset: str | None = None) -> str | None:
    """The MLflow UI address of a dataset's runs table (default: the dataset that ran
    last), in the model-training view: MLflow 3 picks the view from the address's
    workflowType (else the browser's storage), and opens experiments in its GenAI view
    (traces) otherwise, whatever the experiment's tag says. None when nothing ran."""
    c = client(workdir)
    if dataset:
        experiment = c.get_experiment_by_name(f"mule/{dataset}")
        experiments = [experiment] if experiment else []
    else:
        ours = [e.experiment_id for e in c.search_experiments() if e.name.startswith("mule/")]
        latest = c.search_runs(ours, order_by=["attributes.start_time DESC"], max_results=1) if ours else []
        experiments = [c.get_experiment(latest[0].info.experiment_id)] if latest else []
    if not experiments:
        return None
    return f"{base.rstrip('/')}/#/experiments/{experiments[0].experiment_id}/runs?workflowType=machine_learning"



@functools.cache
def code_version() -> dict[str, str]:
    """The git commit of mule's own code (with +dirty for uncommitted changes), else the
    installed package version."""
    repo = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()  # fmt: skip
        return {"mlflow.source.git.commit": commit, "mule.code_version": commit + ("+dirty" if dirty else "")}
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return {"mule.code_version": version("mule")}
        except PackageNotFoundError:
            return {"mule.code_version": "unknown"}


def prefect_flow_run_id() -> str | None:
    if "prefect" not in sys.modules:  # not in a flow run (a rebuild with nothing to run never imports it)
        return None
    try:
        from prefect.runtime import flow_run

        return str(flow_run.id) if flow_run.id else None
    except Exception:  # noqa: BLE001 - outside a flow run there is simply no id
        return None


class Tracker:
    def __init__(self, workdir: Workdir, run_id: str | None):
        self.workdir, self.run_id = workdir, run_id
        self.client = client(workdir) if run_id else None

    def params(self, values: dict[str, Any]) -> None:
        if not self.client:
            return
        from mlflow.entities import Param

        # a dict in key order: the same value logged again (a stopped run's publish finished later, its
        # result read back from its record) is the same text, which MLflow requires of a param
        items = [Param(k, str(dict(sorted(v.items())) if isinstance(v, dict) else v)[:6000]) for k, v in values.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def metrics(self, values: dict[str, float], step: int | None = None) -> None:
        if not self.client:
            return
        from mlflow.entities import Metric

        now = int(1000 * time.time())
        items = [
            Metric(metric_name(k), float(v), now, step or 0)
            for k, v in values.items()
            if v is not None and not (isinstance(v, float) and not math.isfinite(v))
        ]
        for start in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[start : start + 1000])

    def tags(self, values: dict[str, str]) -> None:
        if self.client:
            from mlflow.entities import RunTag

            self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in values.items()])

    def artifact(self, path: Path, folder: str | None = None, name: str | None = None) -> None:
        """The file as an artifact of the run; `name`: under that name (a model is `model.pt`
        on its run, whatever its file is called: mule search --run finds it), linked, not copied."""
        if not self.client:
            return
        if name is None or name == Path(path).name:
            self.client.log_artifact(self.run_id, str(path), folder)
            return
        staging = Path(tempfile.mkdtemp(prefix=".artifact-", dir=Path(path).parent))
        try:
            try:
                os.link(path, staging / name)
            except OSError:  # another file system, or links refused: a copy
                shutil.copyfile(path, staging / name)
            self.client.log_artifact(self.run_id, str(staging / name), folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def json(self, data: Any, name: str, folder: str | None = None) -> None:
        if not self.client:
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(data, indent=2, default=str))
            self.client.log_artifact(self.run_id, str(path), folder)

    def text(self, text: str, name: str) -> None:
        if self.client:
            self.client.log_text(self.run_id, text, name)

    def figure(self, figure, name: str) -> None:
        if self.client:
            self.client.log_figure(self.run_id, figure, name)


def deployment_id() -> str | None:
    """The deployment the current flow run came from, if any, asking the API only when it
    must. `prefect.runtime.deployment.id` asks it on every call outside a deployment's
    run (Prefect 3.8 looks for `deployment_id` on the context, not on its flow run): 9
    calls a rebuild, with a new HTTP client each."""
    import os

    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None and context.flow_run.deployment_id:
        return str(context.flow_run.deployment_id)  # the deployment's own flow run
    if not os.environ.get("PREFECT__FLOW_RUN_ID"):
        # a flow called in this process (mule run, mule demo, a test): no deployment made
        # it; a deployment's run is started by a worker or runner, which sets the variable
        return None
    from prefect.runtime import deployment

    return deployment.id  # a stage's flow inside a deployment's run: Prefect's own lookup


def prefect_context() -> dict[str, str]:
    """The Prefect flow run and, when it came from one, its deployment; its UI link when a
    Prefect server (not the ephemeral API) is in use."""
    tags: dict[str, str] = {}
    flow_run_id = prefect_flow_run_id()
    if not flow_run_id:
        return tags
    tags["prefect.flow_run_id"] = flow_run_id
    try:
        import os

        from prefect.runtime import flow_run
        from prefect.utilities.urls import url_for

        if deployment_id():
            from prefect.runtime import deployment

            tags["prefect.deployment"] = f"{flow_run.flow_name}/{deployment.name}"
        if os.environ.get("PREFECT_API_URL") and not os.environ.get("MULE_PREFECT_TEMPORARY"):
            # a server the user runs; the ephemeral/temporary one has no UI to link to
            url = url_for("flow-run", obj_id=flow_run_id)  # the route the Prefect UI serves
            if url:
                tags["prefect.flow_run_url"] = url
    except Exception:  # noqa: BLE001 - context is a nicety, never a reason to fail a run
        pass
    return tags


def _run_tags(cfg, stage: str, parent_run_id: str | None) -> dict[str, str]:
    tags = {"mule.stage": stage, "mule.dataset": cfg.data.dataset, "mule.preset": cfg.preset}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    prefect = prefect_context()
    tags |= prefect
    # What the UI shows as "Created by" and "Source".
    try:
        tags["mlflow.user"] = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (some containers)
        pass
    if "prefect.deployment" in prefect:
        tags["mlflow.source.type"] = "JOB"
        tags["mlflow.source.name"] = f"prefect deployment {prefect['prefect.deployment']}"
    else:
        command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "python"
        tags["mlflow.source.type"], tags["mlflow.source.name"] = "LOCAL", command[:500]
    return tags | code_version()


@contextlib.contextmanager
def run(workdir: Workdir, cfg, stage: str, parent_run_id: str | None = None,
        tags: dict[str, str] | None = None) -> Iterator[str]:  # fmt: skip
    """An MLflow run for one stage (child of parent_run_id) or one rebuild (parent).

    Logs the resolved config as params and the Prefect flow-run id as a tag (and `tags`,
    from its creation on); ends FINISHED, or FAILED if the body raises.
    """
    c = client(workdir)
    created = c.create_run(
        experiment_id(workdir, cfg.data.dataset), run_name=stage, tags=_run_tags(cfg, stage, parent_run_id) | (tags or {})
    )
    run_id = created.info.run_id
    # open from its creation on: a stop while its config is logged (as its stage starts)
    # ends it KILLED, as the cleanups end the open runs; it stayed RUNNING
    _open_runs[run_id] = workdir
    interrupts.on_stop(_end_open_runs_killed, key="mlflow runs")  # a stop ends what this room opened
    status = "FAILED"
    try:
        tracker = Tracker(workdir, run_id)
        tracker.params(flatten(cfg))
        tracker.json(dataclasses.asdict(cfg), "config.json")
        yield run_id
        status = "FINISHED"
    except BaseException as error:
        if interrupts.is_stop(error, caused=True):  # Ctrl-C or SIGTERM, or what they caused: stopped, not failed
            status = "KILLED"
            let_go(error)
            c.set_tag(run_id, "mule.error_kind", "interrupted")
            raise
        # The failed run says why, as the console and the Prefect run do.
        c.set_tag(run_id, "mule.error", f"{error}"[:4900] or type(error).__name__)
        c.set_tag(run_id, "mule.error_type", type(error).__name__)
        c.set_tag(run_id, "mule.error_kind", "input" if is_user_error(error) else "bug")
        raise
    finally:
        _open_runs.pop(run_id, None)
        c.set_terminated(run_id, status)


def let_go(stop: BaseException) -> None:
    """The frames a stop went through drop what they held, before this process writes to
    MLflow's SQLite store again. A
    stop that lands inside a transaction, or while a query's rows are read, leaves that
    connection or cursor alive in those frames, and with it SQLite's lock (Python's sqlite3
    does not reset a statement on rollback): no other connection of this process could then
    commit, and the stop went to the watchdog's deadline (3.6-4.6 s)."""
    if stop.__traceback__ is not None:
        traceback.clear_frames(stop.__traceback__)  # the frames still running are left as they are


_open_runs: dict[str, Workdir] = {}  # run id -> workdir, for the runs this process has not ended yet


def _end_open_runs_killed() -> None:
    end_open_runs("KILLED")


def end_open_runs(status: str = "KILLED") -> list[str]:
    """Ends the runs this process still has open (a signal stops it while the main thread
    cannot unwind: stopping.interrupts), newest first; returns their ids."""
    ended = []
    for run_id, workdir in reversed(list(_open_runs.items())):
        _open_runs.pop(run_id, None)
        c = client(workdir)
        c.set_tag(run_id, "mule.error_kind", "interrupted")
        c.set_terminated(run_id, status)
        ended.append(run_id)
    return ended


def find_runs(workdir: Workdir, dataset: str, filter_string: str = "") -> list:
    c = client(workdir)
    experiment = c.get_experiment_by_name(f"mule/{dataset}")
    if experiment is None:
        return []
    return c.search_runs(
        [experiment.experiment_id], filter_string=filter_string, order_by=["attributes.start_time DESC"]
    )
