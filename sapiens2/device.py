"""Device and precision selection: CUDA in bf16 when present, else CPU in fp32, overridable by env."""

from __future__ import annotations

import os

import torch

from .errors import ConfigError

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


def resolve_dtype(name: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """`name` (or a dtype, as it is), else SAPIENS2_DTYPE, else bf16 on CUDA and fp32 elsewhere."""
    if isinstance(name, torch.dtype):
        return name
    name = name or os.environ.get("SAPIENS2_DTYPE")
    if not name:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ConfigError(f"Precision {name!r} is not understood; use one of bf16, fp16, fp32.") from None


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype))
