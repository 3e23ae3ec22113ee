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
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIRNAME = "mule-work"


def default_workdir() -> Path:
    return Path(os.environ.get("MULE_HOME") or Path.cwd() / DEFAULT_DIRNAME)


@dataclass(frozen=True)
class Workdir:
    root: Path

    @classmethod
    def at(cls, path: str | os.PathLike | None = None) -> Workdir:
        root = Path(path).expanduser() if path else default_workdir()
        root = root.resolve()
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

    @property
    def mlflow_uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def artifacts_dir(self) -> Path:
        return self.root / "mlartifacts"

    @property
    def prefect_home(self) -> Path:
        return self.root / "prefect"
