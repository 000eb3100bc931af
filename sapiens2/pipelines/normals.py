"""Surface normals: unit normals at the photo's size, shown as RGB, background removed by body parts."""

from __future__ import annotations

from collections.abc import Sequence

from ..export import write_normals
from ..images import LoadedImage
from ..postprocess import normals_to_image, to_hwc, unit_vectors_
from ..results import TaskResult, Timings
from ..visualize import normals_picture
from .common import forward_photos, model_sizes, photo_results
from .context import PipelineContext
from .segment import background_masks


def run(context: PipelineContext, images: Sequence[LoadedImage]) -> list[TaskResult]:
    outputs, settings = forward_photos(context, images)
    masks = background_masks(context, images)
    sizes = model_sizes(images)

    def make(index: int, image: LoadedImage, timings: Timings) -> TaskResult:
        normals = outputs.normals[index : index + 1]
        # The reference normalizes before resizing, so interpolated pixels fall short of unit length;
        # normalizing again keeps its directions and makes every exported normal a unit vector.
        resized = normals_to_image(normals, sizes[index], settings, image.original_size)
        unit = unit_vectors_(to_hwc(resized[0]))
        with timings.measure("pictures"):
            picture = normals_picture(unit, masks[index])
        return TaskResult(
            task=context.task.name,
            model_id=context.repo_id,
            pictures=[("Normals", picture)],
            prediction=unit,
            exporter=lambda directory, stem: write_normals(directory, stem, unit),
        )

    return photo_results(context, images, make)
