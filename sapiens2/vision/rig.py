"""The motion skeleton: a fixed hierarchy of joints rooted at the hips, each placed and turned by named
keypoints of the 308, with its rest pose (a T-pose facing +Z, Y up, the person's left on +X) in metres."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

X, Y, Z = (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)
MINUS_X, MINUS_Y = (-1.0, 0.0, 0.0), (0.0, -1.0, 0.0)
Points = tuple[str, ...]


@dataclass(frozen=True)
class Joint:
    """One joint: its name, its parent's name (None: the root), the keypoints whose mean places it (none:
    placed by the rest offset alone), and its turn: the direction `aim` (from the mean of the first points
    to the mean of the second) takes the rest direction `rest_aim`; `twist` (the same kind of pair) turns
    it about that axis to `rest_twist` (None: no twist of its own, the parent's is carried on). An `end`
    joint is an end site: it only marks where its parent's bone ends. `template` is its rest position for
    a 1.7 m person, used where the keypoints never place it."""

    name: str
    parent: str | None
    at: Points
    template: tuple[float, float, float]
    aim: tuple[Points, Points] | None = None
    rest_aim: tuple[float, float, float] = Y
    twist: tuple[Points, Points] | None = None
    rest_twist: tuple[float, float, float] | None = None
    end: bool = False


FINGERS = (
    ("Thumb", "thumb"),
    ("Index", "forefinger"),
    ("Middle", "middle_finger"),
    ("Ring", "ring_finger"),
    ("Pinky", "pinky_finger"),
)
# Rest positions of the finger joints of the left hand (the right hand's mirror X), base to tip.
_FINGER_TEMPLATES = {
    "thumb": ((0.74, 0.04), (0.77, 0.06), (0.80, 0.07), (0.83, 0.08)),
    "forefinger": ((0.80, 0.03), (0.84, 0.03), (0.865, 0.03), (0.885, 0.03)),
    "middle_finger": ((0.80, 0.01), (0.845, 0.01), (0.875, 0.01), (0.90, 0.01)),
    "ring_finger": ((0.795, -0.01), (0.835, -0.01), (0.86, -0.01), (0.88, -0.01)),
    "pinky_finger": ((0.785, -0.03), (0.815, -0.03), (0.835, -0.03), (0.85, -0.03)),
}
_ARM_HEIGHT = 0.47


def _side(side: str) -> list[Joint]:
    """The arm, hand and leg joints of one side ("left" or "right")."""
    title, sign = side.capitalize(), 1.0 if side == "left" else -1.0
    out = (sign, 0.0, 0.0)
    hand_twist = ((f"{side}_pinky_finger_third_joint",), (f"{side}_forefinger_third_joint",))
    wrist = (f"{side}_wrist",)

    def at(x: float, y: float, z: float = 0.0) -> tuple[float, float, float]:
        return (sign * x, y, z)

    joints = [
        Joint(
            f"{title}Shoulder", "Spine", ("neck",), at(0.0, 0.50), ((("neck",), (f"{side}_shoulder",))), out
        ),
        Joint(
            f"{title}Arm",
            f"{title}Shoulder",
            (f"{side}_shoulder",),
            at(0.18, _ARM_HEIGHT),
            ((f"{side}_shoulder",), (f"{side}_elbow",)),
            out,
            ((f"{side}_olecranon",), (f"{side}_cubital_fossa",)),
            Z,
        ),
        Joint(
            f"{title}ForeArm",
            f"{title}Arm",
            (f"{side}_elbow",),
            at(0.46, _ARM_HEIGHT),
            ((f"{side}_elbow",), wrist),
            out,
            hand_twist,
            Z,
        ),
        Joint(
            f"{title}Hand",
            f"{title}ForeArm",
            wrist,
            at(0.71, _ARM_HEIGHT),
            (wrist, (f"{side}_middle_finger_third_joint",)),
            out,
            hand_twist,
            Z,
        ),
    ]
    for finger_title, finger in FINGERS:
        points = [
            f"{side}_{finger}_third_joint",
            f"{side}_{finger}2",
            f"{side}_{finger}3",
            f"{side}_{finger}4",
        ]
        parent = f"{title}Hand"
        for number, (point, (x, z)) in enumerate(zip(points, _FINGER_TEMPLATES[finger], strict=True), 1):
            joint_name = (
                f"{title}Hand{finger_title}{number}" if number < 4 else f"{title}Hand{finger_title}End"
            )
            last = number == 4
            aim = None if last else ((point,), (points[number],))
            joints.append(Joint(joint_name, parent, (point,), at(x, _ARM_HEIGHT, z), aim, out, end=last))
            parent = joint_name
    toes = (f"{side}_big_toe", f"{side}_small_toe")
    foot_aim = ((f"{side}_heel",), toes)
    foot_twist = ((f"{side}_big_toe",), (f"{side}_small_toe",))
    joints += [
        Joint(
            f"{title}UpLeg",
            "Hips",
            (f"{side}_hip",),
            at(0.10, 0.0),
            ((f"{side}_hip",), (f"{side}_knee",)),
            MINUS_Y,
            foot_aim,
            Z,
        ),
        Joint(
            f"{title}Leg",
            f"{title}UpLeg",
            (f"{side}_knee",),
            at(0.10, -0.43),
            ((f"{side}_knee",), (f"{side}_ankle",)),
            MINUS_Y,
            foot_aim,
            Z,
        ),
        Joint(
            f"{title}Foot", f"{title}Leg", (f"{side}_ankle",), at(0.10, -0.85), foot_aim, Z, foot_twist, out
        ),
        Joint(f"{title}ToeBase", f"{title}Foot", toes, at(0.105, -0.92, 0.14)),
        Joint(f"{title}ToeEnd", f"{title}ToeBase", (), at(0.105, -0.92, 0.19), end=True),
    ]
    return joints


# Chains of keypoints whose bones keep their length: each point is put back on its own ray (its pixel is
# more certain than its depth) at that length from the point before.
LIMBS = tuple(
    (f"{side}_{a}", f"{side}_{b}", f"{side}_{c}")
    for side in ("left", "right")
    for a, b, c in (("shoulder", "elbow", "wrist"), ("hip", "knee", "ankle"))
)
HIPS = ("left_hip", "right_hip")
SHOULDERS = ("left_shoulder", "right_shoulder")
EARS = ("left_ear", "right_ear")

JOINTS: tuple[Joint, ...] = (
    Joint("Hips", None, HIPS, (0.0, 0.0, 0.0), (HIPS, SHOULDERS), Y, (("right_hip",), ("left_hip",)), X),
    Joint(
        "Spine",
        "Hips",
        HIPS + SHOULDERS,
        (0.0, 0.24, 0.0),
        (HIPS + SHOULDERS, ("neck",)),
        Y,
        (("right_shoulder",), ("left_shoulder",)),
        X,
    ),
    Joint("Neck", "Spine", ("neck",), (0.0, 0.50, 0.0), (("neck",), EARS), Y),
    Joint(
        "Head",
        "Neck",
        EARS,
        (0.0, 0.65, 0.0),
        (("tip_of_chin",), ("center_of_glabella",)),
        Y,
        (("right_ear",), ("left_ear",)),
        X,
    ),
    Joint("HeadEnd", "Head", (), (0.0, 0.80, 0.0), end=True),
    *_side("left"),
    *_side("right"),
)
JOINT_NAMES: tuple[str, ...] = tuple(joint.name for joint in JOINTS)
PARENTS: tuple[int, ...] = tuple(-1 if j.parent is None else JOINT_NAMES.index(j.parent) for j in JOINTS)


def template_offsets() -> np.ndarray:
    """(J, 3) each joint's rest position minus its parent's, for a 1.7 m person (the root's: zero)."""
    positions = np.array([joint.template for joint in JOINTS])
    parents = np.array(PARENTS)
    return np.where((parents >= 0)[:, None], positions - positions[np.maximum(parents, 0)], 0.0)


def keypoint_groups(names: tuple[str, ...]) -> dict[Points, np.ndarray]:
    """Every group of keypoints the joints name, as indices into `names` (the model's keypoint names); a
    group with a name missing from `names` is left out."""
    index = {name: i for i, name in enumerate(names)}
    groups: set[Points] = set()
    for joint in JOINTS:
        groups.add(joint.at)
        for pair in (joint.aim, joint.twist):
            if pair is not None:
                groups.update(pair)
    return {g: np.array([index[n] for n in g]) for g in groups if g and all(n in index for n in g)}
