"""The GEMM path of CPU inference, chosen by timing the candidates on this machine: once per model shape and
precision in a process, and remembered in a file per CPU model when one is given (`remember_in`)."""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch

from sapiens2.settings import current

ATEN = "aten"  # PyTorch's default kernels (MKL's GEMM for float32)
ONEDNN = "onednn"  # oneDNN's linear with the activation, product or sum fused into it
FILE_NAME = "kernel-choices.json"

_active: contextvars.ContextVar[str | None] = contextvars.ContextVar("sapiens2_gemm_path", default=None)
_choices: dict[str, str] = {}
_lock = threading.Lock()
_file: Path | None = None


def active() -> str | None:
    """The path chosen for the forward running in this thread; None outside a measured forward."""
    return _active.get()


@contextlib.contextmanager
def using(path: str | None) -> Iterator[None]:
    """Run the GEMMs of the block of code on `path` (None: the default)."""
    token = _active.set(path)
    try:
        yield
    finally:
        _active.reset(token)


def cpu_name() -> str:
    """The CPU's model name, as the kernel reports it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> str:
    """What the timings depend on besides the model: the CPU, the instructions PyTorch and oneDNN may use,
    torch's version and its thread count."""
    # oneDNN reads its instruction limit (ONEDNN_MAX_CPU_ISA) itself; it changes which kernels it has.
    onednn_limit = current().onednn_max_cpu_isa
    capability = torch.backends.cpu.get_cpu_capability()
    threads = torch.get_num_threads()
    return f"{cpu_name()} | {capability} {onednn_limit} | torch {torch.__version__} | {threads} threads"


def remember_in(path: str | os.PathLike[str] | None) -> None:
    """Keep the choices in the JSON file `path` too (None: in this process only); a file that cannot be
    read or written is ignored, so a read-only disk only costs the measurement again. Every process on the
    machine reading one file runs the same kernels, so their results agree to the bit: where this process
    and the file disagree the file wins, and what only this process knows is added to the file."""
    global _file
    with _lock:
        _file = None if path is None else Path(path)
        saved = _read(_file)
        _choices.update(saved)
        if _file is not None and not _choices.keys() <= saved.keys():
            _write(_file, dict(_choices))


def choices() -> dict[str, str]:
    """The choices known to this process: path by machine and work."""
    with _lock:
        return dict(_choices)


def forget() -> None:
    """Forget the choices of this process (the file keeps its own)."""
    with _lock:
        _choices.clear()


def choose(key: str, candidates: Mapping[str, Callable[[], object]], clock=time.process_time) -> str:
    """The fastest of `candidates` (path name: a run of the work on it) for `key` on this machine: measured
    on the first call, remembered after."""
    full_key = f"{machine_key()} | {key}"
    with _lock:
        if full_key in _choices:
            return _choices[full_key]
    chosen = fastest(candidates, clock=clock)
    with _lock:
        if _file is not None:
            # Processes that measured the same work at once (Ray's model actors starting together) all take
            # the first one's choice, so their results agree to the bit.
            with _locked(_file):
                saved = _read(_file)
                if full_key in saved:
                    chosen = saved[full_key]
                else:
                    _write(_file, {**saved, full_key: chosen})
        _choices[full_key] = chosen
    return chosen


def fastest(candidates: Mapping[str, Callable[[], object]], repeats: int = 3, clock=time.process_time) -> str:
    """The candidate whose fastest of `repeats` runs is fastest, after one untimed run of each (the first
    call of a kernel sets it up); runs alternate, so a busy moment of the machine hits them alike. The clock
    is the process's CPU time: on a shared machine, wall time also counts the other processes' turns."""
    for name, run in candidates.items():
        with using(name):
            run()
    best = dict.fromkeys(candidates, float("inf"))
    for _ in range(repeats):
        for name, run in candidates.items():
            with using(name):
                start = clock()
                run()
                best[name] = min(best[name], clock() - start)
    return min(best, key=best.__getitem__)


def _read(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(key): value for key, value in data.items() if value in (ATEN, ONEDNN)}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """The file's lock between processes (a lock file beside it) for a read then a write; where none can
    be taken (no such folder, a read-only disk, no fcntl), the block runs without it."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield
        return
    try:
        with contextlib.suppress(OSError):  # a file system without locks (some network ones)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # closing releases the lock


def _write(path: Path, choices: dict[str, str]) -> None:
    """Replace the file atomically, so a reader never sees half of it; failures are ignored."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(choices, out, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
