"""Fresh host memory faulted in ahead of the bytes written into it.

Memory a process has not touched yet costs a page fault per 4 KiB page on its first write; a read() into it
takes one for every page it fills. Asking the kernel to populate the range first (Linux 5.14+,
MADV_POPULATE_WRITE) does the same work without the faults, which more than halves the time of reading a
checkpoint into new tensors on a VM.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import torch

_PAGE = 4096
_MADV_POPULATE_WRITE = 23
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None


def populate(tensor: torch.Tensor) -> bool:
    """Fault in the whole pages under a CPU tensor's bytes; False where the kernel could not (the writes
    then take the faults)."""
    if _libc is None or tensor.device.type != "cpu":
        return False
    start = tensor.data_ptr()
    first = -(-start // _PAGE) * _PAGE
    last = (start + tensor.numel() * tensor.element_size()) // _PAGE * _PAGE
    if last <= first:
        return True
    return _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_POPULATE_WRITE) == 0
