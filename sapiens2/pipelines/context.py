"""What a pipeline is given: the runtime's services, the task, its checkpoint, options, timings, progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from sapiens2.models.config import Sapiens2Config
from sapiens2.models.hub import display_name
from sapiens2.models.kinds import ModelKind
from sapiens2.outputs.results import TaskOptions, Timings
from sapiens2.progress import Progress
from sapiens2.settings import Settings
from sapiens2.vision.detector import Detections
from sapiens2.vision.images import LoadedImage
from sapiens2.vision.processing import ProcessorSettings


class TaskSpec(Protocol):
    """What a pipeline reads of its registry entry (`sapiens2.tasks.Task`)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> ModelKind: ...

    def helper_repo_id(self, repo_id: str) -> str | None: ...


class ModelHost(Protocol):
    """What pipelines ask of where the models live: cached models, their configs and settings, forwards,
    detection. Nothing else: a pipeline never calls back into the runtime that runs it. `setup`: the
    settings the runtime was given (sapiens2.settings)."""

    setup: Settings

    def model(self, repo_id: str, progress: Progress | None = None) -> nn.Module: ...

    def settings(self, repo_id: str, kind: ModelKind) -> ProcessorSettings: ...

    def forward(self, model: nn.Module, pixel_values: torch.Tensor, **kwargs: Any) -> Any: ...

    def detect(self, image: LoadedImage) -> Detections: ...

    def config(self, repo_id: str) -> Sapiens2Config: ...


Chosen = TypeVar("Chosen", bound=TaskOptions)


@dataclass
class PipelineContext(Generic[Chosen]):
    """One run of a task on a batch of photos: where models come from, which checkpoint, the task's checked
    options (its own `TaskOptions`, read as attributes), the batch's timings (shared by its photos) and the
    progress callback."""

    host: ModelHost
    task: TaskSpec
    repo_id: str
    options: Chosen
    progress: Progress | None = None
    timings: Timings = field(default_factory=Timings)
    notes: list[str] = field(default_factory=list)  # for the user, added to every photo's result
    name: str | None = None  # what results call the model, when not its repo id (a fine-tuned model's name)

    @property
    def model_name(self) -> str:
        """The model as results and files name it."""
        return self.name or self.repo_id

    def model(self, repo_id: str | None = None) -> nn.Module:
        """The cached model of `repo_id` (default: the task's checkpoint), loaded on first use."""
        return self.host.model(repo_id or self.repo_id, self.progress)

    def config(self, repo_id: str | None = None) -> Sapiens2Config:
        """The config of `repo_id` (default: the task's checkpoint), without loading its weights."""
        return self.host.config(repo_id or self.repo_id)

    def settings(self, repo_id: str | None = None, kind: ModelKind | None = None) -> ProcessorSettings:
        """How photos become inputs of `repo_id` (default: the task's checkpoint and kind); a note says so
        when the model was built for another input size, or when the checkpoint has no
        preprocessor_config.json and the settings were assumed."""
        repo_id = repo_id or self.repo_id
        settings = self.host.settings(repo_id, kind or self.task.kind)
        built_for = tuple(self.host.config(repo_id).image_size)
        if settings.assumed:
            self.note(
                f"{display_name(repo_id)} has no preprocessor_config.json: assumed {settings.description()}."
            )
        elif settings.size != built_for:
            runs, built = f"{settings.height}x{settings.width}", f"{built_for[0]}x{built_for[1]}"
            self.note(
                f"The model runs at {runs} (its preprocessor_config.json) but was built for {built} (its "
                "config.json); results may be less accurate."
            )
        return settings

    def note(self, text: str) -> None:
        """Tell the user `text` once, with every photo's result."""
        if text not in self.notes:
            self.notes.append(text)

    def stage(self, text: str) -> None:
        """Say what the run is doing now ("running the model", ...)."""
        if self.progress is not None:
            self.progress(None, text)

    def forward(self, model: nn.Module, pixel_values: torch.Tensor, **kwargs: Any) -> Any:
        """The model's output dataclass (float32 fields) for a batch of inputs."""
        return self.host.forward(model, pixel_values, **kwargs)
