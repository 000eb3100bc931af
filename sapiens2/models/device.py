"""Device and precision selection: CUDA when present, else an Apple GPU (MPS), else the CPU; bf16 on CUDA
and on CPUs that compute bf16 natively, fp32 elsewhere; both overridable by argument or by SAPIENS2_DEVICE and
SAPIENS2_DTYPE."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from sapiens2 import _mps_fallback
from sapiens2.errors import ConfigError
from sapiens2.settings import current

DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def default_device_name() -> str:
    """cuda when PyTorch sees a CUDA GPU, else mps when it sees an Apple GPU, else cpu."""
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def resolve_device(name: str | torch.device | None = None) -> torch.device:
    """`name` (or a device, checked), else SAPIENS2_DEVICE, else cuda, mps or cpu (default_device_name)."""
    if isinstance(name, torch.device):
        name = str(name)
    name = name or current().device or default_device_name()
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(
            f"Device {name!r} is not understood; use 'cpu', 'cuda', 'cuda:N' or 'mps'."
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"Device {name!r} was asked for, but PyTorch sees no CUDA GPU here.")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"Device {name!r} was asked for, but PyTorch sees no Apple GPU here (MPS needs a Mac with Apple "
            "silicon or an AMD GPU, macOS 12.3 or later, and a PyTorch built with MPS)."
        )
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"Device type {device.type!r} is not supported; use 'cpu', 'cuda' or 'mps'.")
    return device


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX), where oneDNN's bf16 GEMMs run about
    twice as fast as fp32 ones; elsewhere bf16 is emulated and slower than fp32."""
    if not torch.backends.mkldnn.is_available():
        return False
    capabilities = torch.cpu.get_capabilities()
    return bool(capabilities.get("avx512_bf16") or capabilities.get("amx_bf16"))


def choose_dtype(
    name: str | torch.dtype | None, device: torch.device, setting: str | None = None
) -> tuple[torch.dtype, str]:
    """The precision for `device` and why: `name` (or a dtype, as it is), else `setting` (SAPIENS2_DTYPE),
    else bf16 on CUDA and on CPUs with native bf16, fp32 elsewhere (the Apple GPU included:
    MPS_PRECISION_REASON)."""
    if isinstance(name, torch.dtype):
        return _checked_on(device, name), "as asked"
    if name:
        return _checked_on(device, parse_dtype(name)), "as asked"
    setting = setting or current().dtype
    if setting:
        return _checked_on(device, parse_dtype(setting)), "as SAPIENS2_DTYPE asks"
    if device.type == "mps":
        return torch.float32, MPS_PRECISION_REASON
    if device.type == "cuda":
        return torch.bfloat16, "the GPU's fast precision"
    if device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16, "this CPU computes bf16 natively: answers in about two thirds of the fp32 time"
    if device.type == "cpu":
        return torch.float32, "full precision, as this CPU has no native bf16"
    return torch.float32, "full precision"


# Not measured on a Mac (none was at hand): fp32 is the precision every Apple GPU and every MPS operation
# computes; fp16 halves the memory traffic but its range (65504 at most) was not checked against the large
# models' activations; bf16 on MPS needs macOS 14.
MPS_PRECISION_REASON = "full precision, which every Apple GPU computes (`--dtype fp16` may be faster)"


def _checked_on(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """`dtype`, when `device` computes it: bf16 on an Apple GPU needs macOS 14."""
    if device.type == "mps" and dtype == torch.bfloat16 and not torch.backends.mps.is_macos_or_newer(14, 0):
        raise ConfigError("bf16 on an Apple GPU (MPS) needs macOS 14 or later; use fp16 or fp32 here.")
    return dtype


def parse_dtype(name: str) -> torch.dtype:
    """The precision a name such as "bf16" or "float32" means."""
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ConfigError(f"Precision {name!r} is not understood; use one of bf16, fp16, fp32.") from None


def checkpoint_dtype(config_dtype: str | None, stored: torch.dtype | None) -> torch.dtype:
    """A checkpoint's own precision, as transformers' `dtype="auto"` reads it: config.json's `dtype` (or
    `torch_dtype`), else the dtype of its first floating-point tensor; float32 when neither is bf16, fp16 or
    fp32."""
    if config_dtype is not None:
        try:
            return parse_dtype(config_dtype)
        except ConfigError:
            raise ConfigError(
                f"config.json dtype {config_dtype!r} is not a precision this package runs; pass dtype= "
                "(bf16, fp16 or fp32)"
            ) from None
    return stored if stored in (torch.bfloat16, torch.float16, torch.float32) else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype))


# ---- the device's housekeeping ----------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on a GPU, so that the time it took is counted where it was asked for."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def release_cached_memory(device: torch.device) -> None:
    """Hand the GPU memory PyTorch keeps for reuse back, after a model is dropped."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()


# PyTorch's warning, once per operation and process, when an operation runs on the CPU for MPS.
_CPU_FALLBACK = re.compile(r"operator '([^']+)' is not currently supported on the MPS backend and will fall")


MPS_WITHOUT_FALLBACK = (
    f"PyTorch was imported before sapiens2 could set {_mps_fallback.FALLBACK_ENV}=1 (or it is 0): an "
    "operation the Apple GPU has no kernel for will stop the run. Set it before starting Python."
)


def cpu_fallback_note(operation: str) -> str:
    """What a result says when PyTorch ran `operation` on the CPU for the Apple GPU."""
    return (
        f"On the Apple GPU, PyTorch runs {operation} on the CPU, as MPS has no kernel for it: same results, "
        "that step slower."
    )


def mps_fallback_active() -> bool:
    """Whether this process's PyTorch runs the operations MPS lacks on the CPU (sapiens2._mps_fallback)."""
    return _mps_fallback.ACTIVE


@contextmanager
def recording_cpu_fallbacks(device: torch.device, seen: set[str]) -> Iterator[None]:
    """Add to `seen` the operations PyTorch runs on the CPU because MPS has no kernel for them, while the
    block runs on `device`; every other warning goes on as it came.

    Python's warning filters are process-wide, so another thread's warnings raised meanwhile are caught and
    passed on too: on MPS the models run one batch at a time (the app's DeviceSlot).
    """
    if device.type != "mps":
        yield
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for warning in caught:
        found = _CPU_FALLBACK.search(str(warning.message))
        if found:
            seen.add(found.group(1))
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
