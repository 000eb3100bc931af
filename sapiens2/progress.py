"""Progress reports: `progress(fraction, text)` with a fraction in [0, 1], or None for a stage that has no
measurable fraction (the text alone says what is happening)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Progress = Callable[[float | None, str], None]


def within(progress: Progress | None, start: float, end: float, prefix: str = "") -> Progress | None:
    """Reports of a part of the work mapped onto [start, end] of `progress`, their text after `prefix`;
    it pickles whenever `progress` does (so it can cross to a device worker)."""
    if progress is None:
        return None
    return Within(progress, start, end, prefix)


@dataclass(frozen=True)
class Within:
    """`within`'s reporter: a part of the work reported as the span [start, end] of `progress`."""

    progress: Progress
    start: float
    end: float
    prefix: str = ""

    def __call__(self, fraction: float | None, text: str) -> None:
        self.progress(self.start + (self.end - self.start) * (fraction or 0.0), f"{self.prefix}{text}")
