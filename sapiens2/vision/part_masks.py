"""Masks from body-part labels: the union of chosen classes, grown or shrunk by a disc, feathered by a ramp.

Distances are Euclidean, between pixel centres, computed exactly (OpenCV's precise distance transform), so
any radius costs the same. Pixels beyond the photo's edge count as neither in nor out of the mask: a mask
touching the edge is not shrunk from it.
"""

from __future__ import annotations

from collections.abc import Iterable

import cv2
import numpy as np


def union_mask(labels: np.ndarray, class_ids: Iterable[int]) -> np.ndarray:
    """True where the (H, W) class ids are one of `class_ids`."""
    return np.isin(labels, np.fromiter(class_ids, dtype=np.int64))


def _distance_to_nearest(mask: np.ndarray, inside: bool) -> np.ndarray:
    """For each pixel, the distance to the nearest pixel that is in the mask (`inside`) or out of it;
    very large (about 1.8e19) when there is none."""
    targets = mask if inside else ~mask
    return cv2.distanceTransform((~targets).view(np.uint8), cv2.DIST_L2, cv2.DIST_MASK_PRECISE)


def grown(mask: np.ndarray, pixels: float) -> np.ndarray:
    """`mask` grown by a disc of radius `pixels` (a pixel joins when a mask pixel lies within that
    distance); a negative radius shrinks it (a pixel stays when no outside pixel lies within |pixels|)."""
    if pixels > 0:
        return mask | (_distance_to_nearest(mask, inside=True) <= pixels)
    if pixels < 0:
        return mask & (_distance_to_nearest(mask, inside=False) > -pixels)
    return mask


def feathered(mask: np.ndarray, pixels: float) -> np.ndarray:
    """An alpha (H, W) float32 in [0, 1]: `mask`'s edge as a linear ramp `pixels` wide centred on it.

    A pixel whose centre lies t pixels inside the edge (the edge is half a pixel beyond the last mask pixel;
    t is negative outside) gets 0.5 + t / pixels, clipped to 0-1; 0 pixels gives the mask as it is.
    """
    if pixels <= 0:
        return mask.astype(np.float32)
    inside = _distance_to_nearest(mask, inside=False) - 0.5  # for mask pixels: how far in
    outside = _distance_to_nearest(mask, inside=True) - 0.5  # for the others: how far out
    depth = np.where(mask, inside, -outside)
    return np.clip(0.5 + depth / np.float32(pixels), 0.0, 1.0).astype(np.float32, copy=False)


def part_mask(
    labels: np.ndarray, class_ids: Iterable[int], grow: float = 0, feather: float = 0
) -> np.ndarray:
    """The uint8 (H, W) mask (0-255) of the chosen classes: their union, grown (or shrunk, negative) by
    `grow` pixels, then feathered over `feather` pixels."""
    alpha = feathered(grown(union_mask(labels, class_ids), grow), feather)
    return cv2.convertScaleAbs(alpha, alpha=255.0)
