"""Steps shared by the whole-photo tasks: model inputs from photos and maps back at the photo's size."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..images import LoadedImage
from ..processing import ProcessorSettings, preprocess
from ..results import TaskResult, Timings


def model_sizes(images: Sequence[LoadedImage]) -> list[tuple[int, int]]:
    """(height, width) of what the model sees of each photo (after any downscale for very large photos)."""
    return [image.model_rgb.shape[:2] for image in images]


def whole_photo_inputs(images: Sequence[LoadedImage], settings: ProcessorSettings) -> torch.Tensor:
    """Normalized model inputs (N, 3, H, W) for whole photos."""
    return preprocess([image.model_rgb for image in images], settings)


def forward_photos(
    runtime, repo_id: str, task: str, images: Sequence[LoadedImage], timings: Timings, progress=None
) -> tuple[dict[str, torch.Tensor], ProcessorSettings]:
    """The model's outputs for whole photos, with the repo's processor settings; time goes to `model`."""
    model = runtime.model(repo_id, progress)
    settings = runtime.settings(repo_id, task)
    with timings.measure("model"):
        outputs = runtime.forward(model, whole_photo_inputs(images, settings))
    return outputs, settings


def rows(outputs: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    """Photo `index`'s slice (kept batched, 1 x ...) of every output."""
    return {name: value[index : index + 1] for name, value in outputs.items()}


def photo_results(
    images: Sequence[LoadedImage], timings: Timings, make: Callable[[int, LoadedImage], TaskResult]
) -> list[TaskResult]:
    """One result per photo from `make(index, image)`, timed as post-processing, each carrying its share of
    the batch's `timings` too."""
    share = timings.share(len(images))
    results = []
    for index, image in enumerate(images):
        post = Timings()
        with post.measure("post"):
            result = make(index, image)
        result.timings = Timings(share.detection, share.model, share.post + post.post)
        results.append(result)
    return results
