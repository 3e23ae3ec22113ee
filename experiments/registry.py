"""The MLflow Model Registry: every model the train stage completes is a version of
`mule-<dataset>`; the alias `champion` names the best one.

A version carries its validation mR (and, once the evaluate stage ran, its test mR) as
tags, with what makes two numbers comparable: the set of languages (in any order), the
validation images and the measure (the Ks the mR is the mean over, and the metrics'
protocol: mule_core.metrics.measure_of). `champion` moves to a new version only when it
beats the champion's validation mR on all three; a worse model, or one measured otherwise,
is registered and left where it is, with the reason as a tag. A rebuild never demotes a
better model. A model is its weights and vocabularies (their digest): the same weights
trained again are the same version, whoever publishes them; the champion's training stored
anew at another precision (output.tables: its tables rounded otherwise) takes its place, as
the file the user configured now.

Languages added to a trained model (`mule run add-language`) make a model that reads more:
its version names the models it extends (`mule.extends`), and one that extends the
champion becomes the champion (it serves the champion's languages by the same weights, to
the bit, and more). A model reading fewer languages than the champion never takes its
place on its own (its users would lose a language): its reason tag says to add them to it,
and a version is served by hand with `--version N` (mule serve, search, export) or
`models:/mule-<dataset>/N` (mule.api.load, mule embed).

Every write a stop can cut is finished by the next publish of any model of the dataset,
before that model is decided: a candidate whose version was never made (its run carries
the intent, `mule.registry_candidate`) is registered, and every version whose decision was
not carried out is decided, oldest first; the registry ends as an uninterrupted run's.
An intent ends the moment its version is written (its tag is deleted), so a version or a
registered model deleted by hand is never made again; a champion set by hand stays until
a better comparable model is published. Intents written before they ended (without
`"ends": true`) are taken as ended: a stop that cut one still has its stage record
unpublished, and the next run publishes that model again (pipeline.hooks).
"""

from __future__ import annotations

import dataclasses
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
INTENT = "mule.registry_candidate"  # on a candidate's run before its version is made: the candidate, as JSON


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
    measure: str = ""  # what val_mR measures (mule_core.metrics.measure_of: the Ks and the protocol)
    # the identities of the models it extends, its root first: a language added to them, theirs unchanged
    extends: tuple[str, ...] = ()
    # its weights' digest before the tables were rounded to output.tables: the same training
    # stored at another precision has another model_identity and this one
    trained_identity: str = ""


def _tags(c: Candidate) -> dict[str, str]:
    return {"mule.val_mR": f"{c.val_mR:.4f}", "mule.languages": ",".join(c.languages),
            "mule.val_split": c.val_split, "mule.eval_split": c.eval_split, "mule.dataset": c.dataset,
            "mule.train_run_id": c.run_id, "mule.model_identity": c.model_identity,
            "mule.val_measure": c.measure, **({"mule.extends": ",".join(c.extends)} if c.extends else {}),
            **({"mule.trained_identity": c.trained_identity} if c.trained_identity else {})}  # fmt: skip


def model_identity(train_record: dict | None) -> str:
    """What tells one trained model from another: the digest of its weights and vocabularies
    (the train stage's result says it: data_catalog.model_files.weights_digest), so a model
    trained again to the same weights is the same model; a record made before results
    carried it: its key and its outputs' digests. "" for none."""
    if not train_record:
        return ""
    digest = (train_record.get("result") or {}).get("weights_digest")
    if digest:
        return str(digest)
    blob = json.dumps([train_record.get("key"), train_record.get("outputs")], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def registered_for(workdir: Workdir, dataset: str, model_identity: str) -> dict[str, Any] | None:
    """The version already registered for this model identity (its weights: a run that
    registered it and stopped before its record said so, or another run that trained the
    same weights), as register() returns it, what stops left undone finished first; None
    when there is none."""
    if not model_identity:
        return None
    client, name = tracking.client(workdir), model_name(dataset)
    try:
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException:
        return None
    found = [v for v in versions if _identity(workdir, client, v) == model_identity
             and not model_lost(workdir, client, v)]  # a version whose files are gone is no version of it  # fmt: skip
    if not found:
        return None
    _finish_cut_writes(client, name, dataset, workdir)
    version = client.get_model_version(name, min(found, key=lambda v: int(v.version)).version)
    settled = _settle(client, name, version, workdir)
    settled["why"] += " (registered before: these weights are this version, whichever run trained them)"
    return settled


def model_lost(workdir: Workdir, client, version) -> str:
    """Why a version's model cannot be loaded, "" when it can: its run is gone, or the run's
    model.pt (`mlflow gc`, a hand in the artifact store)."""
    try:
        root = client.get_run(version.run_id).info.artifact_uri
    except MlflowException:
        return f"its run {version.run_id} is gone"
    if root.startswith("file://") and not workdir.here(Path(urlparse(root).path) / "model.pt").is_file():
        return f"its run {version.run_id} holds no model.pt any more"
    return ""


def lost(workdir: Workdir, dataset: str, model_identity: str) -> str:
    """Why the model of this identity cannot be loaded from the registry ("" when a version
    of it loads, or it has none: a version deleted by hand is not made again)."""
    if not model_identity or not mlflow_store.store_exists(workdir):
        return ""
    client = tracking.client(workdir)
    try:
        versions = client.search_model_versions(f"name = '{model_name(dataset)}'")
    except MlflowException:
        return ""
    mine = [v for v in versions if v.tags.get("mule.model_identity") == model_identity]
    reasons = [model_lost(workdir, client, v) for v in mine]
    return f"v{mine[0].version}: {reasons[0]}" if mine and all(reasons) else ""


WEIGHTS_DIGEST_LENGTH = 16  # data_catalog.model_files.weights_digest's; identities made before were 24 long


def _identity(workdir: Workdir, client, version) -> str:
    """A version's model identity. One registered before identities were the weights' digest
    gets it from its run's model.pt (in the workdir's own artifact store), once: it is
    tagged, so a model trained again after upgrading is found as the version it is."""
    identity = version.tags.get("mule.model_identity", "")
    if not identity or len(identity) == WEIGHTS_DIGEST_LENGTH:
        return identity
    try:
        root = client.get_run(version.run_id).info.artifact_uri
    except MlflowException:
        return identity
    if not root.startswith("file://"):
        return identity
    path = workdir.here(Path(urlparse(root).path) / "model.pt")
    if not path.is_file():
        return identity
    from mule.data_catalog.model_files import model_digest

    try:
        digest = model_digest(path) or identity
    except Exception:  # noqa: BLE001 - not a model file torch reads (damaged, another program's): as tagged
        return identity
    client.set_model_version_tag(version.name, version.version, "mule.model_identity", digest)
    version.tags["mule.model_identity"] = digest
    return digest


def _finish_cut_writes(client, name: str, dataset: str, workdir: Workdir | None = None) -> None:
    """What stops left undone in the dataset's registry, in the order an uninterrupted run
    does it: candidates whose version was never made are registered, and every version
    whose decision was not carried out is decided, oldest first (against the champion as
    each decision leaves it)."""
    for candidate in _intended(client, name, dataset):
        _create_version(client, name, candidate)
    try:
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException:
        return
    for version in sorted(versions, key=lambda v: int(v.version)):
        if version.tags.get(SETTLED) != "true":
            _settle(client, name, version, workdir)


def _intended(client, name: str, dataset: str) -> list[Candidate]:
    """Candidates whose runs say they were to be registered and that have no version."""
    experiment = client.get_experiment_by_name(f"mule/{dataset}")
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{INTENT}` LIKE '%'",
                              order_by=["attributes.start_time ASC"], max_results=10_000)  # fmt: skip
    if not runs:
        return []
    try:
        registered = {(v.run_id, v.tags.get("mule.model_identity")) for v in client.search_model_versions(f"name = '{name}'")}
    except MlflowException:
        registered = set()
    identities = {identity for _, identity in registered}
    wanted = []
    for run in runs:
        try:
            data = json.loads(run.data.tags[INTENT])
            if not (isinstance(data, dict) and data.pop("ends", False) is True):
                raise ValueError("an intent from before intents ended")
            candidate = Candidate(**{**data, "languages": tuple(data["languages"]),
                                     "extends": tuple(data.get("extends", ()))})  # fmt: skip
        except (TypeError, ValueError, KeyError):
            _end_intent(client, run.info.run_id)  # not one this mule carries out: its version exists or was deleted
            continue
        if candidate.model_identity in identities if candidate.model_identity else (run.info.run_id, "") in registered:
            _end_intent(client, run.info.run_id)  # written, and stopped before the intent ended
            continue
        wanted.append(candidate)
        identities.add(candidate.model_identity)
    return wanted


def _end_intent(client, run_id: str) -> None:
    try:
        client.delete_tag(run_id, INTENT)
    except MlflowException:  # the run is gone: nothing left to carry out
        pass


def _champion(client, name: str):
    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


def _decide(client, name: str, version, workdir: Workdir | None = None) -> tuple[bool, str]:
    """Whether `version` should hold the alias, against the champion other than itself."""
    champion = _champion(client, name)
    if champion is None:
        return True, "first model of this dataset"
    if champion.version == version.version:
        return True, version.tags.get("mule.champion_decision") or "champion"
    gone = model_lost(workdir, client, champion) if workdir is not None else ""
    if gone:  # a champion that cannot be loaded serves no one
        return True, f"champion v{champion.version} cannot be loaded ({gone}): v{version.version} takes its place"
    tags, mine = champion.tags, version.tags
    # A model that extends the champion reads its languages through its very weights, and
    # more: it serves everything the champion serves, to the bit, so it takes its place.
    extended = [x for x in mine.get("mule.extends", "").split(",") if x]
    if tags.get("mule.model_identity") and tags.get("mule.model_identity") in extended:
        more = sorted(set(_language_set(mine) or ()) - set(_language_set(tags) or ()))
        return True, (f"champion v{champion.version} with {', '.join(more)} added (its languages read by the same "
                      "weights: bit-identical)")  # fmt: skip
    # The champion's very training stored anew (its tables at another precision, or a champion
    # stored before tables were rounded: its weights are its training's): the model the user
    # configured now serves, measured as the champion was.
    trained = mine.get("mule.trained_identity")
    stored = _identity(workdir, client, champion) if workdir is not None else tags.get("mule.model_identity")
    if trained and trained in (tags.get("mule.trained_identity"), stored):
        return True, (f"the training of champion v{champion.version}, stored anew (another output.tables): it serves in "
                      "its place")  # fmt: skip
    # Comparable: the same set of languages, measured on the same validation images by the
    # same measure. The split a model's test mR is named by (eval.split) is not its
    # validation: it never blocks.
    differs = [what for what, a, b in (
        ("languages", _language_set(tags), _language_set(mine)),
        ("validation images", tags.get("mule.val_split"), mine.get("mule.val_split")),
        ("measure", _measure(client, champion), _measure(client, version))) if a != b or a is None]  # fmt: skip
    best, mine_mr = float(tags.get("mule.val_mR", "nan")), float(mine.get("mule.val_mR", "nan"))
    lacking = sorted(set(_language_set(tags) or ()) - set(_language_set(mine) or ()))
    if tags.get("mule.extends") and lacking and set(_language_set(mine) or ()) < set(_language_set(tags) or ()):
        # the champion has languages added to it, and this model lacks some: never served in its place unasked
        return False, (f"reads fewer languages than champion v{champion.version} (not {', '.join(lacking)}): add them to "
                       f"it (mule run add-language --lang {','.join(lacking)}) and that model is compared, or promote "
                       "it by hand if it should serve")  # fmt: skip
    if differs:
        theirs, ours = _shown(client, champion, differs), _shown(client, version, differs)
        tail = ours[ours.rfind(" ("):] if ours.endswith(")") and " (" in ours else ""
        theirs = theirs.removesuffix(tail) if tail and theirs.endswith(tail) else theirs  # a protocol said once
        return False, (f"not comparable with champion v{champion.version} (other {' and '.join(differs)}: "
                       f"{theirs} against {ours}); promote it by hand if it should serve")  # fmt: skip
    if mine_mr > best:
        return True, f"val mR {mine_mr:.2f} beats champion v{champion.version} ({best:.2f})"
    return False, f"val mR {mine_mr:.2f} does not beat champion v{champion.version} ({best:.2f})"


def _language_set(tags: dict) -> tuple[str, ...] | None:
    languages = tags.get("mule.languages")
    return None if languages is None else tuple(sorted(lang for lang in languages.split(",") if lang))


def _measure(client, version) -> str | None:
    """What a version's validation mR measures: its tag, or for a version registered before
    versions carried it, the Ks its train run was given (with today's protocol)."""
    measure = version.tags.get("mule.val_measure")
    if measure:
        return measure
    from mule.mule_core.metrics import measure_of

    try:
        ks = client.get_run(version.run_id).data.params.get("eval.ks")
        return measure_of(int(k) for k in ks.split(",")) if ks else None
    except (MlflowException, ValueError, AttributeError):
        return None


def _shown(client, version, what: list[str]) -> str:
    """A version's side of a comparison, for the reason tag."""
    parts = {"languages": ",".join(_language_set(version.tags) or ("?",)),
             "validation images": str(version.tags.get("mule.val_split", "?"))[:12],
             "measure": _measure(client, version) or "unknown"}  # fmt: skip
    return f"v{version.version} " + "; ".join(parts[w] for w in what)


def _settle(client, name: str, version, workdir: Workdir | None = None) -> dict[str, Any]:
    """The champion decision for a version, made and carried out until it is settled.

    A version's writes are: the version with its tags (one write), its decision (a tag),
    the alias when it wins, and `mule.champion_settled`. A stop or an error between any two
    leaves the version unsettled, and the next publish of the same model (registered_for)
    decides again against the registry as it is then and finishes: the registry ends as an
    uninterrupted run leaves it. Settled versions are never decided again (a champion moved
    by hand stays where it was put)."""
    if version.tags.get(SETTLED) == "true":
        champion = _champion(client, name)
        return {"model": name, "version": int(version.version), "run_id": version.run_id,
                "champion": champion is not None and champion.version == version.version,
                "why": version.tags.get("mule.champion_decision", "")}  # fmt: skip
    promote, why = _decide(client, name, version, workdir)
    if version.tags.get("mule.champion_decision") != why:
        client.set_model_version_tag(name, version.version, "mule.champion_decision", why)
    if promote:
        client.set_registered_model_alias(name, CHAMPION, version.version)
    client.set_model_version_tag(name, version.version, SETTLED, "true")
    return {"model": name, "version": int(version.version), "run_id": version.run_id, "champion": promote, "why": why}


def register(workdir: Workdir, candidate: Candidate) -> dict[str, Any]:
    """Registers the candidate; moves `champion` to it when it is better (see the module
    doc), after finishing whatever an earlier stop left undone."""
    client, name = tracking.client(workdir), model_name(candidate.dataset)
    # the intent first: a stop from here on leaves it for the next publish to carry out
    client.set_tag(candidate.run_id, INTENT, json.dumps(dataclasses.asdict(candidate) | {"ends": True}))
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description=f"mule models trained on {candidate.dataset}; "
                                       f"alias {CHAMPION!r}: the best validation mR so far")  # fmt: skip
    _finish_cut_writes(client, name, candidate.dataset, workdir)  # this candidate's version too, when it has none yet
    found = [v for v in client.search_model_versions(f"name = '{name}'")
             if (v.tags.get("mule.model_identity") == candidate.model_identity if candidate.model_identity
                 else v.run_id == candidate.run_id) and not model_lost(workdir, client, v)]  # fmt: skip
    version = min(found, key=lambda v: int(v.version)) if found else _create_version(client, name, candidate)
    decided = _settle(client, name, client.get_model_version(name, version.version), workdir)
    logging.getLogger("mule.registry").info("registered %s version %s; %s: %s", name, version.version,
                  f"now {CHAMPION}" if decided["champion"] else f"{CHAMPION} stays", decided["why"], extra=SHOWN)  # fmt: skip
    return decided


def _create_version(client, name: str, candidate: Candidate):
    """The candidate's version; its intent ends with it (a stop between the two: the next
    publish finds the version and ends the intent)."""
    version = client.create_model_version(name, candidate.source, run_id=candidate.run_id, tags=_tags(candidate))
    _end_intent(client, candidate.run_id)
    return version


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
            if version:
                try:
                    held = sorted(int(v.version) for v in client.search_model_versions(f"name = '{name}'"))
                except MlflowException:
                    held = []
                listed = f"its versions: {', '.join(map(str, held))}" if held else "it has none"
                raise RegistryError(f"registered model {name} has no version {version} in {workdir.root} ({listed}): "
                                    "pass one of them, or --run RUN_ID") from None  # fmt: skip
            raise RegistryError(f"registered model {name} has no {CHAMPION} in {workdir.root}: train a model first "
                                "(mule demo, or mule run train), or pass --run RUN_ID") from None  # fmt: skip
        run_id, label = found.run_id, f"{name} v{found.version}" + (" (champion)" if not version else "")
    else:
        label = f"run {run_id}"
    try:
        root = client.get_run(run_id).info.artifact_uri
    except MlflowException:
        raise RegistryError(f"{label}: no MLflow run {run_id} in {workdir.root} (deleted, or removed by mlflow gc): "
                            "the run of the stage that trained it (mule run train, or mule run add-language) "
                            "publishes it again from the workdir") from None  # fmt: skip
    if root.startswith("file://"):  # the workdir's own artifact store: read in place (where it is now)
        path = workdir.here(Path(urlparse(root).path) / "model.pt")
    else:
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        try:
            path = Path(client.download_artifacts(run_id, "model.pt"))
        except (MlflowException, OSError):  # no such artifact: the error below says so
            path = None
    if path is None or not path.is_file():
        raise RegistryError(f"{label}: its run {run_id} has no model.pt artifact (not a train run, or its files were "
                            "removed: mlflow gc): the run of the stage that trained it (mule run train, or mule run "
                            "add-language) publishes it again from the workdir")  # fmt: skip
    return path, label
