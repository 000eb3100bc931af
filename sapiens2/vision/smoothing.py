"""Keypoint smoothing over time: a One-Euro filter (Casiez, Roussel and Vogel, CHI 2012) per keypoint.

The filter is a low-pass whose cut-off frequency rises with the keypoint's speed: a still point is smoothed
hard (no jitter), a fast one lightly (little lag). Speeds are measured in person sizes per second (the
larger side of the person's box), so the same parameters suit any frame size.
"""

from __future__ import annotations

import math

import numpy as np

DEFAULT_MIN_CUTOFF = 1.0  # Hz: the cut-off of a still keypoint
DEFAULT_BETA = 5.0  # added cut-off (Hz) per person size per second of speed
DERIVATIVE_CUTOFF = 1.0  # Hz: the cut-off of the speed estimate itself


def smoothing_factor(cutoff: np.ndarray | float, dt: float) -> np.ndarray | float:
    """The weight of a new sample in an exponential low-pass of cut-off `cutoff` Hz sampled every `dt` s."""
    tau = 1.0 / (2 * math.pi * np.asarray(cutoff))
    return 1.0 / (1.0 + tau / dt)


class KeypointFilter:
    """A One-Euro filter over the (K, 2) keypoints of one person.

    A keypoint whose score is below the threshold is passed through as it is and forgotten: when it is seen
    again the filter starts from there, instead of dragging it from where it was last seen.
    """

    def __init__(self, min_cutoff: float = DEFAULT_MIN_CUTOFF, beta: float = DEFAULT_BETA):
        if min_cutoff <= 0 or beta < 0:
            raise ValueError(f"min_cutoff must be positive and beta not negative, got {min_cutoff}, {beta}")
        self.min_cutoff = min_cutoff
        self.beta = beta
        self._points: np.ndarray | None = None  # (K, 2) the filtered positions
        self._speeds: np.ndarray | None = None  # (K, 2) the filtered velocities, person sizes per second
        self._known: np.ndarray | None = None  # (K,) which keypoints the filter holds a position of

    def __call__(self, points: np.ndarray, confident: np.ndarray, dt: float, size: float) -> np.ndarray:
        """The filtered (K, 2) positions of `points` seen `dt` seconds after the previous call; `confident`
        (K,) marks the keypoints at or above the threshold, `size` is the person's size in pixels."""
        points = np.asarray(points, dtype=np.float64)
        confident = np.asarray(confident, dtype=bool) & np.isfinite(points).all(axis=1)
        if self._points is None or self._points.shape != points.shape or dt <= 0:
            self._start(points, confident)
            return points.copy()
        size = max(float(size), 1.0)
        speeds = (points - self._points) / (dt * size)
        speeds = self._speeds + smoothing_factor(DERIVATIVE_CUTOFF, dt) * (speeds - self._speeds)
        cutoff = self.min_cutoff + self.beta * np.linalg.norm(speeds, axis=1)
        weight = smoothing_factor(cutoff, dt)[:, None]
        smoothed = self._points + weight * (points - self._points)
        carried = confident & self._known
        output = np.where(carried[:, None], smoothed, points)
        self._points = np.where(confident[:, None], output, self._points)
        self._speeds = np.where(carried[:, None], speeds, 0.0)
        self._known = confident
        return output

    def _start(self, points: np.ndarray, confident: np.ndarray) -> None:
        self._points = np.where(np.isfinite(points), points, 0.0)
        self._speeds = np.zeros_like(self._points)
        self._known = confident.copy()
