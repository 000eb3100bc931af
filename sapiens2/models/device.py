"""Device and precision selection: CUDA when present, else the CPU; bf16 on CUDA and on CPUs that compute
bf16 natively, fp32 elsewhere; both overridable by argument or environment."""

from __future__ import annotations

import os

import torch

from sapiens2.errors import ConfigError

DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def resolve_device(name: str | torch.device | None = None) -> torch.device:
    """`name` (or a device, checked), else SAPIENS2_DEVICE, else cuda when available, else cpu."""
    if isinstance(name, torch.device):
        name = str(name)
    name = name or os.environ.get("SAPIENS2_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"Device {name!r} is not understood; use 'cpu', 'cuda' or 'cuda:N'.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"Device {name!r} was asked for, but PyTorch sees no CUDA GPU here.")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"Device type {device.type!r} is not supported; use 'cpu' or 'cuda'.")
    return device


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX), where oneDNN's bf16 GEMMs run about
    twice as fast as fp32 ones; elsewhere bf16 is emulated and slower than fp32."""
    if not torch.backends.mkldnn.is_available():
        return False
    capabilities = torch.cpu.get_capabilities()
    return bool(capabilities.get("avx512_bf16") or capabilities.get("amx_bf16"))


def choose_dtype(name: str | torch.dtype | None, device: torch.device) -> tuple[torch.dtype, str]:
    """The precision for `device` and why: `name` (or a dtype, as it is), else SAPIENS2_DTYPE, else bf16 on
    CUDA and on CPUs with native bf16, fp32 elsewhere."""
    if isinstance(name, torch.dtype):
        return name, "as asked"
    if name:
        return parse_dtype(name), "as asked"
    if os.environ.get("SAPIENS2_DTYPE"):
        return parse_dtype(os.environ["SAPIENS2_DTYPE"]), "as SAPIENS2_DTYPE asks"
    if device.type == "cuda":
        return torch.bfloat16, "the GPU's fast precision"
    if device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16, "this CPU computes bf16 natively: answers in about two thirds of the fp32 time"
    if device.type == "cpu":
        return torch.float32, "full precision, as this CPU has no native bf16"
    return torch.float32, "full precision"


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
