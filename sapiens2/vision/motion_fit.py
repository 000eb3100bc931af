"""A person's 3-D keypoints over a clip fitted to the motion skeleton: gaps filled, outliers dropped and the
points smoothed over time, then bone lengths fixed per person and every joint's rotation solved per frame."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sapiens2.vision.lifting import nan_median
from sapiens2.vision.rig import (
    JOINT_NAMES,
    JOINTS,
    LIMBS,
    PARENTS,
    Points,
    keypoint_groups,
    template_offsets,
)
from sapiens2.vision.rotations import TINY, frame, normalized

SMOOTHING_SECONDS = 0.04  # the Gaussian's sigma over time
OUTLIER_METRES = 0.15  # a point this far from its running median is dropped (another person's depth)
OUTLIER_FRAMES = 7  # the running median's length
# Metres: how far a joint's reading may lie nearer than the joint (little: noise) or farther (much: whatever
# hides the joint is in front of it), and the error of a bone's length.
NEARER_ERROR, FARTHER_ERROR, LENGTH_ERROR = 0.02, 0.08, 0.012
SEARCH_METRES = 0.4  # how much farther than its reading a limb's point may move


@dataclass
class Motion:
    """One person's animation: joint names and parents (-1: the root), rest offsets (J, 3) from each joint's
        parent in metres (the root's: zero), the root's position (T, 3), each joint's rotation relative to its
        parent (T, J, 3, 3), and which frames the person was seen in (T,) bool, at `fps` frames a second; with
    the keypoints (T, K, 3) it was fitted to, outliers dropped, gaps filled and smoothed (NaN: never seen).
        Axes: X right, Y up, Z towards the camera (the camera at the origin); the rest pose faces +Z."""

    track_id: int
    names: tuple[str, ...]
    parents: tuple[int, ...]
    ends: tuple[bool, ...]
    offsets: np.ndarray
    root: np.ndarray
    local: np.ndarray
    seen: np.ndarray
    fps: float
    keypoints: np.ndarray | None = None  # (T, K, 3): the keypoints fitted, cleaned and smoothed

    @property
    def frames(self) -> int:
        return len(self.root)

    def world(self) -> tuple[np.ndarray, np.ndarray]:
        """Every joint's position (T, J, 3) and rotation (T, J, 3, 3) in the world, by forward kinematics."""
        frames, count = self.local.shape[:2]
        positions = np.zeros((frames, count, 3))
        rotations = np.zeros((frames, count, 3, 3))
        for j, parent in enumerate(self.parents):
            if parent < 0:
                positions[:, j], rotations[:, j] = self.root, self.local[:, j]
            else:
                rotations[:, j] = rotations[:, parent] @ self.local[:, j]
                positions[:, j] = positions[:, parent] + rotations[:, parent] @ self.offsets[j]
        return positions, rotations

    def bone_lengths(self) -> dict[str, float]:
        """Each joint's distance from its parent, by the joint's name."""
        return {
            n: float(np.linalg.norm(o))
            for n, o, p in zip(self.names, self.offsets, self.parents, strict=True)
            if p >= 0
        }


def fill_over_time(points: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Points (T, K, 3) with the invalid ones (T, K) replaced by linear interpolation between valid frames
    (held at the ends); a keypoint never valid stays NaN."""
    out = np.full_like(points, np.nan)
    times = np.arange(len(points))
    for k in range(points.shape[1]):
        known = valid[:, k]
        if known.any():
            for axis in range(3):
                out[:, k, axis] = np.interp(times, times[known], points[known, k, axis])
    return out


def drop_outliers(points: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """`valid` (T, K) without the points farther than OUTLIER_METRES from their running median over time
    (a keypoint whose depth was read off whoever stands in front of it)."""
    frames = len(points)
    if frames < 3:
        return valid
    half = OUTLIER_FRAMES // 2
    masked = np.where(valid[..., None], points, np.nan)
    padded = np.pad(masked, ((half, half), (0, 0), (0, 0)), mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, OUTLIER_FRAMES, axis=0)
    median = nan_median(windows, axis=-1)
    far = np.linalg.norm(points - median, axis=-1) > OUTLIER_METRES
    return valid & ~(far & np.isfinite(median).all(axis=-1))


def smooth_over_time(points: np.ndarray, sigma_frames: float) -> np.ndarray:
    """Points (T, ...) smoothed by a Gaussian of `sigma_frames` along time; NaN stays NaN."""
    if sigma_frames < 0.3 or len(points) < 3:
        return points
    radius = int(np.ceil(3 * sigma_frames))
    kernel = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma_frames) ** 2)
    kernel /= kernel.sum()
    widths = [(radius, radius)] + [(0, 0)] * (points.ndim - 1)
    # Mirrored through the end values (odd reflection): a steady motion keeps its pace up to the last frame.
    padded = np.pad(points, widths, mode="reflect", reflect_type="odd")
    if len(points) <= radius:  # a reflection needs more frames than the radius: repeat the edges
        padded = np.pad(points, widths, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, len(kernel), axis=0)
    return windows @ kernel


def limbs_on_rays(points: np.ndarray, trusted: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """Points (T, K, 3) with each limb's elbow and wrist (or knee and ankle) moved along their own rays from
    the camera (the origin; a pixel is more certain than a depth) to the depths that best keep the limb's
    bone lengths (medians over the `trusted` frames) and their own readings. A reading too near (a forearm
    or a hand in front of the joint) costs more than one too far, since whatever hides a joint is nearer."""
    index = {name: i for i, name in enumerate(names)}
    out = points.copy()
    for chain in LIMBS:
        if not all(name in index for name in chain):
            continue
        top, middle, end = (index[name] for name in chain)
        upper, lower = _length(points, trusted, top, middle), _length(points, trusted, middle, end)
        if upper is None or lower is None:
            continue
        out[:, middle], out[:, end] = _limb_on_rays(out[:, top], out[:, middle], out[:, end], upper, lower)
    return out


def _length(points: np.ndarray, trusted: np.ndarray, a: int, b: int) -> float | None:
    both = trusted[:, a] & trusted[:, b]
    return (
        float(np.median(np.linalg.norm(points[both, b] - points[both, a], axis=-1))) if both.any() else None
    )


def _reading_cost(moved: np.ndarray) -> np.ndarray:
    """The cost of moving a point `moved` metres farther along its ray than its reading (negative: nearer)."""
    return (moved / np.where(moved > 0, FARTHER_ERROR, NEARER_ERROR)) ** 2


def _limb_on_rays(
    top: np.ndarray, middle: np.ndarray, end: np.ndarray, upper: float, lower: float
) -> tuple[np.ndarray, np.ndarray]:
    """The middle and end points (T, 3) of limbs moved along their rays: a search over both depths."""
    d1, d2 = np.linalg.norm(middle, axis=-1), np.linalg.norm(end, axis=-1)
    usable = np.isfinite(top).all(-1) & np.isfinite(d1) & np.isfinite(d2) & (d1 > TINY) & (d2 > TINY)
    if not usable.any():
        return middle, end
    r1 = middle[usable] / d1[usable, None]
    r2 = end[usable] / d2[usable, None]
    anchor = top[usable]
    best1, best2 = np.zeros(len(r1)), np.zeros(len(r1))
    for low, high, count in ((-0.1, SEARCH_METRES, 51), (-0.012, 0.012, 25)):
        steps = np.linspace(low, high, count)
        m1 = best1[:, None] + steps[None]  # (T, C): metres farther than the reading
        m2 = best2[:, None] + steps[None]
        e = (d1[usable, None] + m1)[..., None] * r1[:, None]  # (T, C, 3)
        w = (d2[usable, None] + m2)[..., None] * r2[:, None]
        cost = (
            _reading_cost(m1)[:, :, None]
            + _reading_cost(m2)[:, None, :]
            + ((np.linalg.norm(e - anchor[:, None], axis=-1) - upper) / LENGTH_ERROR)[:, :, None] ** 2
            + ((np.linalg.norm(w[:, None] - e[:, :, None], axis=-1) - lower) / LENGTH_ERROR) ** 2
        )
        flat = np.argmin(cost.reshape(len(r1), -1), axis=1)
        best1 = np.take_along_axis(m1, (flat // count)[:, None], 1)[:, 0]
        best2 = np.take_along_axis(m2, (flat % count)[:, None], 1)[:, 0]
    middle, end = middle.copy(), end.copy()
    middle[usable] = (d1[usable] + best1)[:, None] * r1
    end[usable] = (d2[usable] + best2)[:, None] * r2
    return middle, end


def fit_motion(
    track_id: int,
    points: np.ndarray,
    confident: np.ndarray,
    names: tuple[str, ...],
    fps: float,
    seen: np.ndarray | None = None,
) -> Motion | None:
    """The motion of one person from its 3-D keypoints (T, K, 3) in the Y-up camera frame (NaN where none),
    `confident` (T, K) marking the ones to trust, the keypoints' `names`, at `fps`; None when the hips are
    never placed (nothing to anchor the skeleton)."""
    frames = len(points)
    readable = np.isfinite(points).all(axis=-1)
    # A keypoint never confident is taken as it was read, rather than left out (a poorly seen person).
    confident = np.where(confident.any(axis=0), confident, readable)
    trusted = drop_outliers(points, confident & readable)
    filled = smooth_over_time(fill_over_time(points, trusted), SMOOTHING_SECONDS * fps)
    filled = limbs_on_rays(filled, trusted, names)
    groups = keypoint_groups(names)

    def mean_of(group: Points) -> np.ndarray:
        if not group or group not in groups:
            return np.full((frames, 3), np.nan)
        return filled[:, groups[group]].mean(axis=1)

    placed = np.stack([mean_of(joint.at) for joint in JOINTS], axis=1)  # (T, J, 3)
    if not np.isfinite(placed[:, 0]).all():
        return None
    rotations = np.zeros((frames, len(JOINTS), 3, 3))
    for j, joint in enumerate(JOINTS):
        parent = np.eye(3)[None].repeat(frames, 0) if PARENTS[j] < 0 else rotations[:, PARENTS[j]]
        rotations[:, j] = _rotation(joint, parent, mean_of)
    offsets = _offsets(placed, rotations)
    local = rotations.copy()
    for j, parent in enumerate(PARENTS):
        if parent >= 0:
            local[:, j] = np.swapaxes(rotations[:, parent], -1, -2) @ rotations[:, j]
    return Motion(
        track_id=track_id,
        names=JOINT_NAMES,
        parents=PARENTS,
        ends=tuple(joint.end for joint in JOINTS),
        offsets=offsets,
        root=placed[:, 0],
        local=local,
        seen=np.ones(frames, dtype=bool) if seen is None else np.asarray(seen, dtype=bool),
        fps=fps,
        keypoints=filled,
    )


def _rotation(joint, parent: np.ndarray, mean_of) -> np.ndarray:
    """The joint's rotation in the world (T, 3, 3): its aim and twist from the keypoints where they are
    known, else the parent's rotation carried on."""
    if joint.aim is None:
        return parent
    aim = mean_of(joint.aim[1]) - mean_of(joint.aim[0])
    rest_aim = np.array(joint.rest_aim)
    rest_twist = np.array(joint.rest_twist) if joint.rest_twist is not None else _perpendicular(rest_aim)
    carried = parent @ rest_twist  # the parent's twist, carried on
    twist = carried
    if joint.twist is not None:
        seen = mean_of(joint.twist[1]) - mean_of(joint.twist[0])
        across = np.linalg.norm(np.cross(normalized(aim), normalized(seen)), axis=-1)
        usable = np.isfinite(seen).all(axis=-1) & (across > 0.3)  # not along the bone
        twist = np.where(usable[:, None], seen, carried)
    aim_known = np.isfinite(aim).all(axis=-1) & (np.linalg.norm(np.nan_to_num(aim), axis=-1) > TINY)
    across = np.linalg.norm(np.cross(normalized(np.nan_to_num(aim)), normalized(twist)), axis=-1)
    twist = np.where((across > 1e-3)[:, None], twist, parent @ _perpendicular(rest_aim, rest_twist))
    turned = frame(np.nan_to_num(aim), twist) @ frame(rest_aim, rest_twist).T
    return np.where(aim_known[:, None, None], turned, parent)


def _perpendicular(axis: np.ndarray, avoid: np.ndarray | None = None) -> np.ndarray:
    """A unit vector perpendicular to `axis` (and to `avoid`, when given)."""
    if avoid is not None:
        return normalized(np.cross(axis, avoid))
    candidate = np.array([0.0, 0.0, 1.0]) if abs(axis[2]) < 0.9 else np.array([1.0, 0.0, 0.0])
    return normalized(candidate - axis * (candidate @ axis))


def _offsets(placed: np.ndarray, rotations: np.ndarray) -> np.ndarray:
    """Rest offsets (J, 3): each joint's position in its parent's frame, the median over the frames (bone
    lengths fixed for the person); the template, scaled to the person, where the joint is never placed."""
    template = template_offsets()
    offsets = np.zeros_like(template)
    measured = np.zeros(len(JOINTS), dtype=bool)
    for j, parent in enumerate(PARENTS):
        if parent < 0:
            continue
        local = np.einsum("tji,tj->ti", rotations[:, parent], placed[:, j] - placed[:, parent])
        known = np.isfinite(local).all(axis=-1)
        if known.any():
            offsets[j], measured[j] = np.median(local[known], axis=0), True
    lengths = np.linalg.norm(template, axis=-1)
    usable = measured & (lengths > 0.05)
    scale = (
        float(np.median(np.linalg.norm(offsets[usable], axis=-1) / lengths[usable])) if usable.any() else 1.0
    )
    scale = scale if np.isfinite(scale) and scale > 0 else 1.0
    return np.where(measured[:, None], offsets, template * scale)
