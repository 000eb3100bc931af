"""Body-part segmentation: 29 classes per pixel, an overlay with a legend, class-id PNG and .npy exports."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from ..export import write_segmentation
from ..images import LoadedImage
from ..metadata import BodyPartMeta, body_parts
from ..options import Option
from ..postprocess import segmentation_labels
from ..results import TaskResult, Timings
from ..visualize import overlay_segmentation, segmentation_legend
from .common import forward_photos, photo_results

OPTIONS = (Option("opacity", "Overlay opacity", "slider", 0.6, 0.0, 1.0, 0.05),)


def body_part_labels(
    runtime, images: Sequence[LoadedImage], repo_id: str, timings: Timings, progress=None
) -> list[np.ndarray]:
    """Class ids (H, W) uint8 at each photo's original size."""
    outputs, _ = forward_photos(runtime, repo_id, "seg", images, timings, progress)
    labels = []
    with timings.measure("post"):
        for index, image in enumerate(images):
            logits = outputs["logits"][index : index + 1]
            labels.append(segmentation_labels(logits, image.original_size)[0].to(torch.uint8).cpu().numpy())
    return labels


def class_meta(runtime, repo_id: str) -> BodyPartMeta:
    """Class names from the checkpoint's id2label when it has all 29, else the official list."""
    return _meta_for(tuple(runtime.model(repo_id).config.id2label.get(i, "") for i in range(29)))


@functools.lru_cache(maxsize=8)
def _meta_for(names: tuple[str, ...]) -> BodyPartMeta:
    meta = body_parts()
    return meta.with_names(names) if all(names) else meta


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
    labels = body_part_labels(runtime, images, repo_id, timings, progress)
    meta = class_meta(runtime, repo_id)

    def make(index: int, image: LoadedImage) -> TaskResult:
        seg = labels[index]
        overlay = overlay_segmentation(image.rgb, seg, meta.palette, options["opacity"])
        legend = segmentation_legend(seg, meta)
        present = int((np.bincount(seg.ravel(), minlength=len(meta.names))[1:] > 0).sum())
        return TaskResult(
            task=task.name,
            model_id=repo_id,
            pictures=[("Body parts", overlay), ("Legend", legend)],
            prediction=seg,
            exporter=lambda directory, stem: write_segmentation(directory, stem, seg),
            summary=f"{present} body-part classes found." if present else "No person pixels found.",
        )

    return photo_results(images, timings, make)
