"""Top-down pose: person boxes from the detector, 308 keypoints per person, a skeleton picture and JSON."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sapiens2.data.metadata import KeypointMeta, keypoint_set, keypoints308
from sapiens2.models.modeling import flip_back
from sapiens2.outputs.controlnet import openpose_picture
from sapiens2.outputs.exports import (
    POSE_FRAMES_SUFFIX,
    POSE_JSON,
    write_picture,
    write_pose_frames_json,
    write_pose_json,
)
from sapiens2.outputs.keypoint_files import (
    FORMAT_SUFFIXES,
    VIDEO_FORMAT_SUFFIXES,
    write_frame_keypoint_formats,
    write_keypoint_formats,
)
from sapiens2.outputs.pictures import draw_pose
from sapiens2.outputs.results import Export, FrameLog, Prediction, TaskOptions, TaskResult
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.options import ByDevice, option
from sapiens2.pipelines.steps import Photo, Pipeline, Step, StepValues
from sapiens2.vision.detector import Detections
from sapiens2.vision.images import LoadedImage
from sapiens2.vision.keypoint_formats import FORMAT_NAMES, NATIVE, convertible
from sapiens2.vision.pose_decoding import Person, decode_keypoints
from sapiens2.vision.processing import crop_persons


@dataclass(frozen=True)
class PoseOptions(TaskOptions):
    """Pose's options."""

    threshold: float = option("Keypoint threshold", "slider", 0.3, 0.0, 1.0, 0.05)
    flip_test: bool = option(
        "Flip test (average with the mirrored photo; twice the model time)",
        "checkbox",
        ByDevice(gpu=True, cpu=False),
        help="On by default with a GPU, as in the official demo; off by default on the CPU, where it doubles "
        "the model time.",
    )
    show_boxes: bool = option("Show person boxes", "checkbox", True)
    keypoint_format: tuple[str, ...] = option(
        "Extra keypoint files (the 308 points' _pose.json always comes)",
        "choices",
        (),
        choices=FORMAT_NAMES,
        always=(NATIVE,),
        help="Added beside the 308 points' _pose.json (sapiens308), which is always written: coco17 and "
        "wholebody133 as COCO results files (_coco17.json, _wholebody.json), openpose as OpenPose's JSON "
        "(_openpose.json).",
    )


CONTROLNET_SUFFIX = "_controlnet"


@dataclass
class PosePrediction(Prediction):
    """Per person, in photo pixels: its box, keypoints and their scores (`persons`); the detector's findings
    and flags; the keypoint names, with their skeleton and colours for drawing (`meta`)."""

    persons: list[Person]
    detections: Detections
    keypoint_names: tuple[str, ...]
    meta: KeypointMeta = field(repr=False)

    @property
    def image_size(self) -> tuple[int, int]:
        """(height, width) of the photo."""
        return self.image.shape[:2]

    @property
    def detected(self) -> list[Person]:
        """The persons the detector found: none when it fell back to the whole photo."""
        return [] if self.detections.fallback else self.persons

    @property
    def keypoints(self) -> np.ndarray:
        """(persons, K, 2) x, y of every person's keypoints."""
        return np.array([p.keypoints for p in self.persons], dtype=np.float64).reshape(
            -1, len(self.meta.names), 2
        )

    @property
    def scores(self) -> np.ndarray:
        """(persons, K) the keypoints' scores."""
        return np.array([p.scores for p in self.persons], dtype=np.float64).reshape(-1, len(self.meta.names))

    @property
    def boxes(self) -> np.ndarray:
        """(persons, 4) x, y, w, h of every person's box."""
        return np.array([p.box for p in self.persons], dtype=np.float64).reshape(-1, 4)


@functools.lru_cache(maxsize=8)
def _meta_for(names: tuple[str, ...]) -> KeypointMeta:
    meta = keypoints308()
    return meta.with_names(names) if len(names) == len(meta.names) and all(names) else meta


def keypoint_meta(config) -> KeypointMeta:
    """Keypoint names from the checkpoint's id2label when it names all 308 (placeholders such as LABEL_0
    name none), else the official ones; a model with another keypoint count (fine-tuned) has its own names,
    flip pairs and skeleton."""
    if config.num_labels != len(keypoints308().names):
        names = tuple(config.id2label.values())
        return keypoint_set(names, config.flip_pairs or (), config.skeleton or ())
    return _meta_for(config.label_names())


def _flip_pairs(model, meta: KeypointMeta) -> torch.Tensor:
    pairs = model.config.flip_pairs or meta.flip_pairs
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


def _in_photo_pixels(
    image: LoadedImage, detections: Detections, keypoints: np.ndarray, scores: np.ndarray
) -> list[Person]:
    """Persons mapped from the model-side photo back to the photo as sent."""
    return [
        Person(box / image.scale, points / image.scale, point_scores, float(box_score))
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


@dataclass
class PoseValues(StepValues):
    """What pose's steps leave: boxes given to the photo (in photo pixels, replacing the detector's), the
    detections (model-side pixels), the person crops, then each person's keypoints and their scores."""

    given_boxes: Detections | None = None
    detections: Detections | None = None
    crops: torch.Tensor | None = None
    keypoints: np.ndarray | None = None
    scores: np.ndarray | None = None


def _detect(context: PipelineContext[PoseOptions], photos: Sequence[Photo[PoseValues]]) -> None:
    """The detector's boxes of each photo, except for a photo given its boxes (in photo pixels: a video
    frame between detections, boxed around the persons of the frame before)."""
    if any(photo.values.given_boxes is None for photo in photos):
        context.stage("detecting persons")
    for photo in photos:
        given, photo.values.given_boxes = photo.values.given_boxes, None
        if given is None:
            photo.values.detections = context.host.detect(photo.image)
        else:
            boxes = given.boxes_xywh * np.float32(photo.image.scale)
            photo.values.detections = dataclasses.replace(given, boxes_xywh=boxes)


def _crop(context: PipelineContext[PoseOptions], photos: Sequence[Photo[PoseValues]]) -> None:
    settings = context.settings()
    for photo in photos:
        found = photo.values.detections
        photo.values.crops = crop_persons(photo.image.model_rgb, found.boxes_xywh, settings)


def _keypoints(context: PipelineContext[PoseOptions], photos: Sequence[Photo[PoseValues]]) -> None:
    """Heatmaps of every person crop of the batch, decoded into each photo's keypoints and scores."""
    model = context.model()
    meta = keypoint_meta(model.config)
    crops = torch.cat([photo.values.crops for photo in photos])
    for photo in photos:
        photo.values.crops = None
    count = len(crops)
    context.stage(f"running the model on {count} person{'s' * (count != 1)}")
    if context.options.flip_test:
        # The crops and their mirror images in one batch: on a GPU one pass of kernel launches, not two.
        crops = torch.cat([crops, crops.flip(-1)])
    heatmaps = context.forward(model, crops).heatmaps
    flipped = None
    if context.options.flip_test:
        heatmaps, flipped = heatmaps[:count], flip_back(heatmaps[count:], _flip_pairs(model, meta))
    starts = np.cumsum([0] + [len(photo.values.detections) for photo in photos]).tolist()
    size = context.settings().size
    for index, photo in enumerate(photos):
        people = slice(starts[index], starts[index + 1])
        keypoints, scores = decode_keypoints(
            heatmaps[people],
            photo.values.detections.boxes_xywh,
            size,
            None if flipped is None else flipped[people],
        )
        photo.values.keypoints, photo.values.scores = keypoints.cpu().numpy(), scores.cpu().numpy()


def _finish(context: PipelineContext[PoseOptions], photo: Photo[PoseValues]) -> TaskResult:
    # The metadata from the checkpoint's config: a CPU worker of a cluster reads it without the weights.
    image, found, meta = photo.image, photo.values.detections, keypoint_meta(context.config())
    persons = _in_photo_pixels(image, found, photo.values.keypoints, photo.values.scores)
    prediction = PosePrediction(image.rgb, context.model_name, persons, found, meta.names, meta)
    summary, notes = _summary(found)
    if not convertible("openpose", meta.names):
        notes.append("The ControlNet picture is drawn from the 308 Sapiens keypoints; this model has others.")
    return TaskResult(
        task=context.task.name,
        model_id=context.model_name,
        prediction=prediction,
        options=context.options,
        summary=summary,
        notes=notes,
        persons=len(prediction.detected),
    )


def draw_keypoints(prediction: PosePrediction, options: PoseOptions) -> np.ndarray:
    """The skeletons (and, when asked, the boxes) on the photo."""
    meta, persons = prediction.meta, prediction.persons
    return draw_pose(prediction.image, persons, meta, options.threshold, options.show_boxes)


def draw_controlnet(prediction: PosePrediction, options: PoseOptions) -> np.ndarray:
    """OpenPose's drawing on black at the photo's size, for ControlNet; black alone for a model whose
    keypoints are not the 308 (a fine-tuned one)."""
    if not convertible("openpose", prediction.keypoint_names):
        return np.zeros((*prediction.image_size, 3), dtype=np.uint8)
    return openpose_picture(
        prediction.image_size, prediction.persons, prediction.keypoint_names, options.threshold
    )


def _chosen_format(name: str):
    return lambda options: name in options.keypoint_format


def _write_pose_json(prediction: PosePrediction, _: PoseOptions, directory: Path, stem: str) -> list[Path]:
    return write_pose_json(
        directory,
        stem,
        prediction.persons,
        image_size=prediction.image_size,
        keypoint_names=prediction.keypoint_names,
        model_id=prediction.model_id,
        detections=prediction.detections,
    )


def _format_writer(name: str):
    def write(prediction: PosePrediction, options: PoseOptions, directory: Path, stem: str) -> list[Path]:
        return write_keypoint_formats(directory, stem, prediction.persons, prediction.keypoint_names, [name])

    return write


def _write_controlnet(prediction: PosePrediction, options: PoseOptions, out: Path, stem: str) -> list[Path]:
    return write_picture(out, stem, CONTROLNET_SUFFIX, draw_controlnet(prediction, options))


EXPORTS = (
    Export(POSE_JSON, _write_pose_json, _chosen_format(NATIVE)),
    *(Export(suffix, _format_writer(name), _chosen_format(name)) for name, suffix in FORMAT_SUFFIXES.items()),
    Export(f"{CONTROLNET_SUFFIX}.png", _write_controlnet),
)


PIPELINE = Pipeline(
    (
        Step("detect", _detect, uses_model=True, stage="detection"),
        Step("crop", _crop),
        Step("keypoints", _keypoints, uses_model=True),
    ),
    _finish,
    PoseValues,
)


def columns(result: TaskResult) -> dict[str, np.ndarray]:
    """The photo's row in a table of results: boxes (x, y, w, h) and keypoints (x, y) in photo pixels, with
    their scores; the persons the detector found (none when it fell back to the whole photo)."""
    persons = result.prediction.detected
    count = len(result.prediction.keypoint_names)
    return {
        "boxes": np.array([person.box for person in persons], dtype=np.float32).reshape(-1, 4),
        "box_scores": np.array([person.box_score for person in persons], dtype=np.float32),
        "keypoints": np.array([person.keypoints for person in persons], dtype=np.float32).reshape(
            -1, count, 2
        ),
        "keypoint_scores": np.array([person.scores for person in persons], dtype=np.float32).reshape(
            -1, count
        ),
    }


class FramePoses(FrameLog):
    """The persons found in every frame of a video, written in the official demo's JSON layout."""

    suffix = POSE_FRAMES_SUFFIX

    options: PoseOptions

    def __init__(self, options: PoseOptions) -> None:
        super().__init__(options)
        self.frames: list[tuple[str, list[Person]]] = []
        self.image_size = (0, 0)
        self.keypoint_names: tuple[str, ...] = ()

    def add(self, frame: str, result: TaskResult) -> None:
        self.frames.append((frame, result.prediction.detected))
        self.image_size = result.prediction.image_size
        self.keypoint_names = result.prediction.keypoint_names

    @classmethod
    def format_suffixes(cls, options: PoseOptions) -> tuple[str, ...]:
        """The keypoint formats chosen other than the 308 points, which the frame log itself holds."""
        return tuple(VIDEO_FORMAT_SUFFIXES[name] for name in options.keypoint_format if name != NATIVE)

    def write_formats(self, directory: Path, stem: str) -> list[Path]:
        formats = [name for name in self.options.keypoint_format if name != NATIVE]
        return write_frame_keypoint_formats(directory, stem, self.frames, self.keypoint_names, formats)

    def write(self, directory: Path, stem: str) -> Path:
        threshold = self.options.threshold
        return write_pose_frames_json(
            directory, stem, self.frames, image_size=self.image_size, threshold=threshold
        )[0]
