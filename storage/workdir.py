"""Where everything a run writes lives: one folder, the workdir.

<workdir>/
  catalog.duckdb                  views over the Parquet tables below
  catalog/<table>/<dataset>.parquet
  catalog/features/<dataset>/<extractor>/part-*.parquet (+ extractor.json)
  raw/embedded/                   the generated dataset (official Multi30K layout)
  models/<dataset>/               LP and trained models, checkpoints
  results/<dataset>/              recall tables (CSV, markdown, PNG)
  mlflow.db, mlartifacts/         MLflow tracking store and artifacts
  prefect/                        Prefect's home, unless PREFECT_HOME is set
  state/stages/<dataset>/         each stage's last key and result (a rebuild reuses a stage whose key is unchanged)
  state/file_hashes.json          file digests cached by size, mtime and inode
  workdir.json                    where this workdir was last used (to notice a copy or move)
  mule.lock                       held by the mule process working here (storage.locks)

A workdir is self-contained: a copy (made to try a variant) or a moved workdir must
never write into the folder it came from. Some stores keep absolute paths (MLflow's
artifact locations, DuckDB's views, the images table), so `home_marker` records the
root each workdir was last used at; when it differs, the stage flows rewrite those
paths before anything else runs (experiments.relocation).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from mule.mule_core.errors import UserError

DEFAULT_DIRNAME = "mule-work"
# A name that becomes part of a path inside the workdir (a dataset's, a model's): a plain
# file name, so that no name can lead out of the workdir or into another dataset's folders
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
# the one folder a model name may hold: the ablation's own models (pipeline/sweeps.py)
MODEL_FOLDERS = ("ablation",)


class BadNameError(UserError, ValueError):
    pass


def check_name(value: str, option: str, folders: tuple[str, ...] = ()) -> str:
    """`value` when it is a name (letters, digits, then also . _ - +; `folders`' names may
    lead it: ablation/mule-full), else one line naming the option and what is wrong."""
    text = str(value)
    head, sep, tail = text.partition("/")
    plain = tail if sep and head in folders else text
    if NAME.fullmatch(plain) and not plain.endswith("."):
        return text
    if os.path.isabs(text) or "/" in text or "\\" in text or ".." in Path(text).parts:
        why = "is a path"
    else:
        why = "has characters a name cannot hold"
    raise BadNameError(f"{option}={text!r} {why}: a name is letters, digits and . _ - + (it becomes a file name "
                     "inside the workdir)")  # fmt: skip


def default_workdir() -> Path:
    return Path(os.environ.get("MULE_HOME") or Path.cwd() / DEFAULT_DIRNAME)


@dataclass(frozen=True)
class Workdir:
    root: Path

    @classmethod
    def at(cls, path: str | os.PathLike | None = None, create: bool = True) -> Workdir:
        """The workdir at `path` (else $MULE_HOME, else ./mule-work), made if missing unless
        `create` is False (a reading command makes nothing)."""
        root = Path(path).expanduser() if path else default_workdir()
        root = root.resolve()
        if create:
            root.mkdir(parents=True, exist_ok=True)
        return cls(root)

    @property
    def catalog_dir(self) -> Path:
        return self.root / "catalog"

    @property
    def duckdb_path(self) -> Path:
        return self.root / "catalog.duckdb"

    def table_path(self, table: str, dataset: str) -> Path:
        return self.catalog_dir / table / f"{dataset}.parquet"

    def features_dir(self, dataset: str, extractor: str) -> Path:
        return self.catalog_dir / "features" / dataset / extractor

    def raw_dir(self, dataset: str) -> Path:
        return self.root / "raw" / dataset

    def models_dir(self, dataset: str) -> Path:
        return self.root / "models" / dataset

    def results_dir(self, dataset: str) -> Path:
        return self.root / "results" / dataset

    def model_path(self, dataset: str, name: str = "model") -> Path:
        """A trained model: "model" is the pipeline's, the others the ablation's and add-language's variants."""
        return self.models_dir(dataset) / f"{name}.pt"

    def checkpoint_path(self, dataset: str, name: str = "model") -> Path:
        return self.models_dir(dataset) / f"{name}-checkpoint.pt"

    def model_results_dir(self, dataset: str, name: str = "model") -> Path:
        """results/<dataset>/ for the main model, results/<dataset>/<name>/ for the others."""
        return self.results_dir(dataset) if name == "model" else self.results_dir(dataset) / name

    def lp_model_path(self, dataset: str, captions: str = "human", languages: tuple[str, ...] | None = None,
                      seed: int = 0) -> Path:  # fmt: skip
        """One LP model per training-caption selection (data.captions): LP on human + MT
        captions is another model than LP on human captions only. LP over only some of the
        dataset's languages (a base model a language will be added to) is its own file too,
        and so is LP with another seed (the ablation's seeds each pretrain their own)."""
        suffix = "" if captions == "human" else "." + captions.replace("+", "-")
        suffix += "." + "-".join(languages) if languages else ""
        suffix += f".s{seed}" if seed else ""
        return self.models_dir(dataset) / f"pretrain{suffix}.pt"

    @property
    def mlflow_uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def artifacts_dir(self) -> Path:
        return self.root / "mlartifacts"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    def stage_record_path(self, dataset: str, stage: str, slot: str = "") -> Path:
        return self.state_dir / "stages" / dataset / f"{stage}{'.' + slot if slot else ''}.json"

    @property
    def prefect_home(self) -> Path:
        return self.root / "prefect"

    @property
    def lock_path(self) -> Path:
        return self.root / "mule.lock"

    @property
    def catalog_lock_path(self) -> Path:
        """Readers' and writers' lock on what readers see (storage.locks.committing)."""
        return self.state_dir / "catalog.lock"

    @property
    def home_marker(self) -> Path:
        return self.root / "workdir.json"

    def recorded_root(self) -> Path | None:
        """The root this workdir was last used at (None for a new or pre-marker workdir)."""
        try:
            return Path(json.loads(self.home_marker.read_text())["root"])
        except (FileNotFoundError, KeyError, ValueError):
            return None

    def moved_from(self) -> Path | None:
        """The root this workdir was copied or moved from, while no run has adopted it here
        yet (experiments.relocation); None when it is where it was last used."""
        previous = self.recorded_root()
        return previous if previous is not None and previous != self.root else None

    def here(self, path: Path) -> Path:
        """A path stored before the workdir was copied or moved, as it is now (for readers:
        a run rewrites the stored paths for good, experiments.relocation)."""
        moved = self.moved_from()
        if moved is not None and Path(path).is_relative_to(moved):
            return self.root / Path(path).relative_to(moved)
        return Path(path)

    def record_root(self) -> None:
        from mule.storage.atomic import write_json_atomic

        write_json_atomic({"root": str(self.root)}, self.home_marker, crash_point=False)


def sqlite_problem(path: Path) -> str | None:
    """What is wrong with an SQLite database file (MLflow's store, Prefect's), None when
    it reads (or is not there: it is created). A quick check: pages and indexes, not rows."""
    import sqlite3

    if not path.exists():
        return None

    def quick_check(read_only: bool):
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}{'?mode=ro' if read_only else ''}", uri=True)) as con:
            return con.execute("PRAGMA quick_check").fetchone()

    try:
        try:
            result = quick_check(read_only=True)
        except sqlite3.OperationalError as error:
            # A writer killed mid-transaction (a stop, a crash) leaves a hot journal, which a
            # read-only connection cannot roll back ("attempt to write a readonly database"):
            # that is SQLite's own recovery, which any writer runs first, not damage.
            if getattr(error, "sqlite_errorname", "") != "SQLITE_READONLY_ROLLBACK":
                raise
            result = quick_check(read_only=False)
    except sqlite3.Error as error:
        return str(error)
    return None if result and result[0] == "ok" else f"quick_check says {result[0] if result else 'nothing'}"
