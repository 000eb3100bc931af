"""Motion capture over a video: each frame's tracked persons lifted into 3-D from the frame's pointmap,
then every person's motion fitted and written (a BVH per person, one animated GLB of them all)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sapiens2.outputs.bvh import write_bvh
from sapiens2.outputs.motion_gltf import Backdrop, Filmed, write_motion
from sapiens2.vision.intrinsics import Intrinsics
from sapiens2.vision.lifting import camera_of, insets, keypoint_depths, lift, nan_median, own_depths
from sapiens2.vision.motion_fit import Motion, fit_motion

CAMERA_FRAMES = 5  # frames whose pointmaps the (static) camera is fitted from
MIN_SHARE = 0.2  # a person seen in fewer of the frames (and fewer than MIN_FRAMES) is left out
MIN_FRAMES = 5


@dataclass
class _Track:
    frames: list[int] = field(default_factory=list)
    keypoints: list[np.ndarray] = field(default_factory=list)
    depths: list[np.ndarray] = field(default_factory=list)
    scores: list[np.ndarray] = field(default_factory=list)


class MotionRecorder:
    """Frames in order: `add` each frame's persons (keypoints (P, K, 2) in pixels, scores (P, K), track ids
    (P,)) with its pointmap (H, W, 3, metres, the camera's x right, y down, z forward) and the persons' mask
    if known; then `motions()` fits every person, `write` writes the files. `fps`: frames a second of the
    frames added (the video's rate over the stride); `threshold`: the keypoint score trusted."""

    def __init__(self, keypoint_names: tuple[str, ...], fps: float, threshold: float) -> None:
        self.names = tuple(keypoint_names)
        self.fps = fps
        self.threshold = threshold
        self.frames = 0
        self.tracks: dict[int, _Track] = {}
        self.cameras: list[Intrinsics] = []
        self.first_frame: np.ndarray | None = None
        self.frame_size: tuple[int, int] | None = None  # (height, width): the pointmaps', the frames' own
        self.seconds = 0.0  # CPU seconds spent in add and motions (the cost per person and frame)
        self.person_frames = 0
        self._motions: list[Motion] | None = None

    def add(
        self,
        keypoints: np.ndarray,
        scores: np.ndarray,
        track_ids: np.ndarray,
        pointmap: np.ndarray,
        mask: np.ndarray | None = None,
        rgb: np.ndarray | None = None,
    ) -> None:
        """Record one frame (`rgb`, the frame itself, kept for the first frame's picture)."""
        start = time.thread_time()
        if self.first_frame is None and rgb is not None:
            self.first_frame = rgb
        if self.frame_size is None:
            self.frame_size = pointmap.shape[:2]
        if len(self.cameras) < CAMERA_FRAMES:
            camera = camera_of(pointmap)
            if camera is not None:
                self.cameras.append(camera)
        keypoints = np.asarray(keypoints, dtype=np.float64).reshape(-1, len(self.names), 2)
        if len(keypoints):
            scores = np.asarray(scores, dtype=np.float64).reshape(len(keypoints), -1)
            depths = own_depths(keypoint_depths(keypoints, pointmap, mask), scores >= self.threshold)
            # A point without a depth (outside the frame, or no surface there) gets its person's median
            # depth, untrusted (its score zeroed): a person is placed if any of it is.
            fallback = nan_median(depths, axis=-1)[:, None]
            missing = np.isnan(depths)
            depths = np.where(missing, fallback, depths)
            scores = np.where(missing, 0.0, scores)
            for person, track_id in enumerate(np.asarray(track_ids).reshape(-1)):
                track = self.tracks.setdefault(int(track_id), _Track())
                track.frames.append(self.frames)
                track.keypoints.append(keypoints[person])
                track.depths.append(depths[person])
                track.scores.append(scores[person])
        self.frames += 1
        self.person_frames += len(keypoints)
        self._motions = None
        self.seconds += time.thread_time() - start

    @property
    def camera(self) -> Intrinsics | None:
        """The static camera: the median of the frames' fits."""
        if not self.cameras:
            return None
        values = np.median([[c.fx, c.fy, c.cx, c.cy, c.residual] for c in self.cameras], axis=0)
        return Intrinsics(*map(float, values), points=min(c.points for c in self.cameras))

    def points(self, track_id: int) -> tuple[np.ndarray, np.ndarray]:
        """A person's lifted keypoints (T, K, 3) over all the frames (NaN where not seen or no depth) and
        which of them to trust (T, K)."""
        track, camera = self.tracks[track_id], self.camera
        points = np.full((self.frames, len(self.names), 3), np.nan)
        trusted = np.zeros((self.frames, len(self.names)), dtype=bool)
        if camera is None or not track.frames:
            return points, trusted
        frames = np.array(track.frames)
        depths = np.array(track.depths)
        points[frames] = lift(np.array(track.keypoints), depths, camera, insets(self.names))
        trusted[frames] = (np.array(track.scores) >= self.threshold) & np.isfinite(depths)
        return points, trusted

    def motions(self) -> list[Motion]:
        """Every person seen long enough, fitted, in the order of their ids."""
        if self._motions is None:
            start = time.thread_time()
            least = min(MIN_FRAMES, max(1, int(MIN_SHARE * self.frames)))
            fitted = []
            for track_id in sorted(self.tracks):
                if len(self.tracks[track_id].frames) < least:
                    continue
                points, trusted = self.points(track_id)
                seen = np.zeros(self.frames, dtype=bool)
                seen[self.tracks[track_id].frames] = True
                motion = fit_motion(track_id, points, trusted, self.names, self.fps, seen)
                if motion is not None:
                    fitted.append(motion)
            self._motions = fitted
            self.seconds += time.thread_time() - start
        return self._motions

    @property
    def ms_per_person_frame(self) -> float:
        """CPU milliseconds spent after the models, per person and frame (this thread's time: a loaded
        machine does not inflate it)."""
        return 1000 * self.seconds / max(1, self.person_frames)

    def filmed(self) -> Filmed | None:
        """The camera fitted to the first frames, with the frames' size."""
        camera = self.camera
        if self.frame_size is None or camera is None:
            return None
        height, width = self.frame_size
        return Filmed(camera, width, height)

    def backdrop(self) -> Backdrop | None:
        """The first frame where the camera saw it, behind every person."""
        camera = self.camera
        if self.first_frame is None or camera is None:
            return None
        depths = [-motion.root[:, 2].min() for motion in self.motions()]
        return Backdrop(self.first_frame, camera, 1.5 * max(depths, default=3.0) + 0.5)

    def write(self, directory: str | os.PathLike, stem: str) -> list[Path]:
        """`{stem}_motion.glb` (every person) and `{stem}_motion_{id}.bvh` per person."""
        motions = self.motions()
        written = write_motion(directory, stem, motions, self.fps, self.filmed())
        for motion in motions:
            written += write_bvh(directory, stem, motion)
        return written

    def notes(self) -> list[str]:
        """What the user should know about the motion files."""
        if self.camera is None:
            return ["Motion: no frame's pointmap had points to fit the camera from, so no person was placed."]
        count = len(self.motions())
        if count == 0:
            return ["Motion: no person was tracked long enough to fit a skeleton to."]
        return [
            f"Motion: {count} person{'s' * (count != 1)} as animated skeletons "
            f"({self.ms_per_person_frame:.1f} ms per person and frame after the models)."
        ]
