"""Large freed memory kept for the next photo instead of handed back to the kernel, or, by default,
handed back after each answer.

glibc serves every allocation over 32 MB with a fresh mapping and unmaps it when freed, so each 12 MP map
(144 MB for three float channels) is new memory, and its first write takes a page fault per 4 KiB page:
most of the time of a bilinear resize to 12 MP goes to those faults, not to the arithmetic. Serving large
blocks from the heap instead, and keeping up to `RETAINED_BYTES` of freed memory at its top, lets the
next request reuse pages that are already faulted in.

It is off unless SAPIENS2_WARM_HEAP=1: what it saves is time (a 12 MP depth result 368 -> 282 ms), what it
costs is memory, and on a shared server memory is what runs out first. Measured through `python app.py`
with a 12 MP photo on /all three times: peaks of 2907, 3190 and 3327 MiB with it (the heap's holes add up),
2522 MiB every time without. The app and the command line ask for it; importing the package changes
nothing.

Without it, glibc still keeps much of what a request freed: blocks under its (growing) mapping threshold
come from per-thread heaps, and a heap gives back only the free memory at its top, so the freed holes of
one large request after another add up (a server's memory grew from 2.4 to 4.7 GB and stayed there).
`release_freed_memory`, called by the server after each answer, hands every free page of every heap back
(glibc's malloc_trim); it does nothing when SAPIENS2_WARM_HEAP=1 keeps them on purpose, or off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys
from typing import Any

from sapiens2.settings import Settings, current

log = logging.getLogger(__name__)

RETAINED_BYTES = 1 << 30
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4


def keep_freed_memory(settings: Settings | None = None, retained: int = RETAINED_BYTES) -> bool:
    """With SAPIENS2_WARM_HEAP=1, ask glibc to serve large blocks from its heap and keep up to `retained`
    bytes of freed memory mapped; False (and nothing changed) otherwise, or off glibc."""
    if not (settings or current()).warm_heap or not sys.platform.startswith("linux"):
        return False
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    settings = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, retained), (_M_TOP_PAD, retained // 4))
    done = all(mallopt(option, value) == 1 for option, value in settings)
    if not done:
        log.info("glibc refused the large-block heap settings; large maps stay freshly mapped")
    return done


def release_freed_memory(settings: Settings | None = None) -> bool:
    """Hand the free pages of glibc's heaps back to the system (malloc_trim), unless SAPIENS2_WARM_HEAP=1
    keeps them for the next photo; False when nothing was done (that setting, or another C library)."""
    if (settings or current()).warm_heap:
        return False
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _glibc(name: str) -> Any:
    """glibc's function `name`, typed for an int argument and result; None on another C library."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt or malloc_trim
        return None
    if name == "mallopt":
        function.argtypes = [ctypes.c_int, ctypes.c_int]
    else:
        function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function
