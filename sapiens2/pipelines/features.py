"""Pretrained backbone features: patch features as a PCA picture, CLS embedding and patches as .npy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sapiens2.outputs.exports import CLS_NPY, PATCHES_NPY, write_cls, write_patches
from sapiens2.outputs.pictures import pca_picture
from sapiens2.outputs.results import Export, Prediction, TaskOptions, TaskResult
from sapiens2.pipelines.common import ModelInputs, forward_inputs, resize_step
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.steps import Photo, Pipeline, Step


@dataclass
class FeaturesValues(ModelInputs):
    """What the backbone's step leaves: the CLS embedding (C,) and the patch features (C, h, w)."""

    cls: np.ndarray | None = None
    patches: np.ndarray | None = None


def _forward(context: PipelineContext, photos: Sequence[Photo[FeaturesValues]]) -> None:
    tokens = forward_inputs(context, photos).last_hidden_state
    rows, columns = context.model().config.token_grid(context.settings().size)
    for index, photo in enumerate(photos):
        photo.values.cls = tokens[index, 0].cpu().numpy()
        photo.values.patches = tokens[index, -rows * columns :].T.reshape(-1, rows, columns).cpu().numpy()


@dataclass
class FeaturesPrediction(Prediction):
    """The backbone's CLS embedding (C,) float32 (`embedding`) and its patch features (C, h, w) float32 on
    the patch grid (`features`)."""

    embedding: np.ndarray
    features: np.ndarray


def _finish(context: PipelineContext, photo: Photo[FeaturesValues]) -> TaskResult:
    cls, patches = photo.values.cls, photo.values.patches
    _, rows, columns = patches.shape
    return TaskResult(
        task=context.task.name,
        model_id=context.model_name,
        prediction=FeaturesPrediction(photo.image.rgb, context.model_name, cls, patches),
        options=context.options,
        summary=f"{patches.shape[0]}-dimensional features on a {rows}x{columns} patch grid.",
    )


def draw(prediction: FeaturesPrediction, options: TaskOptions) -> np.ndarray:
    """The patch features' first three principal components as colours, at the photo's size."""
    return pca_picture(prediction.features, prediction.image.shape[:2])


EXPORTS: tuple[Export[FeaturesPrediction], ...] = (
    Export(CLS_NPY, lambda found, _, *place: write_cls(*place, found.embedding, found.features)),
    Export(PATCHES_NPY, lambda found, _, *place: write_patches(*place, found.embedding, found.features)),
)


def columns(result: TaskResult) -> dict[str, np.ndarray]:
    """The photo's row in a table of results: its CLS embedding."""
    return {"cls": result.prediction.embedding.astype(np.float32)}


PIPELINE = Pipeline((resize_step(), Step("forward", _forward, uses_model=True)), _finish, FeaturesValues)
