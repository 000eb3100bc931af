"""Body-part segmentation: 29 classes per pixel, an overlay with a legend, class-id PNG and .npy exports."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from ..export import write_segmentation
from ..images import LoadedImage
from ..kinds import ModelKind
from ..metadata import BodyPartMeta, body_parts, class_set
from ..options import Option
from ..postprocess import segmentation_labels
from ..results import TaskResult
from ..visualize import overlay_segmentation, segmentation_legend
from .common import forward_photos, photo_results
from .context import PipelineContext

OPTIONS = (Option("opacity", "Overlay opacity", "slider", 0.6, 0.0, 1.0, 0.05),)


def body_part_labels(
    context: PipelineContext,
    images: Sequence[LoadedImage],
    repo_id: str | None = None,
    kind: ModelKind | None = None,
) -> list[np.ndarray]:
    """Class ids (H, W) uint8 at each photo's original size, from `repo_id` (default: the task's model)."""
    stage = "running the model" if repo_id is None else "running the body-part model"
    outputs, _ = forward_photos(context, images, repo_id, kind, stage)
    labels = []
    with context.timings.measure("post"):
        for index, image in enumerate(images):
            logits = outputs.logits[index : index + 1]
            labels.append(segmentation_labels(logits, image.original_size)[0].to(torch.uint8).cpu().numpy())
    return labels


def class_meta(context: PipelineContext) -> BodyPartMeta:
    """Class names from the checkpoint's id2label when it has all 29, else the official list; a model with
    other classes (fine-tuned) has its own names and palette."""
    config = context.model().config
    if config.num_labels != len(body_parts().names) or config.palette:
        return class_set(list(config.id2label.values()), config.palette)
    return _meta_for(tuple(config.id2label.get(i, "") for i in range(config.num_labels)))


@functools.lru_cache(maxsize=8)
def _meta_for(names: tuple[str, ...]) -> BodyPartMeta:
    meta = body_parts()
    return meta.with_names(names) if all(names) else meta


def background_masks(context: PipelineContext, images: Sequence[LoadedImage]) -> list[np.ndarray | None]:
    """True where the task's helper body-part model sees background, when the task's option asks for it;
    else None per photo."""
    task = context.task
    if not context.options.get(task.helper_option):
        return [None] * len(images)
    labels = body_part_labels(context, images, task.helper_repo_id(context.repo_id), task.helper)
    return [seg == 0 for seg in labels]


def run(context: PipelineContext, images: Sequence[LoadedImage]) -> list[TaskResult]:
    labels = body_part_labels(context, images)
    meta = class_meta(context)
    opacity = context.options["opacity"]

    def make(index: int, image: LoadedImage) -> TaskResult:
        seg = labels[index]
        overlay = overlay_segmentation(image.rgb, seg, meta.palette, opacity)
        legend = segmentation_legend(seg, meta)
        present = int((np.bincount(seg.ravel(), minlength=len(meta.names))[1:] > 0).sum())
        return TaskResult(
            task=context.task.name,
            model_id=context.repo_id,
            pictures=[("Body parts", overlay), ("Legend", legend)],
            prediction=seg,
            exporter=lambda directory, stem: write_segmentation(directory, stem, seg),
            summary=f"{present} body-part classes found." if present else "No person pixels found.",
        )

    return photo_results(context, images, make)
