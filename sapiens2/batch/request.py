"""One batch command as plain settings: what the command line parsed, for the local run and for Ray."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapiens2.batch.plan import Plan
from sapiens2.tasks import Task


@dataclass(frozen=True)
class ClusterSettings:
    """--ray: the cluster's address ("" for $RAY_ADDRESS or a local one) and the model actors' sizing."""

    address: str = ""
    actors: tuple[int, int] | None = None  # (MIN, MAX) per model stage; None: sized from the cluster
    actor_resources: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchRequest:
    """The tasks to run on the inputs, where to write, what to write, and how to run the models."""

    tasks: tuple[Task, ...]
    inputs: tuple[str, ...]
    out: Path | str  # a local folder; with a cluster, also a URI
    plan: Plan
    size: str | None = None
    model: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)  # registry options by name; None: default
    batch_size: int = 8
    max_frames: int | None = None
    stride: int = 1
    device: str | None = None
    dtype: str | None = None
    detector: str | None = None
    checkpoint_dir: Path | None = None
    compile: bool | None = None
    cluster: ClusterSettings | None = None

    def task_options(self, task: Task, videos: bool = False) -> dict[str, Any]:
        """The options given for `task` (the others take their defaults); with `videos`, its video options
        too."""
        names = {option.name for option in (task.all_options if videos else task.options)}
        return {name: value for name, value in self.options.items() if name in names and value is not None}

    def repo_id(self, task: Task) -> str:
        """The checkpoint `task` runs: the one given with --model, else the registry's at the chosen size."""
        return self.model or task.repo_id(task.size_or_default(self.size))
