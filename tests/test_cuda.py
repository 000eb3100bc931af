"""The GPU path, on a machine with CUDA (skipped elsewhere): models equal the reference on the GPU, every task
runs there in bf16 with its GPU defaults, and torch.compile agrees with eager. `bench/gpu_session.sh` runs
this file with the GPU benchmarks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from tiny_models import CentreBox, tiny_config, write_transformers_checkpoint

from sapiens2 import from_pretrained
from sapiens2.runtime.runtime import Runtime
from sapiens2.tasks import export_result
from sapiens2.tasks.registry import ALL_TASKS
from sapiens2.vision.images import load_image

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CASES = {
    "pose": (tiny_config("pose", "1b"), (2, 3, 64, 48)),
    "seg": (tiny_config("seg"), (2, 3, 64, 48)),
    "normal": (tiny_config("normal"), (2, 3, 64, 48)),
    "pointmap": (tiny_config("pointmap", image_size=(160, 96)), (2, 3, 160, 96)),
    "matting": (tiny_config("matting", "1b"), (2, 3, 64, 48)),
}


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours.float() - reference.float()).norm() / reference.float().norm())


@pytest.mark.parametrize("kind", list(CASES))
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_models_match_the_reference_on_the_gpu(kind, dtype, tolerance, tmp_path):
    config, shape = CASES[kind]
    directory = write_transformers_checkpoint(tmp_path, config)
    architecture = getattr(transformers, config["architectures"][0])
    reference = architecture.from_pretrained(directory, dtype=dtype).to("cuda").eval()
    ours = from_pretrained(directory, device="cuda", dtype=dtype)
    assert next(ours.parameters()).device.type == "cuda"
    pixels = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to("cuda", dtype)
    with torch.inference_mode():
        expected, actual = reference(pixels), ours(pixels)
    for name, value in vars(actual).items():
        if isinstance(value, torch.Tensor):
            assert relative_error(value, getattr(expected, name)) <= tolerance, name


@pytest.fixture(scope="module")
def runtime(tiny_mirror):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAPIENS2_CHECKPOINT_DIR", str(tiny_mirror))
        # The GPU image has no ultralytics; the detector is tested on the CPU.
        yield Runtime(device="cuda", dtype="bf16", detector=CentreBox())


@pytest.mark.parametrize("task", list(ALL_TASKS))
def test_every_task_runs_on_the_gpu_in_bf16(runtime, task, tmp_path):
    result = runtime.run(task, load_image("assets/grace_hopper.jpg"))
    assert (result.device, result.dtype) == ("cuda", "bf16")
    for title, picture in result.pictures:
        assert picture.dtype == np.uint8 and picture.ndim == 3, title
    assert export_result(result, tmp_path, "photo")
    if task == "pose":
        defaults = {option.name: option.default for option in runtime.options("pose")}
        assert defaults["flip_test"] is True  # the GPU default: flip test on


def test_compiled_model_agrees_with_eager_on_the_gpu(tmp_path):
    config, shape = CASES["pose"]
    directory = write_transformers_checkpoint(tmp_path, config)
    ours = from_pretrained(directory, device="cuda", dtype=torch.bfloat16)
    pixels = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to("cuda", torch.bfloat16)
    with torch.inference_mode():
        eager = ours(pixels).heatmaps
        ours.compile()
        compiled = ours(pixels).heatmaps
    assert relative_error(compiled, eager) <= 3e-2
