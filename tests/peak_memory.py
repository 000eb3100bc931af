"""A meter of this process's peak resident memory during a block, used by the memory budgets of the
reliability tests (the server runs in the test process)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil

MIB = 2**20


class PeakMemory:
    """This process's peak resident memory (the server runs in it) during a block, and the block's seconds.

    On Linux the kernel's own high-water mark (VmHWM), reset when a block starts (/proc/self/clear_refs):
    exact, where sampling can miss a short spike, and free, where sampling every 10 ms took the server's CPU.
    A block that starts inside another first hands the mark so far to the blocks still open, so nested
    blocks each keep their own peak. Elsewhere it samples every 10 ms.
    """

    CLEAR_REFS, STATUS = Path("/proc/self/clear_refs"), Path("/proc/self/status")
    _open: list[PeakMemory] = []  # the kernel-mark blocks running now, outermost first
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.base = self.peak = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def growth(self) -> int:
        return self.peak - self.base

    def _high_water_mark(self) -> int:
        line = next(line for line in self.STATUS.read_text().splitlines() if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakMemory:
        with self._lock:
            try:
                mark = self._high_water_mark()
                self.CLEAR_REFS.write_text("5")  # the high-water mark := the resident size now
            except OSError:
                self._thread = threading.Thread(target=self._sample, daemon=True)
            else:
                for outer in self._open:
                    outer.peak = max(outer.peak, mark)
                self._open.append(self)
            self.base = self.peak = self.process.memory_info().rss
        if self._thread is not None:
            self._thread.start()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc_info) -> None:
        self.seconds = time.perf_counter() - self._start
        if self._thread is None:
            with self._lock:
                self._open.remove(self)
                self.peak = max(self.peak, self._high_water_mark(), self.process.memory_info().rss)
            return
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def report(label: str, memory: PeakMemory) -> None:
    print(f"\n[figure] {label}: peak +{memory.growth / MIB:.0f} MiB, answered in {memory.seconds:.2f} s")
