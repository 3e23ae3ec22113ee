"""A feature extractor run by ONNX Runtime: on the CPU, eager PyTorch is slow on the
depthwise convolutions of EfficientNet (ORT runs Lite0 1.5-2x faster on 2 cores).

The PyTorch module is exported in memory, with its input normalisation, for one input
size and any batch; calls take and give the same tensors as the module. The exported
bytes can be kept and loaded again (`export`, `OnnxExtractor.from_bytes`): the caller
decides where (data_catalog/weights.py keeps them in the user's cache, which saves a
process that extracts importing timm and exporting, about 2.5 s).

With several threads, ONNX Runtime runs each call on one thread, and a batch is split
into one slice of crops per thread, the slices run side by side: EfficientNet-Lite0's
small convolutions wait on each other when one op is split over threads (on 2 cores,
2026-11-26: 104-113 images/s for batches of 4 split op by op, 133-154 for batches of 2
as two slices of one crop; 81-87 on one thread; bench/features_throughput.py).
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import nn


def available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def export(module: nn.Module, input_size: int) -> bytes:
    """The module as an ONNX model: uint8 crops (n, 3, input_size, input_size) -> features."""
    buffer = io.BytesIO()
    example = torch.zeros(1, 3, input_size, input_size, dtype=torch.uint8)
    with torch.no_grad():
        torch.onnx.export(module.cpu().eval().to(memory_format=torch.contiguous_format), (example,), buffer,
                          input_names=["crops"], output_names=["features"],
                          dynamic_axes={"crops": {0: "n"}, "features": {0: "n"}}, dynamo=False)  # fmt: skip
    return buffer.getvalue()


class OnnxExtractor:
    def __init__(self, module: nn.Module, input_size: int, threads: int):
        self._start(export(module, input_size), input_size, threads)

    @classmethod
    def from_bytes(cls, model: bytes, input_size: int, threads: int) -> OnnxExtractor:
        """An extractor of a model `export` made (raises if the bytes are not one)."""
        extractor = cls.__new__(cls)
        extractor._start(model, input_size, threads)
        return extractor

    def _start(self, model: bytes, input_size: int, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # the threads run slices of a batch instead (above)
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.input_size = input_size
        self.threads, self._pool = 1, None
        self.use_threads(threads)

    def use_threads(self, threads: int) -> None:
        """Slices of a batch run on `threads` threads from the next call on."""
        self.threads = max(1, threads)
        if self.threads > 1 and (self._pool is None or self._pool._max_workers < self.threads - 1):
            self._pool = ThreadPoolExecutor(self.threads - 1, "onnx")

    def _run(self, array: np.ndarray) -> np.ndarray:
        return self.session.run(None, {"crops": array})[0]  # ONNX Runtime lets go of the GIL meanwhile

    def __call__(self, crops: torch.Tensor) -> torch.Tensor:
        array = np.ascontiguousarray(crops.cpu().numpy())
        slices = np.array_split(array, min(self.threads, len(array))) if self._pool else [array]
        # the first slice on the calling thread, the others on the pool's
        others = [self._pool.submit(self._run, part) for part in slices[1:]]
        parts = [self._run(slices[0]), *(other.result() for other in others)]
        return torch.from_numpy(parts[0] if len(parts) == 1 else np.concatenate(parts))
