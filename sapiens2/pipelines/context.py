"""What a pipeline is given: the runtime's services, the task, its checkpoint, options, timings, progress."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ..detector import Detections
from ..images import LoadedImage
from ..kinds import ModelKind
from ..processing import ProcessorSettings
from ..results import Timings

if TYPE_CHECKING:
    from ..tasks import Task

Progress = Callable[[float, str], None]


class ModelHost(Protocol):
    """The services of the runtime that pipelines use: cached models, their settings, forwards, detection."""

    def model(self, repo_id: str, progress: Progress | None = None) -> nn.Module: ...

    def settings(self, repo_id: str, kind: ModelKind) -> ProcessorSettings: ...

    def forward(self, model: nn.Module, pixel_values: torch.Tensor, **kwargs: Any) -> Any: ...

    def detect(self, image: LoadedImage) -> Detections: ...


@dataclass
class PipelineContext:
    """One run of a task on a batch of photos: where models come from, which checkpoint, the checked
    options, the batch's timings (shared by its photos) and the progress callback."""

    host: ModelHost
    task: Task
    repo_id: str
    options: Mapping[str, Any]
    progress: Progress | None = None
    timings: Timings = field(default_factory=Timings)

    def model(self, repo_id: str | None = None) -> nn.Module:
        """The cached model of `repo_id` (default: the task's checkpoint), loaded on first use."""
        return self.host.model(repo_id or self.repo_id, self.progress)

    def settings(self, repo_id: str | None = None, kind: ModelKind | None = None) -> ProcessorSettings:
        """How photos become inputs of `repo_id` (default: the task's checkpoint and kind)."""
        return self.host.settings(repo_id or self.repo_id, kind or self.task.kind)

    def forward(self, model: nn.Module, pixel_values: torch.Tensor, **kwargs: Any) -> Any:
        """The model's output dataclass (float32 fields) for a batch of inputs."""
        return self.host.forward(model, pixel_values, **kwargs)
