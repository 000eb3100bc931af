"""Rotations as (..., 3, 3) matrices acting on column vectors: frames from two directions, Euler angles in
BVH's Z-X-Y order, unit quaternions (x, y, z, w) as glTF stores them."""

from __future__ import annotations

import numpy as np

TINY = 1e-9


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Vectors (..., 3) scaled to unit length; zero vectors stay zero."""
    length = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.divide(vectors, length, out=np.zeros_like(vectors), where=length > TINY)


def frame(primary: np.ndarray, secondary: np.ndarray) -> np.ndarray:
    """(..., 3, 3) orthonormal frames whose first column is `primary`'s direction and whose second lies in
    the plane of `primary` and `secondary`, on `secondary`'s side (both (..., 3), not parallel)."""
    first = normalized(primary)
    second = normalized(secondary - np.sum(secondary * first, axis=-1, keepdims=True) * first)
    return np.stack([first, second, np.cross(first, second)], axis=-1)


def euler_zxy(rotations: np.ndarray) -> np.ndarray:
    """Degrees (..., 3) as (z, x, y) such that R = Rz(z) Rx(x) Ry(y): BVH's "Zrotation Xrotation Yrotation"
    channels."""
    r = rotations
    x = np.arcsin(np.clip(r[..., 2, 1], -1.0, 1.0))
    z = np.arctan2(-r[..., 0, 1], r[..., 1, 1])
    y = np.arctan2(-r[..., 2, 0], r[..., 2, 2])
    return np.degrees(np.stack([z, x, y], axis=-1))


def from_euler_zxy(degrees: np.ndarray) -> np.ndarray:
    """The rotations (..., 3, 3) Rz(z) Rx(x) Ry(y) of angles (..., 3) given as (z, x, y) in degrees."""
    z, x, y = np.moveaxis(np.radians(degrees), -1, 0)
    return _axis(z, 2) @ _axis(x, 0) @ _axis(y, 1)


def _axis(angle: np.ndarray, axis: int) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    out = np.zeros((*np.shape(angle), 3, 3))
    i, j = [(1, 2), (2, 0), (0, 1)][axis]
    out[..., axis, axis] = 1.0
    out[..., i, i] = c
    out[..., j, j] = c
    out[..., i, j] = -s
    out[..., j, i] = s
    return out


def unwrapped(degrees: np.ndarray) -> np.ndarray:
    """Angles (T, ...) in degrees made continuous along time (no 360-degree jumps between frames)."""
    return np.degrees(np.unwrap(np.radians(degrees), axis=0))


def quaternions(rotations: np.ndarray) -> np.ndarray:
    """Unit quaternions (..., 4) as (x, y, z, w) of rotation matrices (..., 3, 3), w >= 0 for the first and
    each one on the same side as the one before along the first axis (no sign flips in an animation)."""
    r = rotations
    trace = r[..., 0, 0] + r[..., 1, 1] + r[..., 2, 2]
    candidates = np.stack(
        [
            np.stack(
                [
                    r[..., 2, 1] - r[..., 1, 2],
                    r[..., 0, 2] - r[..., 2, 0],
                    r[..., 1, 0] - r[..., 0, 1],
                    1 + trace,
                ],
                axis=-1,
            ),
            np.stack(
                [
                    1 + r[..., 0, 0] - r[..., 1, 1] - r[..., 2, 2],
                    r[..., 0, 1] + r[..., 1, 0],
                    r[..., 0, 2] + r[..., 2, 0],
                    r[..., 2, 1] - r[..., 1, 2],
                ],
                axis=-1,
            ),
            np.stack(
                [
                    r[..., 0, 1] + r[..., 1, 0],
                    1 + r[..., 1, 1] - r[..., 0, 0] - r[..., 2, 2],
                    r[..., 1, 2] + r[..., 2, 1],
                    r[..., 0, 2] - r[..., 2, 0],
                ],
                axis=-1,
            ),
            np.stack(
                [
                    r[..., 0, 2] + r[..., 2, 0],
                    r[..., 1, 2] + r[..., 2, 1],
                    1 + r[..., 2, 2] - r[..., 0, 0] - r[..., 1, 1],
                    r[..., 1, 0] - r[..., 0, 1],
                ],
                axis=-1,
            ),
        ],
        axis=-2,
    )
    # The candidate with the largest norm is the best conditioned one.
    best = np.argmax(np.linalg.norm(candidates, axis=-1), axis=-1)
    q = np.take_along_axis(candidates, best[..., None, None], axis=-2)[..., 0, :]
    q = normalized_quaternions(q)
    if q.ndim >= 2 and len(q) > 1:
        for t in range(1, len(q)):
            flip = np.sum(q[t] * q[t - 1], axis=-1) < 0
            q[t][flip] *= -1
    else:
        q = np.where(q[..., 3:] < 0, -q, q)
    return q


def normalized_quaternions(q: np.ndarray) -> np.ndarray:
    """Quaternions (..., 4) scaled to unit length; a zero one becomes the identity."""
    length = np.linalg.norm(q, axis=-1, keepdims=True)
    identity = np.zeros_like(q)
    identity[..., 3] = 1.0
    return np.where(length > TINY, q / np.maximum(length, TINY), identity)
