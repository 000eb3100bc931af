"""A pointmap as a triangle mesh: two faces per foreground pixel quad, a grid step to decimate, and GLB.

Vertices are the pointmap's points turned from camera space (x right, y down, z away from the camera) to
glTF's axes (x right, y up, the camera looking along -z): (x, -y, -z), in the pointmap's units (metres, at
the model's scale). Pixels are taken row by row, so vertex order follows the photo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from sapiens2.outputs.glb import (
    ARRAY_BUFFER,
    ELEMENT_ARRAY_BUFFER,
    FLOAT,
    UNSIGNED_INT,
    UNSIGNED_SHORT,
    write_container,
)
from sapiens2.vision.intrinsics import points_in_front

# A quad is meshed only when its farthest corner is at most this much deeper than its nearest, relative to
# the nearest: the silhouette's jump from a person to the wall behind is far above it, a body's own
# slopes far below it (a surface at 85 degrees to the camera, 3,000 px focal length, grid step 11: 4%).
MAX_RELATIVE_JUMP = 0.05
# The 3-D viewer's mesh: 200,000 faces are a GLB of about 4 MB that headless Chromium opens at once.
VIEWER_FACES = 200_000
# An upper bound of the GLB's size per meshed pixel: one vertex (12 bytes of position, 8 of colour) and
# two faces of three 4-byte indices.
GLB_BYTES_PER_PIXEL = 20 + 2 * 12
TO_GLTF_AXES = np.array([1.0, -1.0, -1.0], dtype=np.float32)

_FLOAT, _UNSIGNED_SHORT, _UNSIGNED_INT = FLOAT, UNSIGNED_SHORT, UNSIGNED_INT
_ARRAY_BUFFER, _ELEMENT_ARRAY_BUFFER = ARRAY_BUFFER, ELEMENT_ARRAY_BUFFER


@dataclass(frozen=True)
class Mesh:
    """Vertices (N, 3) float32 on glTF's axes, their photo colours (N, 3) uint8 sRGB, faces (F, 3) uint32
    indices counter-clockwise as seen from the camera."""

    vertices: np.ndarray
    colors: np.ndarray
    faces: np.ndarray


def meshable(points: np.ndarray, foreground: np.ndarray) -> np.ndarray:
    """(H, W) bool: pixels that may be a face's corner (foreground, finite, in front of the camera)."""
    return points_in_front(np.moveaxis(points, -1, 0), foreground)


def quads(points: np.ndarray, foreground: np.ndarray) -> np.ndarray:
    """(H-1, W-1) bool: pixel quads to mesh, whose four corners are meshable and whose depths stay within
    MAX_RELATIVE_JUMP of the nearest."""
    usable = meshable(points, foreground)
    depth = np.where(usable, points[..., 2], np.nan)
    corners = (depth[:-1, :-1], depth[:-1, 1:], depth[1:, :-1], depth[1:, 1:])
    near, far = np.fmin.reduce(corners), np.fmax.reduce(corners)
    with np.errstate(invalid="ignore"):
        shallow = far - near <= MAX_RELATIVE_JUMP * near
    return usable[:-1, :-1] & usable[:-1, 1:] & usable[1:, :-1] & usable[1:, 1:] & shallow


def pointmap_mesh(points: np.ndarray, image: np.ndarray, foreground: np.ndarray, step: int = 1) -> Mesh:
    """The mesh of every `step`-th row and column of a pointmap (H, W, 3), coloured by the photo (H, W, 3)
    uint8; only pixels that are a corner of a meshed quad become vertices."""
    points, image, foreground = points[::step, ::step], image[::step, ::step], foreground[::step, ::step]
    kept = quads(points, foreground)
    used = np.zeros(foreground.shape, dtype=bool)
    for rows in (slice(None, -1), slice(1, None)):
        for columns in (slice(None, -1), slice(1, None)):
            used[rows, columns] |= kept
    flat = used.ravel()
    index = np.full(flat.shape, -1, dtype=np.int64)
    index[flat] = np.arange(int(flat.sum()))
    index = index.reshape(used.shape)
    a, b = index[:-1, :-1][kept], index[:-1, 1:][kept]
    c, d = index[1:, :-1][kept], index[1:, 1:][kept]
    faces = np.empty((2 * len(a), 3), dtype=np.uint32)
    faces[0::2] = np.stack([a, c, b], axis=1)  # top-left, bottom-left, top-right
    faces[1::2] = np.stack([b, c, d], axis=1)  # top-right, bottom-left, bottom-right
    vertices = np.compress(flat, points.reshape(-1, 3), axis=0).astype(np.float32) * TO_GLTF_AXES
    colors = np.compress(flat, image.reshape(-1, 3), axis=0)
    return Mesh(vertices, colors, faces)


def step_for_faces(points: np.ndarray, foreground: np.ndarray, max_faces: int) -> int:
    """The smallest grid step whose mesh has at most `max_faces` faces."""
    count = int(meshable(points, foreground).sum())
    step = max(1, math.isqrt(2 * count // max(max_faces, 1)))
    while 2 * int(quads(points[::step, ::step], foreground[::step, ::step]).sum()) > max_faces:
        step += 1
    return step


def step_for_bytes(usable: np.ndarray, max_bytes: float) -> int:
    """The smallest grid step whose GLB takes at most `max_bytes` by the GLB_BYTES_PER_PIXEL bound, for the
    meshable pixels `usable` (H, W) (`meshable`)."""
    step = 1
    while GLB_BYTES_PER_PIXEL * int(usable[::step, ::step].sum()) > max_bytes:
        step += 1
    return step


# sRGB bytes to linear light (glTF's COLOR_0 is linear), as unsigned shorts, for each of the 256 values.
_srgb = np.arange(256) / 255
_LINEAR = np.round(
    65535 * np.where(_srgb <= 0.04045, _srgb / 12.92, ((_srgb + 0.055) / 1.055) ** 2.4)
).astype(np.uint16)


def _linear_rgba(colors: np.ndarray) -> np.ndarray:
    rgba = np.full((len(colors), 4), 65535, dtype=np.uint16)
    rgba[:, :3] = _LINEAR[colors]
    return rgba


def write_glb(file: BinaryIO, mesh: Mesh, translation: np.ndarray | None = None) -> None:
    """Binary glTF 2.0 of `mesh`: positions, linear vertex colours and indices in one buffer, an unlit
    double-sided material; `translation` moves the node (the vertices stay as they are)."""
    node: dict = {"name": "pointmap"}
    if translation is not None:
        node["translation"] = [float(v) for v in translation]
    document: dict = {
        "asset": {"version": "2.0", "generator": "Sapiens2 Studio"},
        "scene": 0,
        "scenes": [{"nodes": []}],
        "nodes": [node],
    }
    parts: list[np.ndarray] = []
    if len(mesh.faces):  # glTF accessors may not be empty: a mesh without faces is a scene without nodes
        positions = np.ascontiguousarray(mesh.vertices, dtype="<f4")
        parts = [positions, _linear_rgba(mesh.colors).astype("<u2"), mesh.faces.astype("<u4")]
        offsets = np.cumsum([0] + [part.nbytes for part in parts])
        document["scenes"][0]["nodes"] = [0]
        node["mesh"] = 0
        document |= {
            "extensionsUsed": ["KHR_materials_unlit"],
            "meshes": [{"primitives": [{
                "attributes": {"POSITION": 0, "COLOR_0": 1}, "indices": 2, "material": 0, "mode": 4,
            }]}],
            "materials": [{
                "pbrMetallicRoughness": {"baseColorFactor": [1, 1, 1, 1], "metallicFactor": 0,
                                         "roughnessFactor": 1},
                "doubleSided": True,
                "extensions": {"KHR_materials_unlit": {}},
            }],
            "buffers": [{"byteLength": int(offsets[-1])}],
            "bufferViews": [
                {"buffer": 0, "byteOffset": int(offsets[i]), "byteLength": int(part.nbytes), "target": target}
                for i, (part, target) in enumerate(
                    zip(parts, (_ARRAY_BUFFER, _ARRAY_BUFFER, _ELEMENT_ARRAY_BUFFER), strict=True)
                )
            ],
            "accessors": [
                {"bufferView": 0, "componentType": _FLOAT, "count": len(mesh.vertices), "type": "VEC3",
                 "min": mesh.vertices.min(axis=0).tolist(), "max": mesh.vertices.max(axis=0).tolist()},
                {"bufferView": 1, "componentType": _UNSIGNED_SHORT, "normalized": True,
                 "count": len(mesh.vertices), "type": "VEC4"},
                {"bufferView": 2, "componentType": _UNSIGNED_INT, "count": mesh.faces.size, "type": "SCALAR"},
            ],
        }  # fmt: skip
    write_container(file, document, parts)
