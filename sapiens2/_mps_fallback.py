"""PyTorch's CPU fallback for the operations its Apple GPU (MPS) backend has no kernel for.

PyTorch reads PYTORCH_ENABLE_MPS_FALLBACK once, when it is imported; without it such an operation stops the
run with NotImplementedError. The package turns it on here, before any of its modules imports torch, unless
the environment already sets it (0 keeps it off). This module must not import torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

FALLBACK_ENV = "PYTORCH_ENABLE_MPS_FALLBACK"


def enable(
    environ: MutableMapping[str, str] = os.environ,
    modules: Mapping[str, object] = sys.modules,
    platform: str = sys.platform,
) -> bool:
    """Set the fallback on macOS while PyTorch is not imported yet; whether this process's PyTorch has it
    (False when torch was imported before the variable was set, or when it is set to 0)."""
    if platform == "darwin" and "torch" not in modules:
        environ.setdefault(FALLBACK_ENV, "1")
    value = environ.get(FALLBACK_ENV, "").strip()
    return value.isdigit() and int(value) != 0 and platform == "darwin"


ACTIVE = enable()
