"""A feature extractor run by ONNX Runtime: on the CPU, eager PyTorch is slow on the
depthwise convolutions of EfficientNet (ORT runs Lite0 1.5-2x faster on 2 cores).

The PyTorch module is exported in memory, with its input normalisation, for one input
size and any batch; calls take and give the same tensors as the module. The exported
bytes can be kept and loaded again (`export`, `OnnxExtractor.from_bytes`): the caller
decides where (data_catalog/weights.py keeps them in the user's cache, which saves a
process that extracts importing timm and exporting, about 2.5 s).
"""

from __future__ import annotations

import io

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
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Don't spin between calls: the decoding threads need the cores meanwhile.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.input_size = input_size

    def __call__(self, crops: torch.Tensor) -> torch.Tensor:
        array = np.ascontiguousarray(crops.cpu().numpy())
        return torch.from_numpy(self.session.run(None, {"crops": array})[0])
