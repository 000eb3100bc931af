"""The pinhole camera a pointmap implies: fx, fy, cx, cy fitted from its points and their pixels."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FITTED_POINTS = 1_000_000  # about the most points fitted, on an even grid over the photo


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
    valid = foreground & np.isfinite(points).all(axis=2) & (points[..., 2] > 0)
    step = max(1, math.ceil(math.sqrt(int(valid.sum()) / FITTED_POINTS)))  # a grid over the photo
    rows, columns = np.nonzero(valid[::step, ::step])
    rows, columns = rows * step, columns * step
    if len(rows) < 3:
        return None
    xyz = points[rows, columns].astype(np.float64)
    x, y = xyz[:, 0] / xyz[:, 2], xyz[:, 1] / xyz[:, 2]
    u, v = columns.astype(np.float64), rows.astype(np.float64)
    horizontal, vertical = _line(x, u), _line(y, v)
    if horizontal is None or vertical is None:
        return None
    (fx, cx), (fy, cy) = horizontal, vertical
    residual = float(np.sqrt(np.mean(np.square(fx * x + cx - u) + np.square(fy * y + cy - v))))
    return Intrinsics(fx, fy, cx, cy, residual, len(rows))
