"""Pose in videos: persons tracked from frame to frame, their keypoints smoothed, the detector run every
N frames (between detections each person's box is drawn around its keypoints of the frame before)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from sapiens2.outputs.results import FrameFollower, TaskOptions, TaskResult
from sapiens2.pipelines.options import ByDevice, declared, option
from sapiens2.vision.detector import Detections
from sapiens2.vision.pose_decoding import Person
from sapiens2.vision.smoothing import DEFAULT_BETA, DEFAULT_MIN_CUTOFF, KeypointFilter
from sapiens2.vision.tracking import PersonTracker, box_from_keypoints


@dataclass(frozen=True)
class TrackingOptions(TaskOptions):
    """Pose's video options for following persons from frame to frame."""

    track: bool = option(
        "Track persons (videos: an id per person, kept from frame to frame)",
        "checkbox",
        True,
        help="Ids are drawn on the picture and written in every frame's record.",
    )
    smoothing: bool = option("Smooth keypoints over time (videos: One-Euro filter)", "checkbox", True)
    min_cutoff: float = option(
        "Smoothing: cut-off of a still keypoint (Hz)",
        "slider",
        DEFAULT_MIN_CUTOFF,
        0.05,
        10.0,
        0.05,
        help="Lower: steadier still keypoints, more lag; higher: less smoothing.",
    )
    beta: float = option(
        "Smoothing: speed coefficient",
        "slider",
        DEFAULT_BETA,
        0.0,
        50.0,
        0.1,
        help="Higher: fast moves followed with less lag (and more jitter); 0: the same cut-off at any speed.",
    )
    detect_every: float = option(
        "Detect persons every N frames (videos)",
        "slider",
        ByDevice(gpu=1, cpu=5),
        1.0,
        30.0,
        1.0,
        help="Between detections each person's box comes from its keypoints of the frame before, and frames "
        "go through the model one at a time; 1 on a GPU, where frames go through the model in batches.",
    )


VIDEO_OPTIONS = declared(TrackingOptions)


class PoseTracker(FrameFollower):
    """Pose's frames in order: ids, smoothed keypoints and the boxes of the next frame between detections.

    `options`: pose's and its video options, checked. For each frame: run pose with `given=given()`, then
    `follow(rgb, result, dt)` gives the result shown and recorded, whose pictures are then drawn.
    """

    def __init__(self, options: Mapping[str, Any], batched: bool = False) -> None:
        super().__init__(options, batched)
        self.threshold = float(options["threshold"])  # pose's own option, beside the video options
        self.tracking = TrackingOptions(**{item.name: options[item.name] for item in fields(TrackingOptions)})
        self.asked_every = max(1, round(self.tracking.detect_every))
        self.detect_every = 1 if batched else self.asked_every
        self.tracker = PersonTracker(self.threshold)
        self.filters: dict[int, KeypointFilter] = {}
        self.frames = 0  # frames followed
        self.detected = 0  # of those, frames whose boxes came from the detector
        self._since_detection = 0
        self._next: Detections | None = None  # the next frame's boxes, when it skips the detector
        self._next_ids: list[int] = []  # the tracks those boxes are drawn around
        self._given = False

    @property
    def sequential(self) -> bool:
        return self.detect_every > 1

    def given(self) -> dict[str, Any] | None:
        self._given = self._next is not None
        return {"given_boxes": self._next} if self._given else None

    def follow(self, rgb: np.ndarray, result: TaskResult, dt: float) -> TaskResult:
        self.frames += 1
        self._since_detection = self._since_detection + 1 if self._given else 0
        given, self._given = self._given, False
        self.detected += not given
        prediction = result.prediction
        persons = prediction.detected
        # Between detections the persons are found in boxes drawn around known tracks: they continue them.
        ids = self.tracker.update(persons, self._next_ids if given else None)
        self.filters = {t.id: self.filters.get(t.id) or self._filter() for t in self.tracker.tracks}
        followed = [
            self._followed(person, track_id, dt) for person, track_id in zip(persons, ids, strict=True)
        ]
        self._next, self._next_ids = self._next_boxes(persons, prediction.image_size), ids
        if prediction.detections.fallback:
            return result
        # Pictures are drawn of the result followed, once: any drawn before show the persons unfollowed.
        return dataclasses.replace(
            result, prediction=dataclasses.replace(prediction, persons=followed), pictures=[]
        )

    def _filter(self) -> KeypointFilter:
        return KeypointFilter(self.tracking.min_cutoff, self.tracking.beta)

    def _followed(self, person: Person, track_id: int, dt: float) -> Person:
        """The person as shown: its keypoints smoothed (when asked) and its id (when tracking is asked)."""
        keypoints = person.keypoints
        if self.tracking.smoothing:
            size = float(max(person.box[2], person.box[3]))
            keypoints = self.filters[track_id](keypoints, person.scores >= self.threshold, dt, size)
        shown_id = track_id if self.tracking.track else None
        return dataclasses.replace(person, keypoints=keypoints, track_id=shown_id)

    def _next_boxes(self, persons: list[Person], image_size: tuple[int, int]) -> Detections | None:
        """Boxes around the persons' keypoints for the next frame; None when it is the detector's turn, or
        when someone's keypoints are too uncertain for a box (the person may be leaving)."""
        if not persons or self._since_detection + 1 >= self.detect_every:
            return None
        boxes = [box_from_keypoints(person, self.threshold, image_size) for person in persons]
        if any(box is None for box in boxes):
            return None
        scores = [0.0 if person.box_score is None else person.box_score for person in persons]
        count = len(persons)
        return Detections(np.array(boxes, dtype=np.float32), np.array(scores, dtype=np.float32), found=count)

    @property
    def notes(self) -> list[str]:
        if self.asked_every > self.detect_every:
            return [
                "The person detector ran on every frame: here each model call is a call to the GPU, so "
                "frames go through the model in batches, and detecting every N frames needs them one by one."
            ]
        if self.detect_every == 1 or not self.frames:
            return []
        return [
            f"The person detector ran on {self.detected} of {self.frames} frames (every {self.detect_every})."
        ]
