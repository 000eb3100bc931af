"""Motion capture beside a pose video: the pointmap model run on the same frames, each frame's tracked
persons handed to the `MotionRecorder` as plain arrays, the motion files written at the end.

This is the one place that reads pose's and depth's results for motion; the recorder sees only arrays."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from sapiens2.errors import RequestError
from sapiens2.outputs.motion_capture import MotionRecorder
from sapiens2.outputs.motion_gltf import MOTION_GLB_SUFFIX, write_motion
from sapiens2.outputs.results import TaskResult
from sapiens2.progress import Progress
from sapiens2.runtime.runtime import Runtime
from sapiens2.tasks.registry import get_task

POINTMAP_TASK = "depth"
VIEWER_SUFFIX = "_motion_view.glb"


def pointmap_of(result: TaskResult) -> np.ndarray:
    """The (H, W, 3) pointmap of a depth result, in metres, the camera's x right, y down, z forward."""
    prediction = result.prediction
    return np.asarray(getattr(prediction, "pointmap", prediction))


def wanted(video_options: dict[str, Any]) -> bool:
    """True when the video's options ask for motion capture; refused without the tracking it needs."""
    if not video_options.get("motion"):
        return False
    if not video_options.get("track", True):
        raise RequestError("Motion capture follows each person from frame to frame: it needs tracking on.")
    return True


class VideoMotion:
    """Motion capture of one video run: `prepare` loads the pointmap model, `pointmaps` runs it on a batch
    of frames (with the device held, as the pose model), `add` records a frame's followed pose result, and
    `write` writes the files."""

    def __init__(self, runtime: Runtime, size: str | None, fps: float, threshold: float) -> None:
        self.runtime = runtime
        self.task = get_task(POINTMAP_TASK)
        self.size = self.task.size_or_default(size)
        self.fps = fps
        self.threshold = threshold
        self.recorder: MotionRecorder | None = None
        self._persons: list[tuple[int, Any]] = []  # (frame, person) as the frame log holds them

    def prepare(self, progress: Progress | None = None) -> None:
        self.runtime.prepare(self.task.repo_id(self.size), progress)

    def pointmaps(self, images: list[np.ndarray], progress: Progress | None = None) -> list[np.ndarray]:
        """Each frame's pointmap at the frame's size (no body-part model: two models per frame)."""
        results = self.runtime.run_batch(
            POINTMAP_TASK, images, size=self.size, progress=progress, remove_background=False, pictures=False
        )
        return [pointmap_of(result) for result in results]

    def add(self, rgb: np.ndarray, seen: TaskResult, followed: TaskResult, pointmap: np.ndarray) -> None:
        """Record one frame: the keypoints of its pose result as the model `seen` them, with the track ids
        of the result `followed` (the same persons, in the same order, smoothed over time for the pictures;
        the motion is smoothed in 3-D instead, without the lag of a causal filter)."""
        prediction = seen.prediction
        tracked = followed.prediction.detected
        raw = prediction.detected
        pairs = [(r, t) for r, t in zip(raw, tracked, strict=True) if t.track_id is not None]
        if self.recorder is None:
            self.recorder = MotionRecorder(prediction.keypoint_names, self.fps, self.threshold)
        count = len(prediction.keypoint_names)
        keypoints = np.array([r.keypoints for r, _ in pairs], dtype=np.float64).reshape(-1, count, 2)
        scores = np.array([r.scores for r, _ in pairs], dtype=np.float64).reshape(-1, count)
        ids = np.array([t.track_id for _, t in pairs], dtype=np.int64)
        self._persons += [(self.recorder.frames, person) for _, person in pairs]
        self.recorder.add(keypoints, scores, ids, pointmap, rgb=rgb)

    def write(self, directory: str | os.PathLike, stem: str) -> list[Path]:
        """The motion files; the persons' 3-D keypoints are set on them for the frame log, written after:
        as fitted (cleaned and smoothed) for the persons captured, as lifted for the others."""
        if self.recorder is None:
            return []
        fitted = {motion.track_id: motion.keypoints for motion in self.recorder.motions()}
        for frame, person in self._persons:
            if person.track_id not in fitted:
                fitted[person.track_id] = self.recorder.points(person.track_id)[0]
            person.keypoints_3d = fitted[person.track_id][frame]
        return self.recorder.write(directory, stem)

    def write_view(self, directory: str | os.PathLike, stem: str) -> Path | None:
        """The page's 3-D view: every skeleton with the first frame standing behind them."""
        if self.recorder is None:
            return None
        recorder = self.recorder
        return write_motion(
            directory,
            stem,
            recorder.motions(),
            self.fps,
            recorder.filmed(),
            recorder.backdrop(),
            VIEWER_SUFFIX,
        )[0]

    @property
    def notes(self) -> list[str]:
        return [] if self.recorder is None else self.recorder.notes()


def motion_suffixes() -> tuple[str, ...]:
    """The file written whatever the persons (the BVH files follow the persons found)."""
    return (MOTION_GLB_SUFFIX,)
