"""bench/stage_times.py runs --size 29k with the `default` preset wherever a checkout has
one: since the config moved to config/ it looked in the old place and ran the demo's."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stage_times():
    spec = importlib.util.spec_from_file_location("stage_times", REPO / "bench" / "stage_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_29k_runs_the_default_preset_in_this_checkout_and_in_older_layouts(tmp_path):
    presets = stage_times().preset_args
    assert presets(REPO, "29k") == ["--preset", "default"]  # this checkout: config/resolution.py
    assert presets(REPO, "demo") == [] and presets(REPO, "real") == []  # the dataset's own preset
    assert presets(REPO, "29k", "paper") == ["--preset", "paper"]  # --preset wins
    old = tmp_path / "old"
    (old / "pipeline").mkdir(parents=True)
    (old / "pipeline" / "config.py").write_text('PRESETS = {"demo": {...}, "default": {}}')
    assert presets(old, "29k") == ["--preset", "default"]  # 2026-11-26 to 11-27: presets in pipeline/config.py
    (old / "pipeline" / "config.py").write_text('PRESETS = {"demo": {}}')
    assert presets(old, "29k") == []  # before: the demo preset was the defaults
