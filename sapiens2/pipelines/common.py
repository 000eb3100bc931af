"""Steps shared by the whole-photo tasks: the photo resized for a model, and that model's forward."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from sapiens2.models.kinds import ModelKind
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.steps import Photo, Step, StepValues
from sapiens2.vision.processing import image_to_tensor, normalize, resize_image

InputName = Literal["input", "helper_input"]
INPUT: InputName = "input"  # the task model's input; the helper body-part model's is "helper_input"


@dataclass
class ModelInputs(StepValues):
    """What the whole-photo tasks' resize steps leave: the photo resized (and padded) for the task's model
    (`input`) and for its helper model (`helper_input`), uint8 (1, 3, H, W), until a forward takes it; and
    the helper body-part model's class ids (H, W) of the photo at its size when the caller already has them
    (`given_body_parts`: All tasks gives the body-part task's, so that model does not run again)."""

    input: torch.Tensor | None = None
    helper_input: torch.Tensor | None = None
    given_body_parts: np.ndarray | None = None


def resize_step(name: InputName = INPUT, repo_id: str | None = None, kind: ModelKind | None = None) -> Step:
    """A CPU step putting each photo resized (and padded) for `repo_id`'s model (default: the task's) in its
    values' `name` field, as uint8 (1, 3, H, W): four times smaller than the float input it becomes."""

    def run(context: PipelineContext, photos: Sequence[Photo[ModelInputs]]) -> None:
        settings = context.settings(repo_id, kind)
        for photo in photos:
            setattr(photo.values, name, resize_image(image_to_tensor(photo.image.model_rgb), settings))

    return Step(f"resize_{name}", run)


def forward_inputs(
    context: PipelineContext,
    photos: Sequence[Photo[ModelInputs]],
    name: InputName = INPUT,
    repo_id: str | None = None,
    kind: ModelKind | None = None,
    stage: str = "running the model",
) -> Any:
    """The output dataclass of `repo_id`'s model (default: the task's) for the photos' input `name` (taken
    from their values), the forward reported as `stage`."""
    model = context.model(repo_id)
    settings = context.settings(repo_id, kind)
    pixels = torch.cat([getattr(photo.values, name) for photo in photos])
    for photo in photos:
        setattr(photo.values, name, None)
    context.stage(stage)
    return context.forward(model, normalize(pixels, settings))


def model_sizes(photos: Sequence[Photo]) -> list[tuple[int, int]]:
    """(height, width) of what the model sees of each photo (after any downscale for very large photos)."""
    return [photo.image.model_size for photo in photos]


def row(outputs: Any, index: int) -> Any:
    """Photo `index`'s slice (kept batched, 1 x ...) of every tensor field of an output dataclass."""
    values = {
        item.name: value[index : index + 1] if isinstance(value, torch.Tensor) else value
        for item in dataclasses.fields(outputs)
        for value in [getattr(outputs, item.name)]
    }
    return type(outputs)(**values)
