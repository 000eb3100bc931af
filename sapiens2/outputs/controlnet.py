"""The OpenPose drawing that ControlNet's pose models take: body, hands and face on black.

Colours, sizes and the order of drawing are OpenPose's as ControlNet's annotator renders them
(sapiens2/data/openpose_style.json); the points are the 308 keypoints in OpenPose's convention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np

from sapiens2.data.metadata import openpose_style
from sapiens2.vision.keypoint_formats import keypoint_format
from sapiens2.vision.pose_decoding import Person


def _shown(points: np.ndarray, scores: np.ndarray, threshold: float, size: tuple[int, int]) -> np.ndarray:
    """Which points to draw: scored at least `threshold` (and above 0, so never an absent point), finite,
    and not far outside the picture (OpenCV draws with integers)."""
    height, width = size
    finite = np.isfinite(points).all(axis=1)
    safe = np.where(finite[:, None], points, 0.0)
    near = (np.abs(safe[:, 0]) < 4 * width + 1) & (np.abs(safe[:, 1]) < 4 * height + 1)
    return finite & near & (scores >= threshold) & (scores > 0)


def _limb(canvas: np.ndarray, start: np.ndarray, end: np.ndarray, colour: Sequence[int], half_width: int):
    """A limb as OpenPose draws it: a filled ellipse from joint to joint."""
    middle = (start + end) / 2
    length = float(np.hypot(*(start - end)))
    angle = math.degrees(math.atan2(start[1] - end[1], start[0] - end[0]))
    polygon = cv2.ellipse2Poly(
        _pixel(middle), (int(length / 2), half_width), int(angle), 0, 360, 1
    )
    cv2.fillConvexPoly(canvas, polygon, tuple(int(c) for c in colour))


def _pixel(point: np.ndarray) -> tuple[int, int]:
    return int(point[0]), int(point[1])


def _dots(canvas: np.ndarray, points: np.ndarray, radius: int, colours: Sequence[Sequence[int]]) -> None:
    for point, colour in zip(points, colours, strict=True):
        cv2.circle(canvas, _pixel(point), radius, tuple(int(c) for c in colour), thickness=-1)


def openpose_picture(
    image_size: tuple[int, int], persons: Sequence[Person], keypoint_names: Sequence[str], threshold: float
) -> np.ndarray:
    """OpenPose's drawing of `persons` on black, (height, width, 3) uint8 RGB at `image_size` (height,
    width): the 18-joint body, both hands and the face, of the points scored at least `threshold`."""
    height, width = image_size
    canvas = np.zeros((height, width, 3), dtype=np.uint8)
    found = keypoint_format("openpose", keypoint_names)
    style = openpose_style()
    body, hand, face = style["body"], style["hand"], style["face"]
    body_names = found.parts[0].point_names
    joints = [body_names.index(name) for name in body["joints"]]
    limbs = [(body_names.index(a), body_names.index(b)) for a, b in body["limbs"]]
    people = []
    for person in persons:
        parts = found.convert(person.keypoints, person.scores)
        people.append({name: (points, _shown(points, scores, threshold, (height, width)))
                       for name, (points, scores) in parts.items()})  # fmt: skip
    for parts in people:
        points, shown = parts["pose_keypoints_2d"]
        for (a, b), colour in zip(limbs, body["limb_colors"], strict=True):
            if shown[a] and shown[b]:
                _limb(canvas, points[a], points[b], colour, body["limb_half_width"])
    # OpenPose dims the limbs before drawing the joints over them.
    canvas = (canvas * body["limb_brightness"]).astype(np.uint8)
    for parts in people:
        points, shown = parts["pose_keypoints_2d"]
        drawn = [joint for joint in joints if shown[joint]]
        colours = [colour for joint, colour in zip(joints, body["joint_colors"], strict=True) if shown[joint]]
        _dots(canvas, points[drawn], body["joint_radius"], colours)
    for parts in people:
        for side in ("hand_left_keypoints_2d", "hand_right_keypoints_2d"):
            points, shown = parts[side]
            for (a, b), colour in zip(hand["edges"], hand["edge_colors"], strict=True):
                if shown[a] and shown[b]:
                    start, end = (_pixel(points[i]) for i in (a, b))
                    cv2.line(canvas, start, end, tuple(colour), thickness=hand["line_width"])
            _dots(canvas, points[shown], hand["joint_radius"], [hand["joint_color"]] * int(shown.sum()))
        points, shown = parts["face_keypoints_2d"]
        _dots(canvas, points[shown], face["radius"], [face["color"]] * int(shown.sum()))
    return canvas
