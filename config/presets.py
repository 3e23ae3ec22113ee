"""Named presets: overrides on the defaults, one TOML file each in config/presets/
(`mule config --list` lists them with their summaries)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).with_name("presets")


def _load() -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    presets, summaries = {}, {}
    for path in sorted(FOLDER.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        presets[path.stem] = dict(data.get("set", {}))
        summaries[path.stem] = str(data.get("summary", ""))
    return presets, summaries


PRESETS, SUMMARIES = _load()
