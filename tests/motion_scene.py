"""A synthetic ground truth for motion capture: two people crossing in front of a static camera (one turning,
elbows bending, legs walking), as rigid body segments animated in the test's own forward kinematics, then
projected with known intrinsics into 308-keypoint frames and rendered into pointmaps (each body a chain of
spheres, the wall behind). It knows nothing of the package's skeleton."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sapiens2.data.metadata import keypoints308
from sapiens2.vision.lifting import insets

WIDTH, HEIGHT, FX, FY = 640, 480, 500.0, 500.0
CX, CY = (WIDTH - 1) / 2, (HEIGHT - 1) / 2
WALL = 8.0  # metres from the camera
FPS = 15.0
FRAMES = 45
SKIN = 0.012  # radius of the small sphere behind a point that lies on the skin (face, elbow landmarks)

# name: (parent, pivot in the rest pose). The rest pose: a T-pose facing +Z, Y up, the left side on +X.
SEGMENTS = {
    "pelvis": (None, (0.0, 0.0, 0.0)),
    "torso": ("pelvis", (0.0, 0.0, 0.0)),
    "head": ("torso", (0.0, 0.55, 0.0)),
    "l_upper": ("torso", (0.18, 0.5, 0.0)),
    "l_fore": ("l_upper", (0.46, 0.5, 0.0)),
    "l_hand": ("l_fore", (0.71, 0.5, 0.0)),
    "r_upper": ("torso", (-0.18, 0.5, 0.0)),
    "r_fore": ("r_upper", (-0.46, 0.5, 0.0)),
    "r_hand": ("r_fore", (-0.71, 0.5, 0.0)),
    "l_thigh": ("pelvis", (0.1, 0.0, 0.0)),
    "l_shin": ("l_thigh", (0.1, -0.43, 0.0)),
    "l_foot": ("l_shin", (0.1, -0.85, 0.0)),
    "r_thigh": ("pelvis", (-0.1, 0.0, 0.0)),
    "r_shin": ("r_thigh", (-0.1, -0.43, 0.0)),
    "r_foot": ("r_shin", (-0.1, -0.85, 0.0)),
}
FINGERS = {
    "thumb": [(0.74, 0.04), (0.77, 0.06), (0.80, 0.07), (0.83, 0.08)],
    "forefinger": [(0.80, 0.03), (0.84, 0.03), (0.865, 0.03), (0.885, 0.03)],
    "middle_finger": [(0.80, 0.01), (0.845, 0.01), (0.875, 0.01), (0.90, 0.01)],
    "ring_finger": [(0.795, -0.01), (0.835, -0.01), (0.86, -0.01), (0.88, -0.01)],
    "pinky_finger": [(0.785, -0.03), (0.815, -0.03), (0.835, -0.03), (0.85, -0.03)],
}


def _keypoints() -> dict[str, tuple[str, tuple[float, float, float]]]:
    """keypoint name: (segment, rest position)."""
    points = {
        "left_hip": ("pelvis", (0.1, 0.0, 0.0)),
        "right_hip": ("pelvis", (-0.1, 0.0, 0.0)),
        "left_shoulder": ("torso", (0.18, 0.5, 0.0)),
        "right_shoulder": ("torso", (-0.18, 0.5, 0.0)),
        "neck": ("torso", (0.0, 0.52, 0.0)),
        "left_ear": ("head", (0.075, 0.65, 0.0)),
        "right_ear": ("head", (-0.075, 0.65, 0.0)),
        "tip_of_chin": ("head", (0.0, 0.57, 0.09)),
        "center_of_glabella": ("head", (0.0, 0.72, 0.09)),
        "nose": ("head", (0.0, 0.64, 0.11)),
        "left_eye": ("head", (0.035, 0.68, 0.085)),
        "right_eye": ("head", (-0.035, 0.68, 0.085)),
    }
    for side, sign in (("left", 1.0), ("right", -1.0)):
        s = side[0]
        points |= {
            f"{side}_elbow": (f"{s}_upper", (sign * 0.46, 0.5, 0.0)),
            f"{side}_olecranon": (f"{s}_upper", (sign * 0.46, 0.5, -0.035)),
            f"{side}_cubital_fossa": (f"{s}_upper", (sign * 0.46, 0.5, 0.035)),
            f"{side}_wrist": (f"{s}_fore", (sign * 0.71, 0.5, 0.0)),
            f"{side}_knee": (f"{s}_thigh", (sign * 0.1, -0.43, 0.0)),
            f"{side}_ankle": (f"{s}_shin", (sign * 0.1, -0.85, 0.0)),
            f"{side}_heel": (f"{s}_foot", (sign * 0.1, -0.9, -0.05)),
            f"{side}_big_toe": (f"{s}_foot", (sign * 0.07, -0.9, 0.15)),
            f"{side}_small_toe": (f"{s}_foot", (sign * 0.13, -0.9, 0.13)),
        }
        for finger, places in FINGERS.items():
            for name, (x, z) in zip(("_third_joint", "2", "3", "4"), places, strict=True):
                points[f"{side}_{finger}{name}"] = (f"{s}_hand", (sign * x, 0.5, z))
    return points


KEYPOINTS = _keypoints()
# Chains along which spheres fill the body between keypoints: (from, to, radius).
FILLS = [
    ("left_hip", "right_hip", 0.06), ("left_shoulder", "right_shoulder", 0.04), ("neck", "left_ear", 0.04),
    ("left_shoulder", "left_elbow", 0.025), ("left_elbow", "left_wrist", 0.02),
    ("right_shoulder", "right_elbow", 0.025), ("right_elbow", "right_wrist", 0.02),
    ("left_hip", "left_knee", 0.035), ("left_knee", "left_ankle", 0.03),
    ("right_hip", "right_knee", 0.035), ("right_knee", "right_ankle", 0.03),
]  # fmt: skip


def rot(axis: str, degrees: float) -> np.ndarray:
    c, s = np.cos(np.radians(degrees)), np.sin(np.radians(degrees))
    return {
        "x": np.array([[1, 0, 0], [0, c, -s], [0, s, c]]),
        "y": np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]]),
        "z": np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]]),
    }[axis]


@dataclass
class Actor:
    """One person of the scene: a scale, a root path (T, 3) and each segment's local rotation per frame."""

    scale: float
    root: np.ndarray
    local: dict[str, np.ndarray]  # segment: (T, 3, 3)

    def world(self, t: int) -> dict[str, np.ndarray]:
        """Every keypoint's position (3,) at frame t, metres, Y up."""
        pivots, rotations = {}, {}
        for name, (parent, pivot) in SEGMENTS.items():
            rest = self.scale * np.array(pivot)
            if parent is None:
                rotations[name], pivots[name] = self.local[name][t], self.root[t]
            else:
                offset = rest - self.scale * np.array(SEGMENTS[parent][1])
                rotations[name] = rotations[parent] @ self.local[name][t]
                pivots[name] = pivots[parent] + rotations[parent] @ offset
        return {
            point: pivots[seg] + rotations[seg] @ (self.scale * (np.array(rest) - np.array(SEGMENTS[seg][1])))
            for point, (seg, rest) in KEYPOINTS.items()
        }

    def elbow_angles(self) -> np.ndarray:
        """The left elbow's bend (T,) in degrees: 0 straight."""
        return np.array(
            [_bend(self.world(t), "left_shoulder", "left_elbow", "left_wrist") for t in range(FRAMES)]
        )

    def knee_angles(self) -> np.ndarray:
        return np.array([_bend(self.world(t), "left_hip", "left_knee", "left_ankle") for t in range(FRAMES)])

    def yaw(self) -> np.ndarray:
        """The pelvis's turn about Y (T,) in degrees: 0 facing the camera."""
        return np.array([_yaw(self.world(t)["left_hip"] - self.world(t)["right_hip"]) for t in range(FRAMES)])


def _bend(points: dict, a: str, b: str, c: str) -> float:
    first, second = points[b] - points[a], points[c] - points[b]
    cosine = first @ second / np.linalg.norm(first) / np.linalg.norm(second)
    return float(np.degrees(np.arccos(np.clip(cosine, -1, 1))))


def _yaw(across: np.ndarray) -> float:
    """Degrees the left-right vector has turned about +Y from +X."""
    return float(np.degrees(np.arctan2(-across[2], across[0])))


def actors() -> list[Actor]:
    """Person A walks left to right 3.2 m away, turning 50 degrees and bending its left elbow; person B
    walks right to left 4.3 m away with its left elbow bent at 90 degrees."""
    t = np.arange(FRAMES) / (FRAMES - 1)
    phase = 2 * np.pi * 2 * t

    def legs(local: dict, shift: float) -> None:
        swing = 20 * np.sin(phase + shift)
        local["l_thigh"] = np.stack([rot("x", -a) for a in swing])
        local["r_thigh"] = np.stack([rot("x", a) for a in swing])
        local["l_shin"] = np.stack([rot("x", 25 + 15 * np.sin(p + shift + 1)) for p in phase])
        local["r_shin"] = np.stack([rot("x", 25 + 15 * np.sin(p + shift + 2.5)) for p in phase])

    def person(scale, start, end, depth, yaw, elbow, shift) -> Actor:
        identity = np.eye(3)[None].repeat(FRAMES, 0)
        local = {name: identity.copy() for name in SEGMENTS}
        local["pelvis"] = np.stack([rot("y", a) for a in yaw])
        local["head"] = np.stack([rot("x", 10 * np.sin(p)) for p in phase])
        local["l_upper"] = np.stack([rot("z", -60) for _ in t])
        local["r_upper"] = np.stack([rot("z", 65) for _ in t])
        local["l_fore"] = np.stack([rot("y", -a) for a in elbow])
        local["r_fore"] = np.stack([rot("y", 15) for _ in t])
        local["l_hand"] = np.stack([rot("x", 20 * np.sin(p)) for p in phase])
        legs(local, shift)
        root = np.stack([start + (end - start) * t, np.full(FRAMES, -0.05), np.full(FRAMES, -depth)], axis=1)
        return Actor(scale, root, local)

    return [
        person(1.0, -1.0, 1.0, 3.2, -50 * t, 30 + 60 * t, 0.0),
        person(1.08, 1.1, -1.1, 4.3, np.full(FRAMES, 25.0), np.full(FRAMES, 90.0), 1.3),
    ]


def project(points: np.ndarray) -> np.ndarray:
    """Pixels (..., 2) of points (..., 3) in the Y-up frame."""
    x, y, z = points[..., 0], -points[..., 1], -points[..., 2]
    return np.stack([FX * x / z + CX, FY * y / z + CY], axis=-1)


def _spheres(points: dict[str, np.ndarray], scale: float) -> list[tuple[np.ndarray, float]]:
    """The body's spheres in the camera's frame (x right, y down, z forward): one per keypoint (a joint's
    sphere as wide as the skin's depth in front of it; a point on the skin with a small one behind it), and
    chains along the limbs."""
    deep = dict(zip(keypoints308().names, insets(keypoints308().names), strict=True))
    flip = np.array([1.0, -1.0, -1.0])
    spheres = []
    for name, point in points.items():
        centre = point * flip
        radius = deep[name]
        if radius <= 0:
            radius = SKIN
            centre = centre * (1 + SKIN / np.linalg.norm(centre))
        spheres.append((centre, radius))
    for a, b, radius in FILLS:
        for f in np.linspace(0.2, 0.8, 5):
            spheres.append((((1 - f) * points[a] + f * points[b]) * flip, radius * scale))
    for f in np.linspace(0.15, 0.85, 6):  # the spine
        middle = (points["left_hip"] + points["right_hip"]) / 2
        spheres.append((((1 - f) * middle + f * points["neck"]) * flip, 0.06))
    return spheres


def render(frame_points: list[tuple[dict[str, np.ndarray], float]]) -> np.ndarray:
    """The pointmap (H, W, 3) of the persons (each keypoints and scale) before the wall."""
    rows, columns = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float64)
    rays = np.stack([(columns - CX) / FX, (rows - CY) / FY, np.ones_like(rows)], axis=-1)
    depth = np.full((HEIGHT, WIDTH), WALL)
    for points, scale in frame_points:
        for centre, radius in _spheres(points, scale):
            u, v = FX * centre[0] / centre[2] + CX, FY * centre[1] / centre[2] + CY
            span = FX * radius / centre[2] + 2
            top, bottom = max(0, int(v - span)), min(HEIGHT, int(v + span) + 2)
            left, right = max(0, int(u - span)), min(WIDTH, int(u + span) + 2)
            if top >= bottom or left >= right:
                continue
            d = rays[top:bottom, left:right]
            b = d @ centre
            a = np.sum(d * d, axis=-1)
            disc = b * b - a * (centre @ centre - radius * radius)
            hit = disc >= 0
            t = np.where(hit, (b - np.sqrt(np.maximum(disc, 0))) / a, np.inf)
            depth[top:bottom, left:right] = np.minimum(depth[top:bottom, left:right], t)
    return (rays * depth[..., None]).astype(np.float32)


def visible(points: dict[str, np.ndarray], pointmap: np.ndarray) -> dict[str, bool]:
    """Whether each keypoint is seen: inside the frame, and nothing in front of its own surface."""
    seen = {}
    for name, point in points.items():
        u, v = np.rint(project(point)).astype(int)
        inside = 0 <= u < WIDTH and 0 <= v < HEIGHT
        seen[name] = bool(inside and pointmap[v, u, 2] > -point[2] - 0.12)
    return seen
