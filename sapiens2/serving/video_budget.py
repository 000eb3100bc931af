"""How many of a clip's frames fit a request's device time, at the speed this server measured.

A video holds the device batch by batch and stops once its request's device time is spent
(`sapiens2.serving.device_time`); on a CPU that is after a few dozen frames of a 0.4b model, not the
hundreds the frame limit allows. `FrameSpeeds` keeps the device seconds per frame each model took here in
its last clip, so the Video tab can say, before a clip runs, how many of its frames will be processed, and
point to the command line (no device budget) for longer clips.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager


class FrameSpeeds:
    """Device seconds per frame of each model (by repo id or path), as its last clip measured them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}

    def record(self, model: str, seconds: float, frames: int) -> None:
        """`frames` took `seconds` on the device with `model` (nothing is learnt from no frame)."""
        if frames > 0 and seconds > 0:
            with self._lock:
                self._seconds[model] = seconds / frames

    def seconds_per_frame(self, model: str) -> float | None:
        """The last measured device seconds per frame of `model`; None before its first clip here."""
        with self._lock:
            return self._seconds.get(model)


class HoldTimer:
    """Wraps a hold of the device (a context manager factory) and sums the seconds spent inside it."""

    def __init__(self, hold: Callable[[], AbstractContextManager]):
        self._hold = hold
        self.seconds = 0.0

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._hold():
            start = time.perf_counter()
            try:
                yield
            finally:
                self.seconds += time.perf_counter() - start


def frames_that_fit(budget_seconds: float, seconds_per_frame: float, most: int) -> int:
    """Frames that `budget_seconds` of device time process at `seconds_per_frame`, at most `most`."""
    return min(most, math.floor(budget_seconds / seconds_per_frame))


def video_header(on_cpu: bool, most: int, budget_seconds: float) -> str:
    """The Video tab's header: what it runs of a clip, never promising frames the budget cannot hold."""
    if not on_cpu:
        return f"### Video\nA short clip through one task; the first {most} frames are processed."
    return (
        f"### Video\nA short clip through one task: on this CPU server a request may use the model for "
        f"{budget_seconds:g} s, so only a clip's first frames are processed (at most {most}; the note below "
        "says how many)."
    )


def budget_note(
    title: str, model: str, speeds: FrameSpeeds, budget_seconds: float, most: int, command: str
) -> str:
    """What a CPU visitor reads before a clip runs: the frames that fit this request's device time at
    `model`'s measured speed (or that it is not measured yet), and the command line for longer clips."""
    measured = speeds.seconds_per_frame(model)
    longer = f"For a longer clip, run the command line on your own machine (no such limit): `{command}`."
    if measured is None:
        return (
            f"**{title} with `{model}` has not run on a clip here yet**: on a CPU a frame takes from a "
            f"second to tens of seconds, so this server's {budget_seconds:g} s per request hold a few to a "
            f"few dozen frames, not {most}. Once a clip has run, this note gives the number measured here. "
            + longer
        )
    fit = frames_that_fit(budget_seconds, measured, most)
    if fit >= most:
        return f"**A clip's first {most} frames fit**: {title} with `{model}` took {measured:.2g} s a frame."
    return (
        f"**About {fit} frames of a clip fit** in this server's {budget_seconds:g} s per request: {title} "
        f"with `{model}` took {measured:.2g} s of model time per frame here (the model's first loading takes "
        "some more). " + longer
    )
