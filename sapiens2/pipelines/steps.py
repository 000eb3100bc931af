"""A task's pipeline as steps that run together in one process or apart on a cluster (`batch.cluster`).

Each step fills the photos' `values` (the task's own `StepValues`, a field each) for the next ones: CPU
steps (preprocessing, crops) need no model; model steps (detection, forwards and the reductions that belong
next to the model's outputs) run where the models live, on batches. `finish` turns one photo's values into
its TaskResult (a typed prediction, plain data) on a CPU; pictures and files are drawn and written from it
afterwards, when asked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import torch

from sapiens2.outputs.results import TaskResult, Timings
from sapiens2.pipelines.context import PipelineContext
from sapiens2.vision.images import LoadedImage

Stage = Literal["detection", "model", "decode"]  # the Timings field a step's time counts to


@dataclass
class StepValues:
    """What a task's steps leave for the next ones and for its finish: each task declares its own, one field
    per value, each None until its step has run."""


Values = TypeVar("Values", bound=StepValues)


@dataclass
class Photo(Generic[Values]):
    """One photo on its way through a task's steps: what each step left for the next, and its timings."""

    image: LoadedImage
    values: Values
    timings: Timings = field(default_factory=Timings)
    seconds: dict[str, float] = field(default_factory=dict)  # per step name, this photo's share


StepRun = Callable[[PipelineContext, Sequence[Photo]], None]


@dataclass(frozen=True)
class Step:
    """One step of a task: `run(context, photos)` stores what it finds in each photo's values.

    `uses_model`: the step needs the task's models or the person detector (a model stage on a cluster);
    otherwise it runs on any CPU. `stage`: where its time is counted in the photos' Timings.
    """

    name: str
    run: StepRun
    uses_model: bool = False
    stage: Stage = "model"

    def apply(self, context: PipelineContext, photos: Sequence[Photo]) -> None:
        """Run the step on `photos`, each photo getting an even share of the time it took."""
        if not photos:
            return
        timing = Timings()
        with timing.measure(self.stage):
            self.run(context, photos)
        share = timing.share(len(photos))
        for photo in photos:
            photo.timings += share
            photo.seconds[self.name] = photo.seconds.get(self.name, 0.0) + share.total


Finish = Callable[[PipelineContext, Photo], TaskResult]
Given = Sequence[Mapping[str, Any] | None]  # per photo, the values it starts with (None: none)


@dataclass(frozen=True)
class Pipeline:
    """A task's steps and its finish: run whole by `run`, in three parts by a runner whose model steps run
    elsewhere (`started`, then the steps from `first_model_step` on, then `finished_all`), or step by step
    by `sapiens2.batch.cluster`."""

    steps: tuple[Step, ...]
    finish: Finish
    values: type[StepValues] = StepValues  # what its steps fill in each photo

    def photo(self, image: LoadedImage, given: Mapping[str, Any] | None = None) -> Photo:
        """`image` ready for the first step; `given`: values it starts with, by field name (pose's
        `given_boxes`)."""
        return Photo(image, self.values(**(given or {})))

    def run(
        self, context: PipelineContext, images: Sequence[LoadedImage], given: Given | None = None
    ) -> list[TaskResult]:
        """One result per photo, in order: every step on the whole batch, here, then each photo finished."""
        photos = self.started(context, images, given)
        self.run_steps(context, photos, self.first_model_step)
        return self.finished_all(context, photos)

    def started(
        self, context: PipelineContext, images: Sequence[LoadedImage], given: Given | None = None
    ) -> list[Photo]:
        """The photos after the steps before the first model step. `given`: values each photo starts with
        (None: none), which the steps may use (pose's given boxes)."""
        given = given or [None] * len(images)
        photos = [self.photo(image, values) for image, values in zip(images, given, strict=True)]
        self.run_steps(context, photos, 0, self.first_model_step)
        return photos

    def finished_all(self, context: PipelineContext, photos: Sequence[Photo]) -> list[TaskResult]:
        """Each photo's result, in order, once every step has run."""
        context.stage("drawing the pictures")
        return [self.finished(context, photo) for photo in photos]

    @property
    def first_model_step(self) -> int:
        """The index of the first step that needs a model (the number of steps when none does)."""
        return next((index for index, step in enumerate(self.steps) if step.uses_model), len(self.steps))

    def run_steps(
        self, context: PipelineContext, photos: Sequence[Photo], first: int = 0, stop: int | None = None
    ) -> None:
        """Steps `first` up to `stop` (default: the last) on the photos."""
        for step in self.steps[first:stop]:
            step.apply(context, photos)

    def finished(self, context: PipelineContext, photo: Photo) -> TaskResult:
        """The photo's result (its prediction, no pictures), carrying the timings of every step; the finish
        counts as decoding."""
        post = Timings()
        with post.measure("decode"):
            result = self.finish(context, photo)
        photo.seconds["finish"] = post.decode
        result.timings = photo.timings + post
        return result

    def groups(self) -> list[tuple[bool, tuple[Step, ...]]]:
        """Consecutive steps grouped by whether they use a model: (uses_model, steps) in order."""
        groups: list[tuple[bool, tuple[Step, ...]]] = []
        for step in self.steps:
            if groups and groups[-1][0] == step.uses_model:
                groups[-1] = (step.uses_model, groups[-1][1] + (step,))
            else:
                groups.append((step.uses_model, (step,)))
        return groups


def detached(value: Any) -> Any:
    """`value` with every tensor in it (also inside lists, tuples, dicts and dataclasses) copied to the
    CPU on its own storage, so that it pickles without the batch it was sliced from."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: detached(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(detached(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: detached(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value
