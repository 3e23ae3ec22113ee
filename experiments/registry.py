"""The MLflow Model Registry: every model the train stage completes is a version of
`mule-<dataset>`; the alias `champion` names the best one.

A version carries its validation mR (and, once the evaluate stage ran, its test mR) as
tags, with what makes two numbers comparable: the languages and the validation images.
`champion` moves to a new version only when it beats the champion's validation mR on the
same languages and validation images; a worse model, or one measured on other images,
is registered and left where it is, with the reason as a tag. A rebuild never demotes a
better model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mlflow.exceptions import MlflowException

from mule.experiments import mlflow_store, tracking
from mule.mule_core.errors import UserError
from mule.mule_core.progress import SHOWN
from mule.storage.content_digests import ids_digest
from mule.storage.workdir import Workdir

CHAMPION = "champion"
SETTLED = "mule.champion_settled"  # the version's champion decision is carried out


class RegistryError(UserError, LookupError):
    pass


def model_name(dataset: str) -> str:
    return f"mule-{dataset}"


def split_digest(image_ids: list[str]) -> str:
    return ids_digest(image_ids)


@dataclass(frozen=True)
class Candidate:
    dataset: str
    run_id: str
    source: str  # the logged model's URI (models:/m-...), an MLflow pyfunc model (serving/mlflow_model.py)
    val_mR: float
    languages: tuple[str, ...]
    val_split: str  # digest of the validation image ids
    eval_split: str  # the evaluation split's name (test, test_2016, ...)
    model_identity: str = ""  # model_identity(the train stage's record): registered once, whoever publishes it


def _tags(c: Candidate) -> dict[str, str]:
    return {"mule.val_mR": f"{c.val_mR:.4f}", "mule.languages": ",".join(c.languages),
            "mule.val_split": c.val_split, "mule.eval_split": c.eval_split, "mule.dataset": c.dataset,
            "mule.train_run_id": c.run_id, "mule.model_identity": c.model_identity}  # fmt: skip


def model_identity(train_record: dict | None) -> str:
    """What tells one trained model from another: the train stage's key and its weights'
    digest (a forced retrain that makes other weights is another model); "" for none."""
    if not train_record:
        return ""
    blob = json.dumps([train_record.get("key"), train_record.get("outputs")], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def registered_for(workdir: Workdir, dataset: str, model_identity: str) -> dict[str, Any] | None:
    """The version already registered for this train key (a run that registered it and
    stopped before its record said so), as register() returns it, its champion decision
    finished if the stop came before that; None when there is none."""
    if not model_identity:
        return None
    client, name = tracking.client(workdir), model_name(dataset)
    try:
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException:
        return None
    found = [v for v in versions if v.tags.get("mule.model_identity") == model_identity]
    if not found:
        return None
    version = min(found, key=lambda v: int(v.version))
    settled = _settle(client, name, version)
    settled["why"] += " (registered before, by the run that trained it)"
    return settled


def _champion(client, name: str):
    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


def _decide(client, name: str, version) -> tuple[bool, str]:
    """Whether `version` should hold the alias, against the champion other than itself."""
    champion = _champion(client, name)
    if champion is None:
        return True, "first model of this dataset"
    if champion.version == version.version:
        return True, version.tags.get("mule.champion_decision") or "champion"
    tags, mine = champion.tags, version.tags
    # Comparable: the same languages, measured on the same validation images. The split a
    # model's test mR is named by (eval.split) is not its validation: it never blocks.
    same = (tags.get("mule.languages"), tags.get("mule.val_split")) == (mine.get("mule.languages"),
                                                                         mine.get("mule.val_split"))  # fmt: skip
    best, mine_mr = float(tags.get("mule.val_mR", "nan")), float(mine.get("mule.val_mR", "nan"))
    if not same:
        return False, (f"not comparable with champion v{champion.version} (other languages or validation "
                       "images); promote it by hand if it should serve")  # fmt: skip
    if mine_mr > best:
        return True, f"val mR {mine_mr:.2f} beats champion v{champion.version} ({best:.2f})"
    return False, f"val mR {mine_mr:.2f} does not beat champion v{champion.version} ({best:.2f})"


def _settle(client, name: str, version) -> dict[str, Any]:
    """The champion decision for a version, made and carried out until it is settled.

    A version's writes are: the version with its tags (one write), its decision (a tag),
    the alias when it wins, and `mule.champion_settled`. A stop or an error between any two
    leaves the version unsettled, and the next publish of the same model (registered_for)
    decides again against the registry as it is then and finishes: the registry ends as an
    uninterrupted run leaves it. Settled versions are never decided again (a champion moved
    by hand stays where it was put)."""
    if version.tags.get(SETTLED) == "true":
        champion = _champion(client, name)
        return {"model": name, "version": int(version.version),
                "champion": champion is not None and champion.version == version.version,
                "why": version.tags.get("mule.champion_decision", "")}  # fmt: skip
    promote, why = _decide(client, name, version)
    if version.tags.get("mule.champion_decision") != why:
        client.set_model_version_tag(name, version.version, "mule.champion_decision", why)
    if promote:
        client.set_registered_model_alias(name, CHAMPION, version.version)
    client.set_model_version_tag(name, version.version, SETTLED, "true")
    return {"model": name, "version": int(version.version), "champion": promote, "why": why}


def register(workdir: Workdir, candidate: Candidate) -> dict[str, Any]:
    """Registers the candidate; moves `champion` to it when it is better (see the module doc)."""
    client, name = tracking.client(workdir), model_name(candidate.dataset)
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description=f"mule models trained on {candidate.dataset}; "
                                       f"alias {CHAMPION!r}: the best validation mR so far")  # fmt: skip
    version = client.create_model_version(name, candidate.source, run_id=candidate.run_id, tags=_tags(candidate))
    decided = _settle(client, name, version)
    logging.getLogger("mule.registry").info("registered %s version %s; %s: %s", name, version.version,
                  f"now {CHAMPION}" if decided["champion"] else f"{CHAMPION} stays", decided["why"], extra=SHOWN)  # fmt: skip
    return decided


def tag_test_results(workdir: Workdir, dataset: str, train: dict | None, split: str, mean_mr: float | None,
                     table: dict) -> int | None:  # fmt: skip
    """Adds the evaluated split's mR (mule.<split>.mR, and per language) to the version the
    train stage registered (`train`: its record: the version with its key, or one its runs
    registered); returns its number."""
    if not train or mean_mr is None:
        return None
    client = tracking.client(workdir)
    runs = {train.get("run_id"), train.get("published_in_run")} - {None}
    try:
        versions = [v for v in client.search_model_versions(f"name = '{model_name(dataset)}'")
                    if v.tags.get("mule.model_identity") == model_identity(train) or v.run_id in runs]  # fmt: skip
    except MlflowException:
        return None
    for version in versions:
        client.set_model_version_tag(version.name, version.version, f"mule.{split}.mR", f"{mean_mr:.4f}")
        for lang, row in table.items():
            client.set_model_version_tag(version.name, version.version, f"mule.{split}.mR.{lang}", f"{row['mR']:.4f}")
    return int(versions[0].version) if versions else None


def resolve_model_file(
    workdir: Workdir, dataset: str, run_id: str | None = None, version: str | None = None
) -> tuple[Path, str]:
    """The weights-only model file (data_catalog.model_files format) of a train run: the champion's
    unless a run id or version is given. Returns (path, what it is, for messages)."""
    if not mlflow_store.store_exists(workdir):
        raise RegistryError(f"no trained model in {workdir.root} (no MLflow store yet): train a model first "
                            "(mule demo, or mule run train)")  # fmt: skip
    client, name = tracking.client(workdir), model_name(dataset)
    if run_id is None:
        try:
            found = (
                client.get_model_version(name, version)
                if version
                else client.get_model_version_by_alias(name, CHAMPION)
            )
        except MlflowException:
            what = f"version {version}" if version else f"no {CHAMPION}"
            raise RegistryError(f"registered model {name} has {what} in {workdir.root}: train a model first "
                                "(mule demo, or mule run train), or pass --run RUN_ID") from None  # fmt: skip
        run_id, label = found.run_id, f"{name} v{found.version}" + (" (champion)" if not version else "")
    else:
        label = f"run {run_id}"
    try:
        root = client.get_run(run_id).info.artifact_uri
    except MlflowException:
        raise RegistryError(f"no MLflow run {run_id} in {workdir.root}") from None
    if root.startswith("file://"):  # the workdir's own artifact store: read in place (where it is now)
        path = workdir.here(Path(urlparse(root).path) / "model.pt")
    else:
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        try:
            path = Path(client.download_artifacts(run_id, "model.pt"))
        except (MlflowException, OSError):  # no such artifact: the error below says so
            path = None
    if path is None or not path.is_file():
        raise RegistryError(f"{label}: its run {run_id} has no model.pt artifact (not a train run?)")
    return path, label
