"""Surface normals: unit normals at the photo's size, shown as RGB, background removed by body parts."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F

from ..export import write_normals
from ..images import LoadedImage
from ..postprocess import normals_to_image, to_hwc
from ..results import TaskResult, Timings
from ..visualize import normals_picture
from .common import forward_photos, model_sizes, photo_results, rows
from .segment import background_masks


def run(
    runtime, task, images: Sequence[LoadedImage], repo_id: str, options: dict, progress=None
) -> list[TaskResult]:
    timings = Timings()
    outputs, settings = forward_photos(runtime, repo_id, "normal", images, timings, progress)
    masks = background_masks(runtime, task, images, repo_id, options, timings, progress)
    sizes = model_sizes(images)

    def make(index: int, image: LoadedImage) -> TaskResult:
        normals = rows(outputs, index)["normals"]
        # The reference normalizes before resizing, so interpolated pixels fall short of unit length;
        # normalizing again keeps its directions and makes every exported normal a unit vector.
        resized = normals_to_image(normals, sizes[index], settings, image.original_size)
        unit = to_hwc(F.normalize(resized, dim=1)[0])
        return TaskResult(
            task=task.name,
            model_id=repo_id,
            pictures=[("Normals", normals_picture(unit, masks[index]))],
            prediction=unit,
            exporter=lambda directory, stem: write_normals(directory, stem, unit),
        )

    return photo_results(images, timings, make)
