"""Top-down pose: person boxes from the detector, 308 keypoints per person, a skeleton picture and JSON."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..detector import Detections
from ..export import write_pose_json
from ..images import LoadedImage
from ..metadata import KeypointMeta, keypoints308
from ..options import Option
from ..pose import decode_keypoints
from ..processing import crop_persons
from ..results import TaskResult, Timings
from ..visualize import draw_pose

OPTIONS = (
    Option("threshold", "Keypoint threshold", "slider", 0.3, 0.0, 1.0, 0.05),
    Option(
        "flip_test", "Flip test (average with the mirrored photo; twice the model time)", "checkbox", False
    ),
    Option("show_boxes", "Show person boxes", "checkbox", True),
)


@dataclass
class PosePrediction:
    """Persons in photo pixels (box xywh, box_score, keypoints (K, 2), scores (K,)) and detector flags."""

    persons: list[dict]
    detections: Detections
    keypoint_names: tuple[str, ...]
    image_size: tuple[int, int]


@functools.lru_cache(maxsize=8)
def _meta_for(names: tuple[str, ...]) -> KeypointMeta:
    meta = keypoints308()
    return meta.with_names(names) if len(names) == len(meta.names) and all(names) else meta


def keypoint_meta(model) -> KeypointMeta:
    """Keypoint names from the checkpoint's id2label when complete, else the official 308."""
    labels = model.config.id2label
    return _meta_for(tuple(labels.get(i, "") for i in range(len(labels))))


def _flip_pairs(model, meta: KeypointMeta) -> torch.Tensor:
    pairs = model.config.flip_pairs or meta.flip_pairs
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


def _in_photo_pixels(
    image: LoadedImage, detections: Detections, keypoints: np.ndarray, scores: np.ndarray
) -> list[dict]:
    """Persons mapped from the model-side photo back to the photo as sent."""
    return [
        {
            "box": box / image.scale,
            "box_score": float(box_score),
            "keypoints": points / image.scale,
            "scores": point_scores,
        }
        for box, box_score, points, point_scores in zip(
            detections.boxes_xywh, detections.scores, keypoints, scores, strict=True
        )
    ]


def _summary(detections: Detections) -> tuple[str, list[str]]:
    count = len(detections)
    if detections.fallback:
        return "No person detected.", ["No person was detected; the whole photo was used as one person box."]
    notes = []
    if detections.capped:
        notes.append(f"{detections.found} persons were found; the {count} with the best scores were kept.")
    return f"{count} person{'s' if count != 1 else ''} found.", notes


def run(
    runtime, task, images: Sequence[LoadedImage], repo_id: str, options: dict, progress=None
) -> list[TaskResult]:
    model = runtime.model(repo_id, progress)
    settings = runtime.settings(repo_id, "pose")
    meta = keypoint_meta(model)
    timings = [Timings() for _ in images]
    detections = []
    for image, timing in zip(images, timings, strict=True):
        with timing.measure("detection"):
            detections.append(runtime.detect(image))
    batch_timings = Timings()
    with batch_timings.measure("model"):
        crops = torch.cat(
            [
                crop_persons(image.model_rgb, found.boxes_xywh, settings)
                for image, found in zip(images, detections, strict=True)
            ]
        )
        heatmaps = runtime.forward(model, crops)["heatmaps"]
        flipped = None
        if options["flip_test"]:
            flipped = runtime.forward(model, crops.flip(-1), flip_pairs=_flip_pairs(model, meta))["heatmaps"]
    share = batch_timings.share(len(images))
    results, start = [], 0
    for image, found, timing in zip(images, detections, timings, strict=True):
        stop = start + len(found)
        with timing.measure("post"):
            keypoints, scores = decode_keypoints(
                heatmaps[start:stop],
                found.boxes_xywh,
                settings.size,
                None if flipped is None else flipped[start:stop],
            )
            persons = _in_photo_pixels(image, found, keypoints.cpu().numpy(), scores.cpu().numpy())
            picture = draw_pose(image.rgb, persons, meta, options["threshold"], options["show_boxes"])
        start = stop
        summary, notes = _summary(found)
        prediction = PosePrediction(persons, found, meta.names, image.original_size)
        results.append(
            TaskResult(
                task=task.name,
                model_id=repo_id,
                pictures=[("Keypoints", picture)],
                prediction=prediction,
                exporter=_exporter(prediction, repo_id),
                summary=summary,
                notes=notes,
                timings=Timings(timing.detection, share.model, timing.post),
            )
        )
    return results


def _exporter(prediction: PosePrediction, repo_id: str):
    def export(directory, stem):
        return write_pose_json(
            directory,
            stem,
            prediction.persons,
            image_size=prediction.image_size,
            keypoint_names=prediction.keypoint_names,
            model_id=repo_id,
            detections=prediction.detections,
        )

    return export
