"""Where the Video tab's 3-D viewer starts: at the camera that filmed the clip, so the skeletons stand over
the people of the first frame behind them until the visitor turns the view."""

from __future__ import annotations

import math
from pathlib import Path

from sapiens2.outputs.glb import read_document
from sapiens2.outputs.motion_gltf import FIRST_FRAME


def camera_orbit(path: str | Path) -> tuple[float, float, float] | None:
    """The viewer's (alpha, beta, radius), degrees and metres, that put it at the filming camera (the
    origin of the view file), or None when the file has no first frame to place it by.

    Gradio's Model3D (Babylon.js's viewer) turns about the middle of the scene's bounds and sets its camera
    at `middle + radius * (cos alpha sin beta, cos beta, sin alpha sin beta)`. The first frame's mesh spans
    those bounds: the picture at the back and, in the view file, a vertex at the camera; every skeleton
    stands between them, inside what the camera saw.
    """
    document = read_document(Path(path))
    if document is None:
        return None
    mesh = next((m for m in document.get("meshes", []) if m.get("name") == FIRST_FRAME), None)
    if mesh is None:
        return None
    accessor = document["accessors"][mesh["primitives"][0]["attributes"]["POSITION"]]
    low, high = accessor.get("min"), accessor.get("max")
    if low is None or high is None:
        return None
    x, y, z = (-(a + b) / 2 for a, b in zip(low, high, strict=True))  # from the middle to the camera
    radius = math.sqrt(x * x + y * y + z * z)
    if radius == 0:
        return None
    alpha = math.atan2(z, x) % (2 * math.pi)
    beta = math.acos(max(-1.0, min(1.0, y / radius)))
    return math.degrees(alpha), math.degrees(beta), radius
