"""A person's motion as a BVH file: the skeleton's hierarchy with rest offsets in metres, then one line of
channels per frame (the root's position, every joint's Z-X-Y Euler angles in degrees)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from sapiens2.outputs.exports import _atomic_write, _bytes, _target
from sapiens2.vision.motion_fit import Motion
from sapiens2.vision.rotations import euler_zxy, unwrapped

ROTATION_CHANNELS = "Zrotation Xrotation Yrotation"


def bvh_suffix(track_id: int) -> str:
    """The file name after the video's stem for the person `track_id`."""
    return f"_motion_{track_id}.bvh"


def _hierarchy(motion: Motion, out: io.StringIO) -> list[int]:
    """Writes the HIERARCHY section; returns the joints with channels in the order it names them (the
    order of the MOTION section's values)."""
    order: list[int] = []
    children: dict[int, list[int]] = {j: [] for j in range(len(motion.names))}
    for j, parent in enumerate(motion.parents):
        if parent >= 0:
            children[parent].append(j)

    def joint(j: int, depth: int) -> None:
        pad = "\t" * depth
        x, y, z = motion.offsets[j]
        if motion.ends[j]:
            out.write(f"{pad}End Site\n{pad}{{\n{pad}\tOFFSET {x:.6f} {y:.6f} {z:.6f}\n{pad}}}\n")
            return
        root = motion.parents[j] < 0
        order.append(j)
        out.write(f"{pad}{'ROOT' if root else 'JOINT'} {motion.names[j]}\n{pad}{{\n")
        out.write(f"{pad}\tOFFSET {x:.6f} {y:.6f} {z:.6f}\n")
        channels = (
            f"6 Xposition Yposition Zposition {ROTATION_CHANNELS}" if root else f"3 {ROTATION_CHANNELS}"
        )
        out.write(f"{pad}\tCHANNELS {channels}\n")
        for child in children[j]:
            joint(child, depth + 1)
        out.write(f"{pad}}}\n")

    out.write("HIERARCHY\n")
    joint(motion.parents.index(-1), 0)
    return order


def bvh_text(motion: Motion) -> str:
    """The BVH document of `motion` (units: metres and degrees; frame time from its frame rate)."""
    out = io.StringIO()
    moving = _hierarchy(motion, out)
    angles = unwrapped(euler_zxy(motion.local[:, moving]))  # (T, joints, 3)
    values = np.concatenate([motion.root, angles.reshape(motion.frames, -1)], axis=1)
    out.write(f"MOTION\nFrames: {motion.frames}\nFrame Time: {1.0 / motion.fps:.8f}\n")
    for row in values:
        out.write(" ".join(f"{value:.6f}" for value in row) + "\n")
    return out.getvalue()


def write_bvh(directory: str | os.PathLike, stem: str, motion: Motion) -> list[Path]:
    """`{stem}_motion_{track id}.bvh`: one person's skeleton and motion."""
    target = _target(directory, stem, bvh_suffix(motion.track_id))
    return [_atomic_write(target, _bytes(bvh_text(motion).encode("ascii")))]
