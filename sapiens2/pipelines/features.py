"""Pretrained backbone features: patch features as a PCA picture, CLS embedding and patches as .npy."""

from __future__ import annotations

from collections.abc import Sequence

from ..export import write_features
from ..images import LoadedImage
from ..results import TaskResult
from ..visualize import pca_picture
from .common import forward_photos, photo_results
from .context import PipelineContext


def run(context: PipelineContext, images: Sequence[LoadedImage]) -> list[TaskResult]:
    outputs, settings = forward_photos(context, images)
    rows, columns = context.model().config.token_grid(settings.size)
    tokens = outputs.last_hidden_state

    def make(index: int, image: LoadedImage) -> TaskResult:
        cls = tokens[index, 0].cpu().numpy()
        patches = tokens[index, -rows * columns :].T.reshape(-1, rows, columns).cpu().numpy()
        return TaskResult(
            task=context.task.name,
            model_id=context.repo_id,
            pictures=[("Features (PCA)", pca_picture(patches, image.original_size))],
            prediction=(cls, patches),
            exporter=lambda directory, stem: write_features(directory, stem, cls, patches),
            summary=f"{patches.shape[0]}-dimensional features on a {rows}x{columns} patch grid.",
        )

    return photo_results(context, images, make)
