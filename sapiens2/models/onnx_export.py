"""Sapiens2 models as ONNX files: one input size, any batch size, outputs named as transformers names them,
the RoPE tables stored as constants."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

INPUT_NAME = "pixel_values"
BATCH = "batch"
OPSET = 20
# Above this many bytes of weights, they go to FILE.onnx.data beside the file (protobuf's limit is 2 GB).
EXTERNAL_DATA_BYTES = 1 << 30


class _OutputTensors(nn.Module):
    """The model's output fields `names` as a tuple of tensors, as exporters need them."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, pixel_values: Tensor) -> tuple[Tensor, ...]:
        outputs = self.model(pixel_values)
        return tuple(getattr(outputs, name) for name in self.names)


def output_names(outputs: object) -> tuple[str, ...]:
    """The tensor fields of a model's output dataclass that hold a prediction (not the loss, not None)."""
    fields = dataclasses.fields(outputs)
    return tuple(f.name for f in fields if f.name != "loss" and isinstance(getattr(outputs, f.name), Tensor))


@dataclasses.dataclass(frozen=True)
class ExportedOutputs:
    """What an exported file answers: the model's output class, its fields' names in the file's order and
    each one's shape after the batch dimension."""

    output_type: type
    shapes: dict[str, tuple[int, ...]]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.shapes)


def export_onnx(model: nn.Module, path: str | os.PathLike[str], size: tuple[int, int]) -> ExportedOutputs:
    """Write `model` (on the CPU, in float32) to `path` as an ONNX model taking `pixel_values` of shape
    (batch, 3, height, width) at `size`; weights above 1 GiB go to `path`.data beside it."""
    path = Path(path)
    parameter = next(model.parameters())
    if parameter.device.type != "cpu" or parameter.dtype != torch.float32:
        raise ValueError(f"export a float32 model on the CPU, not {parameter.dtype} on {parameter.device}")
    model = model.eval()
    # A batch of 2: tracing a batch of 1 would fix the batch size. The real forward also fills the RoPE
    # table cache, which the trace then reads as constants.
    example = torch.zeros(2, 3, *size)
    with torch.inference_mode():
        outputs = model(example)
    names = output_names(outputs)
    external = sum(t.numel() * t.element_size() for t in model.state_dict().values()) > EXTERNAL_DATA_BYTES
    with torch.no_grad(), _quiet():
        program = torch.onnx.export(
            _OutputTensors(model, names),
            (example,),
            dynamo=True,
            opset_version=OPSET,
            input_names=[INPUT_NAME],
            output_names=list(names),
            dynamic_shapes={INPUT_NAME: {0: torch.export.Dim.DYNAMIC}},
            optimize=True,
            verbose=False,
        )
        _name_batch_dimension(program.model)
        path.parent.mkdir(parents=True, exist_ok=True)
        program.save(str(path), external_data=external)
    return ExportedOutputs(type(outputs), {name: tuple(getattr(outputs, name).shape[1:]) for name in names})


def _name_batch_dimension(model: object) -> None:
    """Call the first dimension of every input and output `batch` (the tracer names it s0, s1, ...)."""
    for value in (*model.graph.inputs, *model.graph.outputs):
        dims = list(value.shape)
        symbol = dims[0]
        if not isinstance(symbol, int):
            value.shape = type(value.shape)([BATCH, *dims[1:]])


@contextlib.contextmanager
def _quiet():
    """The exporter's progress lines and warnings kept off the terminal (the logger's records stay)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        level = logging.getLogger("onnxscript").level
        logging.getLogger("onnxscript").setLevel(logging.ERROR)
        try:
            yield
        finally:
            logging.getLogger("onnxscript").setLevel(level)
