"""Steps shared by the whole-photo tasks: model inputs from photos and results timed per photo."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..images import LoadedImage
from ..kinds import ModelKind
from ..processing import ProcessorSettings, preprocess
from ..results import TaskResult, Timings
from .context import PipelineContext


def model_sizes(images: Sequence[LoadedImage]) -> list[tuple[int, int]]:
    """(height, width) of what the model sees of each photo (after any downscale for very large photos)."""
    return [image.model_rgb.shape[:2] for image in images]


def forward_photos(
    context: PipelineContext,
    images: Sequence[LoadedImage],
    repo_id: str | None = None,
    kind: ModelKind | None = None,
    stage: str = "running the model",
) -> tuple[Any, ProcessorSettings]:
    """The output dataclass of `repo_id`'s model (default: the task's) for whole photos, and its processor
    settings; preprocessing and the forward count as model time, reported as `stage`."""
    model = context.model(repo_id)
    settings = context.settings(repo_id, kind)
    context.stage(stage)
    with context.timings.measure("model"):
        outputs = context.forward(model, preprocess([image.model_rgb for image in images], settings))
    return outputs, settings


def row(outputs: Any, index: int) -> Any:
    """Photo `index`'s slice (kept batched, 1 x ...) of every tensor field of an output dataclass."""
    values = {
        item.name: value[index : index + 1] if isinstance(value, torch.Tensor) else value
        for item in dataclasses.fields(outputs)
        for value in [getattr(outputs, item.name)]
    }
    return type(outputs)(**values)


def photo_results(
    context: PipelineContext,
    images: Sequence[LoadedImage],
    make: Callable[[int, LoadedImage], TaskResult],
    own_timings: Sequence[Timings] | None = None,
) -> list[TaskResult]:
    """One result per photo from `make(index, image)`, timed as post-processing; each carries its share of
    the batch's timings plus its `own_timings` (those measured for that photo alone, such as detection)."""
    share = context.timings.share(len(images))
    context.stage("drawing the pictures")
    results = []
    for index, image in enumerate(images):
        post = Timings()
        with post.measure("post"):
            result = make(index, image)
        alone = own_timings[index] if own_timings is not None else Timings()
        result.timings = share + alone + post
        results.append(result)
    return results
