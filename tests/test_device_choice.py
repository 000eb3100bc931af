"""Where the models run by default (cuda, then mps, then cpu), the precision on an Apple GPU, and PyTorch's
CPU fallback for the operations MPS lacks.

No Mac is at hand: PyTorch's availability functions are replaced by stand-ins, and the fallback's warning
is raised by the test with the words PyTorch uses (aten/src/ATen/mps/MPSFallback.mm)."""

import warnings

import pytest
import torch

from sapiens2 import _mps_fallback
from sapiens2.errors import ConfigError
from sapiens2.models import device
from sapiens2.runtime.runtime import Runtime
from sapiens2.tasks.registry import get_task
from sapiens2.vision.images import load_image

FALLBACK_WARNING = (
    "The operator 'aten::upsample_bicubic2d.out' is not currently supported on the MPS backend and will fall "
    "back to run on the CPU. This may have performance implications."
)


@pytest.fixture
def machine(monkeypatch):
    """Say which GPUs PyTorch sees: machine(cuda=..., mps=...)."""
    monkeypatch.delenv("SAPIENS2_DEVICE", raising=False)

    def sees(*, cuda: bool, mps: bool, macos: tuple[int, int] = (15, 0)) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
        monkeypatch.setattr(
            torch.backends.mps, "is_macos_or_newer", lambda major, minor: macos >= (major, minor)
        )

    return sees


@pytest.mark.parametrize(
    ("cuda", "mps", "expected"),
    [(True, True, "cuda"), (True, False, "cuda"), (False, True, "mps"), (False, False, "cpu")],
)
def test_the_default_device_is_cuda_then_mps_then_cpu(machine, cuda, mps, expected):
    machine(cuda=cuda, mps=mps)
    assert device.resolve_device() == torch.device(expected)


def test_the_device_asked_for_wins_and_one_that_is_absent_is_refused_with_a_sentence(machine, monkeypatch):
    machine(cuda=False, mps=True)
    assert device.resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("SAPIENS2_DEVICE", "cpu")
    assert device.resolve_device() == torch.device("cpu")
    machine(cuda=True, mps=False)
    with pytest.raises(
        ConfigError, match=r"'mps' was asked for, but PyTorch sees no Apple GPU here \(MPS needs"
    ):
        device.resolve_device("mps")
    with pytest.raises(ConfigError, match="use 'cpu', 'cuda', 'cuda:N' or 'mps'"):
        device.resolve_device("apple")


def test_an_apple_gpu_runs_in_fp32_unless_asked_and_bf16_needs_macos_14(machine, monkeypatch):
    monkeypatch.delenv("SAPIENS2_DTYPE", raising=False)
    mps = torch.device("mps")
    machine(cuda=False, mps=True, macos=(13, 6))
    assert device.choose_dtype(None, mps) == (torch.float32, device.MPS_PRECISION_REASON)
    assert device.choose_dtype("fp16", mps) == (torch.float16, "as asked")
    with pytest.raises(
        ConfigError, match="bf16 on an Apple GPU .* needs macOS 14 or later; use fp16 or fp32"
    ):
        device.choose_dtype("bf16", mps)
    monkeypatch.setenv("SAPIENS2_DTYPE", "bf16")
    with pytest.raises(ConfigError, match="needs macOS 14"):
        device.choose_dtype(None, mps)
    machine(cuda=False, mps=True, macos=(14, 0))
    assert device.choose_dtype(None, mps)[0] == torch.bfloat16


def test_options_take_their_gpu_defaults_on_an_apple_gpu():
    flip = {option.name: option for option in get_task("pose").options}["flip_test"]
    assert flip.on_device("mps").default is True and flip.on_device("cpu").default is False


def test_the_fallback_is_set_on_macos_before_torch_is_imported():
    environ: dict[str, str] = {}
    assert _mps_fallback.enable(environ, modules={}, platform="darwin")
    assert environ == {"PYTORCH_ENABLE_MPS_FALLBACK": "1"}
    environ = {}
    assert not _mps_fallback.enable(environ, modules={"torch": object()}, platform="darwin")
    assert environ == {}, "too late once torch is imported: PyTorch has read the variable"
    environ = {"PYTORCH_ENABLE_MPS_FALLBACK": "0"}
    assert not _mps_fallback.enable(environ, modules={}, platform="darwin")
    assert environ == {"PYTORCH_ENABLE_MPS_FALLBACK": "0"}, "the environment's own choice is kept"
    environ = {}
    assert not _mps_fallback.enable(environ, modules={}, platform="linux") and environ == {}


def test_operations_run_on_the_cpu_for_mps_are_recorded_and_other_warnings_go_on():
    seen: set[str] = set()
    with pytest.warns(UserWarning, match="something else"):
        with device.recording_cpu_fallbacks(torch.device("mps"), seen):
            warnings.warn(FALLBACK_WARNING, UserWarning, stacklevel=1)
            warnings.warn("something else", UserWarning, stacklevel=1)
    assert seen == {"aten::upsample_bicubic2d.out"}
    with pytest.warns(UserWarning, match="MPS backend"):  # on other devices nothing is caught
        with device.recording_cpu_fallbacks(torch.device("cpu"), seen):
            warnings.warn(FALLBACK_WARNING.replace("bicubic", "linear"), UserWarning, stacklevel=1)
    assert seen == {"aten::upsample_bicubic2d.out"}


def test_each_result_notes_the_operations_run_on_the_cpu(tiny_mirror, monkeypatch):
    monkeypatch.setenv("SAPIENS2_CHECKPOINT_DIR", str(tiny_mirror))
    runtime = Runtime(device="cpu")
    runtime.cpu_fallbacks.add("aten::upsample_bicubic2d.out")  # what a forward on MPS would have recorded
    result = runtime.run("segment", load_image("assets/astronaut.png"))
    assert device.cpu_fallback_note("aten::upsample_bicubic2d.out") in result.notes
