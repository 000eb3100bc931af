"""Body-part segmentation: 29 classes per pixel, an overlay with a legend, class-id PNG and .npy exports, and
the mask of the chosen parts with the photo cut out by it."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from sapiens2.data.metadata import WHOLE_PERSON, BodyPartMeta, body_parts, class_set, part_groups
from sapiens2.errors import RequestError
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.kinds import SEG
from sapiens2.outputs.exports import (
    SEGMENTATION_NPY,
    SEGMENTATION_PNG,
    write_alpha,
    write_rgba,
    write_segmentation_npy,
    write_segmentation_png,
)
from sapiens2.outputs.pictures import (
    alpha_picture,
    cutout_on_checkerboard,
    label_counts,
    overlay_segmentation,
    segmentation_legend,
)
from sapiens2.outputs.results import Export, Prediction, TaskOptions, TaskResult
from sapiens2.pipelines.common import INPUT, InputName, ModelInputs, forward_inputs, resize_step
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.options import option
from sapiens2.pipelines.steps import Photo, Pipeline, Step
from sapiens2.vision.dense import segmentation_labels
from sapiens2.vision.part_masks import part_mask


def part_choices(config: Sapiens2Config) -> tuple[str, ...]:
    """What the parts option offers for a model: the groups, then the model's class names."""
    return (*part_groups(), *class_meta_of(config).names)


@dataclass(frozen=True)
class SegmentOptions(TaskOptions):
    """Body parts' options."""

    opacity: float = option("Overlay opacity", "slider", 0.6, 0.0, 1.0, 0.05)
    parts: tuple[str, ...] = option(
        "Parts to mask",
        "choices",
        (WHOLE_PERSON,),
        choices=(*part_groups(), *body_parts().names),
        model_choices=part_choices,
        help="One mask of all the parts chosen, and the photo cut out by it. Groups: whole person (every "
        "class but Background), face, hands, clothing, skin; a fine-tuned model takes its own class names.",
    )
    grow: float = option("Grow (+) or shrink (-) the mask, pixels", "slider", 0, -100, 100, 1)
    feather: float = option("Feather the mask's edge, pixels", "slider", 0, 0, 100, 1)


@dataclass(frozen=True)
class BackgroundOptions(TaskOptions):
    """The option of the tasks that can leave out the background by the helper body-part model."""

    remove_background: bool = option("Remove background (body-part model)", "checkbox", True)


MASK_SUFFIX, CUTOUT_SUFFIX = "_parts_mask", "_parts_cutout"
HELPER_INPUT: InputName = "helper_input"  # the helper body-part model's input, for the tasks masking with it


def body_part_labels(
    context: PipelineContext,
    photos: Sequence[Photo[ModelInputs]],
    name: InputName = INPUT,
    repo_id: str | None = None,
) -> list[np.ndarray]:
    """Class ids (H, W) uint8 at each photo's original size from its input `name`, by `repo_id`'s body-part
    model (default: the task's)."""
    stage = "running the model" if repo_id is None else "running the body-part model"
    logits = forward_inputs(context, photos, name, repo_id, SEG, stage).logits
    return [
        segmentation_labels(logits[index : index + 1], photo.image.original_size)[0]
        .to(torch.uint8)
        .cpu()
        .numpy()
        for index, photo in enumerate(photos)
    ]


def class_meta(context: PipelineContext) -> BodyPartMeta:
    """The class names and palette of the context's model (class_meta_of its config)."""
    return class_meta_of(context.config())  # read without the weights where the model is not loaded


def class_meta_of(config: Sapiens2Config) -> BodyPartMeta:
    """Class names from the checkpoint's id2label when it names all 29 (placeholders such as LABEL_0 name
    none), else the official list; a model with other classes (fine-tuned) has its own names and palette."""
    if config.num_labels != len(body_parts().names) or config.palette:
        return class_set(list(config.id2label.values()), config.palette)
    return _meta_for(config.label_names())


@functools.lru_cache(maxsize=8)
def _meta_for(names: tuple[str, ...]) -> BodyPartMeta:
    meta = body_parts()
    return meta.with_names(names) if all(names) else meta


# ---- the background mask of normals and depth: the helper body-part model's background class ----------


def _masking(context: PipelineContext) -> bool:
    options = context.options
    return isinstance(options, BackgroundOptions) and options.remove_background


def _helper_repo_id(context: PipelineContext) -> str | None:
    return context.task.helper_repo_id(context.repo_id)


def helper_resize_step() -> Step:
    """A CPU step resizing each photo for the helper body-part model, when the task's option asks for the
    background mask."""

    def run(context: PipelineContext, photos: Sequence[Photo[ModelInputs]]) -> None:
        if _masking(context):
            resize_step(HELPER_INPUT, _helper_repo_id(context), SEG).run(context, _without_labels(photos))

    return Step(f"resize_{SEG.name}", run)


def _without_labels(photos: Sequence[Photo[ModelInputs]]) -> list[Photo[ModelInputs]]:
    return [photo for photo in photos if photo.values.given_body_parts is None]


def background_masks(
    context: PipelineContext, photos: Sequence[Photo[ModelInputs]]
) -> list[np.ndarray | None]:
    """True where the task's helper body-part model sees background, when the task's option asks for it;
    else None per photo. The helper runs only on the photos not given its labels."""
    if not _masking(context):
        return [None] * len(photos)
    left = _without_labels(photos)
    computed = iter(body_part_labels(context, left, HELPER_INPUT, _helper_repo_id(context)) if left else ())
    masks = []
    for photo in photos:
        given, photo.values.given_body_parts = photo.values.given_body_parts, None
        labels = next(computed) if given is None else given
        if labels.shape != photo.image.original_size:
            raise ValueError(f"body-part labels of {labels.shape} for a photo of {photo.image.original_size}")
        masks.append(labels == 0)
    return masks


# ---- the task ---------------------------------------------------------------------------------------------


def chosen_class_ids(names: Sequence[str], meta: BodyPartMeta) -> tuple[int, ...]:
    """The class ids that `names` (class names of `meta` and group names) cover, sorted; a name the model
    does not know is a RequestError listing the ones it does."""
    ids: set[int] = set()
    for name in names:
        if name == WHOLE_PERSON:
            members = meta.names[1:]
        else:
            members = part_groups().get(name, (name,))
        found = [meta.names.index(member) for member in members if member in meta.names]
        if not found:
            groups = ", ".join(part_groups())
            raise RequestError(
                f"Option 'parts': this model has no class {name!r}"
                + (" nor any of its group" if name in part_groups() else "")
                + f"; choose among its classes ({', '.join(meta.names)}) or the groups {groups}."
            )
        ids.update(found)
    return tuple(sorted(ids))


@dataclass
class SegmentValues(ModelInputs):
    """What body parts' steps leave: the chosen parts' class ids, then each photo's class ids (H, W)."""

    part_ids: tuple[int, ...] | None = None
    labels: np.ndarray | None = None


def _parts(context: PipelineContext[SegmentOptions], photos: Sequence[Photo[SegmentValues]]) -> None:
    """The chosen parts as class ids, checked against the model's names before any model runs."""
    ids = chosen_class_ids(context.options.parts, class_meta(context))
    for photo in photos:
        photo.values.part_ids = ids


def _labels(context: PipelineContext, photos: Sequence[Photo[SegmentValues]]) -> None:
    for photo, labels in zip(photos, body_part_labels(context, photos), strict=True):
        photo.values.labels = labels


def _mask_line(options: SegmentOptions, mask: np.ndarray) -> str:
    parts = ", ".join(options.parts) or "no parts"
    return f"Mask of {parts}: {float(mask.mean()) / 255:.0%} of the photo."


@dataclass
class SegmentationPrediction(Prediction):
    """Class ids (H, W) uint8 at the photo's size (`labels`), the mask (H, W) uint8 0-255 of the parts the
    options chose, and the model's class names and palette (`meta`)."""

    labels: np.ndarray
    mask: np.ndarray
    meta: BodyPartMeta = field(repr=False)


def _finish(context: PipelineContext[SegmentOptions], photo: Photo[SegmentValues]) -> TaskResult:
    seg, meta, options = photo.values.labels, class_meta(context), context.options
    mask = part_mask(seg, photo.values.part_ids, options.grow, options.feather)
    present = int((label_counts(seg, len(meta.names))[1:] > 0).sum())
    found = f"{present} body-part classes found." if present else "No person pixels found."
    return TaskResult(
        task=context.task.name,
        model_id=context.model_name,
        prediction=SegmentationPrediction(photo.image.rgb, context.model_name, seg, mask, meta),
        options=options,
        summary=f"{found} {_mask_line(options, mask)}",
    )


def draw_overlay(prediction: SegmentationPrediction, options: SegmentOptions) -> np.ndarray:
    """The parts in their colours over the photo."""
    palette = prediction.meta.palette
    return overlay_segmentation(prediction.image, prediction.labels, palette, options.opacity)


def draw_legend(prediction: SegmentationPrediction, options: SegmentOptions) -> np.ndarray:
    """The colours of the parts found, with their names."""
    return segmentation_legend(prediction.labels, prediction.meta)


def draw_mask(prediction: SegmentationPrediction, options: SegmentOptions) -> np.ndarray:
    """The chosen parts' mask, white on black."""
    return alpha_picture(prediction.mask)


def draw_cutout(prediction: SegmentationPrediction, options: SegmentOptions) -> np.ndarray:
    """The photo cut out by the mask, on a checkerboard."""
    return cutout_on_checkerboard(prediction.image, prediction.mask)


EXPORTS: tuple[Export[SegmentationPrediction], ...] = (
    Export(SEGMENTATION_PNG, lambda found, _, *place: write_segmentation_png(*place, found.labels)),
    Export(SEGMENTATION_NPY, lambda found, _, *place: write_segmentation_npy(*place, found.labels)),
    Export(
        f"{MASK_SUFFIX}.png",
        lambda found, _, *place: write_alpha(*place, MASK_SUFFIX, found.mask, found.image),
    ),
    Export(
        f"{CUTOUT_SUFFIX}.png",
        lambda found, _, *place: write_rgba(*place, CUTOUT_SUFFIX, found.image, found.mask),
    ),
)


def columns(result: TaskResult) -> dict[str, np.ndarray]:
    """The photo's row in a table of results: pixels per class id."""
    return {"class_pixels": np.bincount(result.prediction.labels.ravel(), minlength=29).astype(np.int64)}


STEPS = (Step("parts", _parts), resize_step(), Step("labels", _labels, uses_model=True))
PIPELINE = Pipeline(STEPS, _finish, SegmentValues)
