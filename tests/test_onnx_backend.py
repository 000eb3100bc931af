"""The ONNX Runtime backend: the runtime's forwards run the exported model (same outputs as PyTorch's float32
forward within 1e-4, pose's flip test included), the tasks around them unchanged; the flags that choose it."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from sapiens2.errors import ConfigError
from sapiens2.runtime import Runtime
from sapiens2.runtime.arguments import add_runtime_arguments, runtime_from_arguments

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

SIZE = (256, 192)  # the small mirror's preprocessor size


@pytest.fixture(scope="module")
def runtimes(small_mirror):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAPIENS2_CHECKPOINT_DIR", str(small_mirror))
        yield Runtime(device="cpu", backend="onnxruntime"), Runtime(device="cpu", dtype="fp32")


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == torch.float32
    scale = float(expected.abs().max())
    assert float((actual - expected).abs().max()) <= 1e-4 * max(scale, 1e-12)


@pytest.mark.parametrize("repo_id", ["facebook/sapiens2-pose-0.4b", "facebook/sapiens2-pointmap-0.4b"])
def test_the_forward_matches_pytorch_at_batch_1_and_3(runtimes, repo_id):
    onnx_runtime, torch_runtime = runtimes
    onnx_model, torch_model = onnx_runtime.model(repo_id), torch_runtime.model(repo_id)
    assert onnx_model.config.architecture == torch_model.config.architecture  # what pipelines read
    for batch in (1, 3):
        pixels = torch.randn(batch, 3, *SIZE, generator=torch.Generator().manual_seed(batch))
        ours, reference = onnx_runtime.forward(onnx_model, pixels), torch_runtime.forward(torch_model, pixels)
        assert type(ours) is type(reference)
        for name, value in vars(reference).items():
            if isinstance(value, torch.Tensor):
                _close(getattr(ours, name), value)
            else:
                assert getattr(ours, name) is value is None
    if "pose" in repo_id:  # the flip test's mirrored crops, mapped back
        pairs = torch_model.config.flip_pairs
        flipped = onnx_runtime.forward(onnx_model, pixels, flip_pairs=pairs).heatmaps
        _close(flipped, torch_runtime.forward(torch_model, pixels, flip_pairs=pairs).heatmaps)


def test_a_task_runs_through_onnxruntime_as_through_pytorch(runtimes):
    onnx_runtime, torch_runtime = runtimes
    photo = np.random.default_rng(0).integers(0, 256, (300, 200, 3), dtype=np.uint8)
    ours = onnx_runtime.run("segment", photo)
    reference = torch_runtime.run("segment", photo)
    assert ours.dtype == "fp32"
    # The label map, or a typed prediction holding it.
    labels, expected = (np.asarray(getattr(r.prediction, "labels", r.prediction)) for r in (ours, reference))
    assert labels.shape == expected.shape
    assert (labels == expected).mean() > 0.999  # a random model's near-ties may fall either way


def test_the_onnx_model_runs_inference_only(runtimes):
    onnx_runtime, _ = runtimes
    model = onnx_runtime.model("facebook/sapiens2-pose-0.4b")
    pixels = torch.zeros(1, 3, *SIZE)
    with pytest.raises(ConfigError, match="inference only"):
        model(pixels, labels=torch.zeros(1, 308, 64, 48))


def _parsed(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_runtime_arguments(parser)
    return parser.parse_args(list(flags))


def test_the_backend_flag_of_the_app_and_the_command_line():
    runtime = runtime_from_arguments(_parsed("--device", "cpu", "--backend", "onnxruntime"))
    assert runtime.backend == "onnxruntime" and runtime.dtype == torch.float32
    assert runtime_from_arguments(_parsed("--device", "cpu")).backend == "torch"
    with pytest.raises(ConfigError, match="fp32"):
        runtime_from_arguments(_parsed("--device", "cpu", "--backend", "onnxruntime", "--dtype", "bf16"))
    with pytest.raises(SystemExit):
        _parsed("--backend", "tensorflow")
