"""Pose targets: keypoints in a person crop to Gaussian heatmaps with the official UDP encoding.

The inverse is `vision.pose_decoding.decode_keypoints` (arg-max + DARK refinement), which maps heatmap
cell j to crop pixel j * (input - 1) / (heatmap - 1): the same unbiased (UDP) correspondence as here.
"""

from __future__ import annotations

import numpy as np

# Official Gaussian sigma of 256x192 heatmaps (1024x768 inputs); other sizes scale it with the heatmap height.
OFFICIAL_SIGMA = 6.0
OFFICIAL_HEATMAP_HEIGHT = 256


def default_sigma(heatmap_size: tuple[int, int]) -> float:
    """The official sigma scaled to a heatmap of (height, width), at least 1 cell."""
    return max(1.0, OFFICIAL_SIGMA * heatmap_size[0] / OFFICIAL_HEATMAP_HEIGHT)


def encode_heatmaps(
    keypoints: np.ndarray,
    visible: np.ndarray,
    input_size: tuple[int, int],
    heatmap_size: tuple[int, int],
    sigma: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Heatmaps (K, h, w) float32 and weights (K,) for keypoints (K, 2) x, y in crop pixels.

    Each labelled keypoint becomes exp(-d^2 / (2 sigma^2)) around its exact position in heatmap cells,
    cut to the cells within 3 sigma of its nearest cell; its weight is its `visible` value, 0 when it is not
    labelled (visible < 0.5) or its window lies outside the heatmap.
    """
    height, width = heatmap_size
    scale = np.array(
        [(input_size[1] - 1) / (width - 1), (input_size[0] - 1) / (height - 1)], dtype=np.float32
    )
    points = keypoints.astype(np.float32) / scale
    radius = 3 * sigma
    nearest = np.floor(points + 0.5)
    inside = (
        (nearest[:, 0] - radius < width)
        & (nearest[:, 1] - radius < height)
        & (nearest[:, 0] + radius + 1 >= 0)
        & (nearest[:, 1] + radius + 1 >= 0)
    )
    weights = np.where((visible >= 0.5) & inside, visible, 0).astype(np.float32)
    xs = np.arange(width, dtype=np.float32)
    ys = np.arange(height, dtype=np.float32)
    along_x = np.exp(-((xs - points[:, :1]) ** 2) / (2 * sigma**2)) * (np.abs(xs - nearest[:, :1]) <= radius)
    along_y = np.exp(-((ys - points[:, 1:]) ** 2) / (2 * sigma**2)) * (np.abs(ys - nearest[:, 1:]) <= radius)
    heatmaps = along_y[:, :, None] * along_x[:, None, :] * (weights > 0)[:, None, None]
    return heatmaps.astype(np.float32), weights
