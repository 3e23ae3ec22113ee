"""How both generators write a dataset: into a temporary sibling folder, published by a
rename once its manifest is written, so an interrupted run never leaves half a dataset;
reused when the manifest matches the spec and the generator's code."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from mule.storage.atomic import process_alive


def manifest_matches(root: Path, spec, code: str) -> bool:
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError):  # none, or damaged: the dataset is generated again
        return False
    return isinstance(manifest, dict) and manifest.get("spec") == asdict(spec) and manifest.get("generator_code") == code


def staging_folder(root: Path) -> Path:
    """This process's temporary folder beside root, after removing those left by dead runs (or ours)."""
    for stale in root.parent.glob(f"{root.name}.tmp-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and (int(pid) == os.getpid() or not process_alive(int(pid))):
            shutil.rmtree(stale, ignore_errors=True)
    return root.with_name(root.name + f".tmp-{os.getpid()}")


def publish(tmp: Path, root: Path, spec, code: str, **extra) -> Path:
    """Writes the manifest last (the spec and the generator's code digest), then replaces root with tmp."""
    manifest = {"generator_code": code, "spec": asdict(spec), "created": time.time(), **extra}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, root)
    return root
