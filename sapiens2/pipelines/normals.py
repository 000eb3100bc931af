"""Surface normals: unit normals at the photo's size, shown as RGB, background removed by body parts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch.nn.functional as F

from ..export import write_normals
from ..images import LoadedImage
from ..postprocess import normals_to_image, to_hwc
from ..results import TaskResult, Timings
from ..visualize import normals_picture
from .common import forward_photos, model_sizes, rows
from .segment import body_part_labels


def background_masks(
    runtime, task, images, repo_id: str, options: dict, timings: Timings, progress=None
) -> list[np.ndarray | None]:
    """True where the body-part model sees background, when the option asks for it; else None per photo."""
    if not options.get(task.helper_option):
        return [None] * len(images)
    labels = body_part_labels(runtime, images, task.helper_repo_id(repo_id), timings, progress)
    return [seg == 0 for seg in labels]


def run(
    runtime, task, images: Sequence[LoadedImage], repo_id: str, options: dict, progress=None
) -> list[TaskResult]:
    timings = Timings()
    outputs, settings = forward_photos(runtime, repo_id, "normal", images, timings, progress)
    masks = background_masks(runtime, task, images, repo_id, options, timings, progress)
    share = timings.share(len(images))
    results = []
    for index, (image, size, mask) in enumerate(zip(images, model_sizes(images), masks, strict=True)):
        post = Timings()
        with post.measure("post"):
            normals = rows(outputs, index)["normals"]
            # The reference normalizes before resizing, so interpolated pixels fall short of unit length;
            # normalizing again keeps its directions and makes every exported normal a unit vector.
            resized = normals_to_image(normals, size, settings, image.original_size)
            unit = to_hwc(F.normalize(resized, dim=1)[0])
            picture = normals_picture(unit, mask)
        results.append(
            TaskResult(
                task=task.name,
                model_id=repo_id,
                pictures=[("Normals", picture)],
                prediction=unit,
                exporter=lambda directory, stem, unit=unit: write_normals(directory, stem, unit),
                timings=Timings(share.detection, share.model, share.post + post.post),
            )
        )
    return results
