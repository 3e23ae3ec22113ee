"""A feature extractor run by ONNX Runtime: on the CPU, eager PyTorch is slow on the
depthwise convolutions of EfficientNet (ORT runs Lite0 1.5-2x faster on 2 cores).

The PyTorch module is exported in memory (no file), with its input normalisation, for
one input size and any batch; calls take and give the same tensors as the module.
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


class OnnxExtractor:
    def __init__(self, module: nn.Module, input_size: int, threads: int):
        import onnxruntime as ort

        buffer = io.BytesIO()
        example = torch.zeros(1, 3, input_size, input_size, dtype=torch.uint8)
        with torch.no_grad():
            torch.onnx.export(module.cpu().eval().to(memory_format=torch.contiguous_format), (example,), buffer,
                              input_names=["crops"], output_names=["features"],
                              dynamic_axes={"crops": {0: "n"}, "features": {0: "n"}}, dynamo=False)  # fmt: skip
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Don't spin between calls: the decoding threads need the cores meanwhile.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])
        self.input_size = input_size

    def __call__(self, crops: torch.Tensor) -> torch.Tensor:
        array = np.ascontiguousarray(crops.cpu().numpy())
        return torch.from_numpy(self.session.run(None, {"crops": array})[0])
