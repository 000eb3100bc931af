"""Keypoints lifted into 3-D from a pointmap: each keypoint's depth read off the pixels around it (the
nearest surface there, by a median, never the background behind an edge), then moved in from skin to joint."""

from __future__ import annotations

import numpy as np

from sapiens2.vision.intrinsics import Intrinsics, fit_intrinsics, points_in_front

WINDOW_SAMPLES = 3  # samples each side of the keypoint, at most
NEAR_BAND = 0.08  # metres behind the nearest samples still counted as the same surface
FAR_FROM_PERSON = 0.8  # metres from the person's median depth beyond which a point is someone else's
# How far a joint's centre lies behind the skin the pointmap sees, in metres, by keypoint name; the face,
# the ears and the elbow's landmarks are on the skin.
INSETS = {
    "hip": 0.08,
    "shoulder": 0.05,
    "neck": 0.05,
    "elbow": 0.035,
    "knee": 0.05,
    "ankle": 0.035,
    "wrist": 0.025,
    "heel": 0.02,
    "toe": 0.015,
}
HAND_INSET = 0.01
HAND_WORDS = ("thumb", "finger")


def insets(names: tuple[str, ...]) -> np.ndarray:
    """(K,) metres from the skin to the joint for each keypoint name."""

    def inset(name: str) -> float:
        if any(word in name for word in HAND_WORDS):
            return HAND_INSET
        if name.startswith(("left_", "right_")):
            part = name.split("_", 1)[1]
            if part in ("big_toe", "small_toe"):
                return INSETS["toe"]
            return INSETS.get(part, 0.0)
        return INSETS.get(name, 0.0)

    return np.array([inset(name) for name in names])


def nan_median(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """The median along `axis` of the values that are not NaN (NaN where all are): a sort, several times
    faster than numpy's nanmedian on many short rows."""
    ordered = np.sort(np.moveaxis(values, axis, -1), axis=-1)  # NaN sorts last
    count = np.sum(~np.isnan(ordered), axis=-1, keepdims=True)
    low = np.take_along_axis(ordered, np.maximum(count - 1, 0) // 2, axis=-1)
    high = np.take_along_axis(ordered, np.minimum(count // 2, ordered.shape[-1] - 1), axis=-1)
    return np.where(count > 0, (low + high) / 2, np.nan)[..., 0]


def window_for(height: int, width: int) -> int:
    """Half the side of the square of pixels read around a keypoint: 0.4 % of the frame's longer side."""
    return max(1, round(0.004 * max(height, width)))


def keypoint_depths(
    keypoints: np.ndarray, pointmap: np.ndarray, mask: np.ndarray | None = None, half: int | None = None
) -> np.ndarray:
    """Depth (P, K) in metres along the camera's axis of keypoints (P, K, 2) in pixels, from a pointmap
    (H, W, 3) in the camera's frame (x right, y down, z forward): the median of the nearest surface among
    the pixels around each keypoint (only those in `mask`, the persons' pixels, when given); NaN where no
    pixel there has a point in front of the camera."""
    height, width = pointmap.shape[:2]
    half = window_for(height, width) if half is None else half
    shape = keypoints.shape[:-1]
    flat = keypoints.reshape(-1, 2)
    finite = np.isfinite(flat).all(axis=1)
    centre = np.where(finite[:, None], np.rint(flat), -10 * half - 10).astype(np.int64)
    steps = np.arange(-half, half + 1, max(1, half // WINDOW_SAMPLES))  # at most 7 x 7 samples
    rows = centre[:, 1, None, None] + steps[None, :, None]
    columns = centre[:, 0, None, None] + steps[None, None, :]
    rows, columns = np.broadcast_arrays(rows, columns)
    rows, columns = rows.reshape(len(flat), -1), columns.reshape(len(flat), -1)
    inside = (rows >= 0) & (rows < height) & (columns >= 0) & (columns < width)
    rows, columns = np.clip(rows, 0, height - 1), np.clip(columns, 0, width - 1)
    z = pointmap[rows, columns, 2].astype(np.float64)
    usable = inside & np.isfinite(z) & (z > 0)
    if mask is not None:
        usable &= mask[rows, columns]
    z = np.where(usable, z, np.nan)
    with np.errstate(all="ignore"):
        nearest = np.min(np.where(usable, z, np.inf), axis=1)
        near = usable & (z <= nearest[:, None] + NEAR_BAND)
        depth = nan_median(np.where(near, z, np.nan), axis=1)
    return depth.reshape(shape)


def own_depths(depths: np.ndarray, confident: np.ndarray) -> np.ndarray:
    """Depths (P, K) without those far from their person's median depth over its `confident` (P, K)
    keypoints (another person's surface in front of an occluded keypoint, or the background behind it)."""
    median = nan_median(np.where(confident, depths, np.nan), axis=-1)[..., None]
    return np.where(np.abs(depths - median) <= FAR_FROM_PERSON, depths, np.nan)


def camera_of(pointmap: np.ndarray, step: int = 4) -> Intrinsics | None:
    """The pinhole camera a pointmap (H, W, 3) implies, fitted on every `step`-th pixel."""
    coarse = np.ascontiguousarray(pointmap[::step, ::step])
    usable = points_in_front(np.moveaxis(coarse, -1, 0), np.ones(coarse.shape[:2], dtype=bool))
    fitted = fit_intrinsics(coarse, usable)
    if fitted is None:
        return None
    return Intrinsics(
        fitted.fx * step,
        fitted.fy * step,
        fitted.cx * step,
        fitted.cy * step,
        fitted.residual * step,
        fitted.points,
    )


def lift(keypoints: np.ndarray, depths: np.ndarray, camera: Intrinsics, inset: np.ndarray) -> np.ndarray:
    """3-D joints (..., 3) in metres, Y up (x right, y up, z towards the viewer, the camera at the origin),
    of keypoints (..., 2) in pixels at skin depths (...): each on its pixel's ray, `inset` (K,) beyond."""
    x = (keypoints[..., 0] - camera.cx) / camera.fx
    y = (keypoints[..., 1] - camera.cy) / camera.fy
    ray = np.stack([x, y, np.ones_like(x)], axis=-1)
    length = np.linalg.norm(ray, axis=-1)
    points = ray * (depths + inset / length)[..., None]  # `inset` further along the ray
    return points * np.array([1.0, -1.0, -1.0])
