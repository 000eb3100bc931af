"""Pretrained backbone features: patch features as a PCA picture, CLS embedding and patches as .npy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sapiens2.outputs.exports import write_features
from sapiens2.outputs.pictures import pca_picture
from sapiens2.outputs.results import TaskResult
from sapiens2.pipelines.common import forward_inputs, resize_step
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.steps import Photo, Pipeline, Step


def _forward(context: PipelineContext, photos: Sequence[Photo]) -> None:
    tokens = forward_inputs(context, photos).last_hidden_state
    rows, columns = context.model().config.token_grid(context.settings().size)
    for index, photo in enumerate(photos):
        photo.values["cls"] = tokens[index, 0].cpu().numpy()
        photo.values["patches"] = tokens[index, -rows * columns :].T.reshape(-1, rows, columns).cpu().numpy()


def _finish(context: PipelineContext, photo: Photo) -> TaskResult:
    cls, patches = photo.values["cls"], photo.values["patches"]
    _, rows, columns = patches.shape
    with photo.timings.measure("pictures"):
        picture = pca_picture(patches, photo.image.original_size)
    return TaskResult(
        task=context.task.name,
        model_id=context.model_name,
        pictures=[("Features (PCA)", picture)],
        prediction=(cls, patches),
        exporter=lambda directory, stem: write_features(directory, stem, cls, patches),
        summary=f"{patches.shape[0]}-dimensional features on a {rows}x{columns} patch grid.",
    )


def columns(result: TaskResult) -> dict[str, np.ndarray]:
    """The photo's row in a table of results: its CLS embedding."""
    return {"cls": result.prediction[0].astype(np.float32)}


PIPELINE = Pipeline((resize_step(), Step("forward", _forward, uses_model=True)), _finish)
