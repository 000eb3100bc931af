"""The pinhole camera a pointmap implies: fx, fy, cx, cy fitted from its points and their pixels."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# About the most points fitted, on an even grid over the photo: two lines of two unknowns each, which a
# quarter of a million points pin down far below a pixel (in a third of the time a million take).
FITTED_POINTS = 250_000


@dataclass(frozen=True)
class Intrinsics:
    """Focal lengths and principal point in pixels, with the fit's root-mean-square reprojection error in
    pixels over the `points` fitted. Pixel (column u, row v) has its centre at (u, v), as in OpenCV."""

    fx: float
    fy: float
    cx: float
    cy: float
    residual: float
    points: int

    def as_dict(self) -> dict:
        return {
            "fx": round(self.fx, 3),
            "fy": round(self.fy, 3),
            "cx": round(self.cx, 3),
            "cy": round(self.cy, 3),
            "residual_px": round(self.residual, 4),
            "points_fitted": self.points,
        }


def points_in_front(planes: np.ndarray, foreground: np.ndarray) -> np.ndarray:
    """(H, W) bool: foreground pixels whose point is finite and in front of the camera (z > 0), from the
    points' x, y and z planes (3, H, W): `np.moveaxis(points, -1, 0)` of points (H, W, 3), or faster, the
    planes of a channels-first map."""
    x, y, z = planes
    usable = np.isfinite(x)
    usable &= np.isfinite(y)
    usable &= z > 0
    usable &= z < np.inf
    usable &= foreground
    return usable


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    """Least-squares slope and intercept of y = slope * x + intercept; None when x does not vary."""
    x_mean, y_mean = x.mean(), y.mean()
    spread = np.square(x - x_mean).sum()
    if not spread > 0:
        return None
    slope = float(((x - x_mean) * (y - y_mean)).sum() / spread)
    return slope, float(y_mean - slope * x_mean)


def fit_intrinsics(points: np.ndarray, foreground: np.ndarray) -> Intrinsics | None:
    """The camera that best projects the foreground points (H, W, 3) onto their pixels, u = fx X/Z + cx and
    v = fy Y/Z + cy, by least squares; None with fewer than 3 usable points or no spread to fit."""
    step = max(1, math.ceil(math.sqrt(int(foreground.sum()) / FITTED_POINTS)))  # a grid over the photo
    rows, columns = np.nonzero(foreground[::step, ::step])
    rows, columns = rows * step, columns * step
    xyz = points[rows, columns].astype(np.float64)
    usable = np.isfinite(xyz).all(axis=1) & (xyz[:, 2] > 0)  # checked on the grid's points only
    rows, columns, xyz = rows[usable], columns[usable], xyz[usable]
    if len(rows) < 3:
        return None
    x, y = xyz[:, 0] / xyz[:, 2], xyz[:, 1] / xyz[:, 2]
    u, v = columns.astype(np.float64), rows.astype(np.float64)
    horizontal, vertical = _line(x, u), _line(y, v)
    if horizontal is None or vertical is None:
        return None
    (fx, cx), (fy, cy) = horizontal, vertical
    residual = float(np.sqrt(np.mean(np.square(fx * x + cx - u) + np.square(fy * y + cy - v))))
    return Intrinsics(fx, fy, cx, cy, residual, len(rows))
