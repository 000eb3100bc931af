"""The run's record: one JSON line per logged step or validation in `metrics.jsonl`, and `curves.png`
(loss terms and learning rate against steps, one panel per validation metric)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS_NAME = "metrics.jsonl"
CURVES_NAME = "curves.png"
DEFAULT_LOG_EVERY = 10
MIN_LOGGED_POINTS = 20


def log_interval(requested: int | None, total_steps: int) -> int:
    """Steps between logged rows: the one asked for, else 10, or fewer so that a shorter run still logs
    about 20 points."""
    if requested is not None:
        return requested
    return max(1, min(DEFAULT_LOG_EVERY, total_steps // MIN_LOGGED_POINTS))


class RunRecord:
    """Appends rows to `out/metrics.jsonl`; on resume, rows after the resumed step are dropped first."""

    def __init__(self, out: Path, resumed_step: int | None = None) -> None:
        self.path = out / METRICS_NAME
        if resumed_step is not None and self.path.exists():
            kept = [row for row in self.rows() if row.get("step", 0) <= resumed_step]
            self.path.write_text("".join(json.dumps(row) + "\n" for row in kept))
        elif resumed_step is None:
            self.path.write_text("")

    def add(self, row: dict[str, Any]) -> None:
        with self.path.open("a") as file:
            file.write(json.dumps(row) + "\n")

    def rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def plot(self, path: Path | None = None) -> Path:
        """Draw curves.png from the rows so far."""
        from matplotlib import pyplot

        figure = curves_figure(self.rows())
        path = path or self.path.with_name(CURVES_NAME)
        figure.savefig(path, dpi=90)
        pyplot.close(figure)
        return path


def curves_figure(rows: list[dict[str, Any]]):
    """The loss terms and learning rate against steps, and one panel per validation metric; every logged
    point is marked, so that a run of a few steps still shows its points."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import MaxNLocator

    train = [row for row in rows if row.get("kind") == "train"]
    validation = [row for row in rows if row.get("kind") == "val"]
    val_names = [
        name for name in (validation[-1] if validation else {}) if name not in ("kind", "step", "epoch")
    ]
    val_names = [name for name in val_names if "/" not in name][:4]  # per-class IoUs stay in the file
    figure, axes = pyplot.subplots(
        1, 2 + len(val_names), figsize=(5 * (2 + len(val_names)), 3.6), squeeze=False
    )
    loss_axis, lr_axis = axes[0][0], axes[0][1]
    steps = [row["step"] for row in train]
    for name in [key for key in (train[-1] if train else {}) if key == "loss" or key.startswith("loss/")]:
        loss_axis.plot(steps, [row.get(name) for row in train], marker=".", label=name)
    loss_axis.set(title="training loss", xlabel="step", yscale="log" if train else "linear")
    if train:
        loss_axis.legend(fontsize=7)
    lr_axis.plot(steps, [row.get("lr") for row in train], marker=".")
    lr_axis.set(title="peak learning rate", xlabel="step")
    for axis, name in zip(axes[0][2:], val_names, strict=True):
        points = [(row["step"], row[name]) for row in validation if isinstance(row.get(name), (int, float))]
        axis.plot([step for step, _ in points], [value for _, value in points], marker="o")
        axis.set(title=f"validation {name}", xlabel="step")
        if len(points) == 1:  # one point: its value written beside it, on an axis centred on it
            (step, value), = points
            margin = abs(value) * 0.5 or 1.0
            axis.set_ylim(value - margin, value + margin)
            axis.annotate(f"{value:.4g}", (step, value), textcoords="offset points", xytext=(6, 6))
    # Every panel spans the run's steps on whole-step ticks, so a panel of one point is placed in the run
    # rather than centred on an axis of fractional steps.
    last = max((row["step"] for row in rows if isinstance(row.get("step"), (int, float))), default=1)
    for axis in axes[0]:
        axis.set_xlim(0, max(last, 1) * 1.05)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.tight_layout()
    return figure
