"""Models whose forward runs in ONNX Runtime on the CPU, for `Runtime(backend="onnxruntime")`: the same call
and output class as the PyTorch model, everything around the forward unchanged."""

from __future__ import annotations

import dataclasses
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sapiens2.errors import ConfigError
from sapiens2.models import hub
from sapiens2.models.modeling import flip_back
from sapiens2.models.onnx_export import INPUT_NAME, ExportedOutputs, export_onnx

TORCH = "torch"
ONNXRUNTIME = "onnxruntime"
BACKENDS = (TORCH, ONNXRUNTIME)
INSTALL_HINT = "pip install onnx onnxruntime onnxscript"


def missing_onnxruntime() -> str | None:
    """Why the ONNX Runtime backend cannot run here (a package is missing), or None."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as error:
        return f"{error.name} is not installed ({INSTALL_HINT})"
    return None


class OnnxRuntimeModel(nn.Module):
    """A loaded float32 CPU model whose forward runs its ONNX export in ONNX Runtime. The export happens at
    the first forward of each input size (seconds for small models, a minute or more for 0.4b and up)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config = model.config
        self._sessions: dict[tuple[int, int], tuple[Any, ExportedOutputs]] = {}
        self._lock = threading.Lock()

    def session(self, size: tuple[int, int]) -> tuple[Any, ExportedOutputs]:
        """The ONNX Runtime session for inputs of `size` and what its outputs are, exported on first use."""
        with self._lock:
            if size not in self._sessions:
                import onnxruntime

                options = onnxruntime.SessionOptions()
                options.intra_op_num_threads = torch.get_num_threads()
                options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
                with tempfile.TemporaryDirectory(prefix="sapiens2-onnx-") as folder:
                    path = Path(folder) / "model.onnx"
                    exported = export_onnx(self.model, path, size)
                    session = onnxruntime.InferenceSession(
                        str(path), options, providers=["CPUExecutionProvider"]
                    )
                self._sessions[size] = (session, exported)
            return self._sessions[size]

    def forward(self, pixel_values: Tensor, flip_pairs: Any = None, **labels: Any) -> Any:
        """The model's outputs for `pixel_values` (B, 3, H, W); with `flip_pairs` (pose), the heatmaps of
        mirrored inputs mapped back, as the PyTorch model does."""
        if any(value is not None for value in labels.values()):
            raise ConfigError("the ONNX Runtime backend runs inference only; train with the torch backend")
        session, exported = self.session(tuple(pixel_values.shape[-2:]))
        inputs = pixel_values.detach().to("cpu", torch.float32).contiguous().numpy()
        answers = session.run(None, {INPUT_NAME: inputs})
        outputs: dict[str, Any] = {field.name: None for field in dataclasses.fields(exported.output_type)}
        outputs.update(zip(exported.names, (torch.from_numpy(answer) for answer in answers), strict=True))
        if flip_pairs is not None:
            outputs["heatmaps"] = flip_back(outputs["heatmaps"], flip_pairs)
        return exported.output_type(**outputs)


def load_onnxruntime(repo_id: str, **kwargs: Any) -> nn.Module:
    """`hub.from_pretrained` in float32 on the CPU, its forward run by ONNX Runtime."""
    missing = missing_onnxruntime()
    if missing is not None:
        raise ConfigError(f"the ONNX Runtime backend needs {missing}")
    kwargs.update(device="cpu", dtype=torch.float32)
    return OnnxRuntimeModel(hub.from_pretrained(repo_id, **kwargs))
