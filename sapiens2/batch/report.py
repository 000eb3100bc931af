"""What a batch run did: files written and kept, successes, failures with their sentences, and its summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sapiens2.errors import CheckpointError, ConfigError
from sapiens2.runtime.messages import describe_error, is_expected
from sapiens2.vision.detector import DetectorError

EXIT_OK, EXIT_NOTHING_SUCCEEDED = 0, 1  # argparse exits with 2 on usage errors
# Errors that concern the task's model or detector rather than one input: the task stops there.
TASK_ERRORS = (CheckpointError, DetectorError, ConfigError)


def reason(error: BaseException) -> str:
    """A sentence for a failure: the shared wording for known errors, else the error's type and text."""
    return describe_error(error) if is_expected(error) else f"{type(error).__name__}: {error}"


def count(number: int, word: str) -> str:
    """'1 photo', '2 photos'."""
    return f"{number} {word}{'s' * (number != 1)}"


@dataclass
class TaskStats:
    """One task's share of the run."""

    images: int = 0
    persons: int | None = None  # for tasks that detect persons
    seconds: float = 0.0  # detection + model + post-processing, summed over photos


@dataclass
class Report:
    """What happened: files written and kept, successes, failures and per-task and per-video figures."""

    written: list[Path] = field(default_factory=list)
    kept: int = 0
    succeeded: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    stats: dict[str, TaskStats] = field(default_factory=dict)
    videos: list[str] = field(default_factory=list)

    def fail(self, what: str, error: BaseException | str) -> None:
        self.failures.append((what, error if isinstance(error, str) else reason(error)))


def print_summary(report: Report, seconds: float, out: Path) -> None:
    """Files written, persons found, time per photo, frames per second and failures with their reasons."""
    kept = f", {report.kept} already there (kept)" if report.kept else ""
    print(f"\nDone in {seconds:.1f} s: {count(len(report.written), 'file')} written to {out}{kept}.")
    for name, stats in report.stats.items():
        if stats.images:
            persons = "" if stats.persons is None else f", {count(stats.persons, 'person')} found"
            time_per_image = f"{stats.seconds / stats.images:.2f} s per image"
            print(f"  {name}: {count(stats.images, 'image')}{persons}, {time_per_image}")
    for line in report.videos:
        print(f"  {line}")
    if report.failures:
        print(f"{count(len(report.failures), 'failure')}:")
        for what, why in report.failures:
            print(f"  {what}: {why}")
