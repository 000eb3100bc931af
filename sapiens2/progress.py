"""Progress reports: `progress(fraction, text)` with a fraction in [0, 1], or None for a stage that has no
measurable fraction (the text alone says what is happening)."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[float | None, str], None]


def within(progress: Progress | None, start: float, end: float, prefix: str = "") -> Progress | None:
    """Reports of a part of the work mapped onto [start, end] of `progress`, their text after `prefix`."""
    if progress is None:
        return None

    def report(fraction: float | None, text: str) -> None:
        progress(start + (end - start) * (fraction or 0.0), f"{prefix}{text}")

    return report
