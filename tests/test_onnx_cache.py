"""The CPU extractor's ONNX model is kept in the user's cache: a later process loads it
instead of importing timm and exporting, and gets the same features; a damaged or
unwritable cache only costs the export."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from mule.config.sections import FeaturesConfig
from mule.data_catalog import weights
from mule.mule_core import onnx_engine

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not onnx_engine.available(), reason="ONNX Runtime is not installed")]

SETTING = FeaturesConfig(arch="efficientnet_lite0", weights="imagenet", input_size=32)
REPO = Path(__file__).resolve().parents[1]

# A fresh process: the extractor, the features of CROPS, and whether timm was imported.
CHILD = """
import json, sys, numpy as np, torch
from mule.data_catalog.weights import load_extractor
from mule.config.sections import FeaturesConfig
network, info = load_extractor(FeaturesConfig(arch="efficientnet_lite0", weights="imagenet", input_size=32),
                               torch.device("cpu"))
crops = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (4, 3, 32, 32), dtype=np.uint8))
print(json.dumps({"features": network(crops).tolist(), "timm": "timm" in sys.modules, "engine": info["engine"]}))
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(weights, "_NETWORKS", {})  # this process's networks: built afresh
    return tmp_path / "cache" / "mule" / "onnx"


def built(setting=SETTING):
    network, info = weights.load_extractor(setting, torch.device("cpu"))
    assert info["engine"] == "onnxruntime"
    size = setting.input_size
    crops = np.random.default_rng(0).integers(0, 256, (4, 3, size, size), dtype=np.uint8)
    return network(torch.from_numpy(crops)).numpy()


def test_the_model_is_exported_once_and_a_new_process_loads_it_without_timm(cache):
    first = built()
    (file,) = cache.glob("*.onnx")
    assert file.name.startswith("efficientnet_lite0-32px-")
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=REPO,
                           env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)  # fmt: skip
    assert child.returncode == 0, child.stderr[-2000:]
    answer = json.loads(child.stdout.splitlines()[-1])
    assert answer["engine"] == "onnxruntime" and answer["timm"] is False  # loaded, not exported
    assert np.array_equal(np.asarray(answer["features"], dtype=np.float32), first)  # the same features
    assert list(cache.glob("*.onnx")) == [file]


def test_each_setting_and_weights_have_their_own_model(cache):
    built()
    built(replace(SETTING, input_size=48))
    built(replace(SETTING, weights="random", seed=3))
    files = sorted(p.name for p in cache.glob("*.onnx"))
    assert len(files) == 3 and sum(name.startswith("efficientnet_lite0-48px-") for name in files) == 1
    seeds = {weights.onnx_cache_file(replace(SETTING, weights="random", seed=s), {}) for s in (3, 4)}
    assert len(seeds) == 2  # random weights: one model per seed


def test_a_damaged_model_in_the_cache_is_exported_again(cache):
    first = built()
    (file,) = cache.glob("*.onnx")
    file.write_bytes(file.read_bytes()[:1000])  # cut short
    weights._NETWORKS.clear()
    assert np.array_equal(built(), first)
    assert file.stat().st_size > 1000  # replaced by a whole model


def test_a_cache_that_cannot_be_written_costs_only_the_export(tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(weights, "_NETWORKS", {})
    assert built().shape == (4, 1280)
