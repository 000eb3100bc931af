"""The depth task's geometry exports: the GLB mesh (read back by trimesh, an independent reader), the
camera fitted from a pointmap, and the 16-bit depth and normals PNGs (read back by Pillow and libpng)."""

from __future__ import annotations

import json
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image

from sapiens2.outputs import exports as export
from sapiens2.outputs.mesh import MAX_RELATIVE_JUMP, VIEWER_FACES, meshable, step_for_bytes
from sapiens2.vision.intrinsics import fit_intrinsics, points_in_front

trimesh = pytest.importorskip("trimesh", reason="trimesh reads the GLB back (requirements-dev.txt)")

FX, FY, CX, CY = 110.0, 95.0, 61.3, 38.7
HEIGHT, WIDTH = 80, 120
WALL, PLANE, SPHERE = 0, 1, 2  # what each pixel of the synthetic scene sees


def pinhole_scene(height=HEIGHT, width=WIDTH, fx=FX, fy=FY, cx=CX, cy=CY):
    """A pointmap (H, W, 3) seen through a known pinhole camera: a wall 6 m away, a tilted plane in front of
    it (3 to 3.3 m, over the left half) and a sphere of 0.5 m radius 2 m away, with the label (H, W) of what
    each pixel sees."""
    rows, columns = np.mgrid[0:height, 0:width].astype(np.float64)
    rays = np.dstack([(columns - cx) / fx, (rows - cy) / fy, np.ones_like(rows)])
    depth = np.full((height, width), 6.0)
    label = np.full((height, width), WALL)
    plane = (columns >= 10) & (columns < width // 2) & (rows >= 10) & (rows < height - 10)
    depth[plane] = 3.0 + 0.3 * columns[plane] / width
    label[plane] = PLANE
    centre, radius = np.array([0.4, 0.0, 2.0]), 0.5
    along = rays @ centre
    squared = (rays * rays).sum(axis=2)
    discriminant = along**2 - squared * (centre @ centre - radius**2)
    hit = discriminant > 0
    t = (along[hit] - np.sqrt(discriminant[hit])) / squared[hit]
    depth[hit], label[hit] = t, SPHERE
    return (rays * depth[..., None]).astype(np.float32), label


def colours(height, width):
    rows, columns = np.mgrid[0:height, 0:width]
    return np.dstack([rows * 3 % 256, columns * 2 % 256, (rows + columns) % 256]).astype(np.uint8)


def read_glb(path):
    """trimesh's reading of a GLB: the scene, and its one mesh as stored (no merging, no transform)."""
    scene = trimesh.load(str(path), file_type="glb", process=False)
    (mesh,) = scene.geometry.values()
    return scene, mesh


def test_the_mesh_joins_neighbouring_pixels_of_one_surface_and_never_crosses_the_silhouette(tmp_path):
    points, label = pinhole_scene()
    image = colours(HEIGHT, WIDTH)
    foreground = label != WALL
    (path,) = export.write_mesh(tmp_path, "photo", points, image, foreground)
    assert path.name == "photo_mesh.glb"
    scene, mesh = read_glb(path)
    assert len(scene.graph.nodes_geometry) == 1

    # The expected faces, counted quad by quad: four foreground corners, depths within the relative jump.
    expected, corners = 0, set()
    for row in range(HEIGHT - 1):
        for column in range(WIDTH - 1):
            quad = [(row, column), (row, column + 1), (row + 1, column), (row + 1, column + 1)]
            depths = [points[r, c, 2] for r, c in quad]
            shallow = max(depths) - min(depths) <= MAX_RELATIVE_JUMP * min(depths)
            if shallow and all(foreground[r, c] for r, c in quad):
                expected += 2
                corners |= set(quad)
    plane_quads = (label[:-1, :-1] == PLANE) & (label[1:, 1:] == PLANE) & (label[1:, :-1] == PLANE)
    plane_quads &= label[:-1, 1:] == PLANE
    assert len(mesh.faces) == expected and expected > 2 * plane_quads.sum() > 0

    # Vertices are the corners' points, row by row, on glTF's axes (x, -y, -z).
    kept = sorted(corners)
    flip = np.array([1, -1, -1], np.float32)
    np.testing.assert_array_equal(mesh.vertices, np.array([points[r, c] for r, c in kept]) * flip)
    box = np.array([points[r, c] for r, c in kept]) * flip
    np.testing.assert_array_equal(scene.bounds, [box.min(axis=0), box.max(axis=0)])

    # No face joins the sphere to the plane behind it, nor anything to the wall.
    pixel_label = np.array([label[r, c] for r, c in kept])
    face_labels = pixel_label[mesh.faces]
    assert (face_labels != WALL).all() and (face_labels == face_labels[:, :1]).all()
    # Faces are counter-clockwise seen from the camera (glTF's front): their normals point to the eye, +z.
    assert (mesh.face_normals[:, 2] > 0).all()

    # Colours: the photo's sRGB bytes as linear light in unsigned shorts (glTF's COLOR_0 is linear).
    srgb = np.array([image[r, c] for r, c in kept]) / 255
    linear = np.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)
    stored = np.asarray(mesh.visual.vertex_attributes["color"], dtype=np.float64)
    np.testing.assert_allclose(stored[:, :3] / 65535, linear, atol=1 / 65535)


def test_a_mesh_without_faces_is_a_valid_empty_scene(tmp_path):
    points, label = pinhole_scene()
    (path,) = export.write_mesh(tmp_path, "photo", points, colours(HEIGHT, WIDTH), np.zeros_like(label, bool))
    data = path.read_bytes()
    assert data[:4] == b"glTF" and int.from_bytes(data[8:12], "little") == len(data)
    document = json.loads(data[20:].decode("utf-8"))
    assert document["scenes"] == [{"nodes": []}] and "meshes" not in document


def test_the_viewers_mesh_of_a_12_megapixel_photo_stays_within_its_bound(tmp_path):
    height, width = 3000, 4000
    rows, columns = np.mgrid[0:height, 0:width].astype(np.float32)
    # A person-like surface 2 m away filling 40% of the photo (camera space: y down).
    points = np.dstack([(columns - width / 2) / 1000, (rows - height / 2) / 1000 + 0.3, 2 + 0 * rows])
    image = np.dstack([rows * 255 / height, columns * 255 / width, np.full_like(rows, 90)]).astype(np.uint8)
    foreground = np.zeros((height, width), bool)
    foreground[:, 1200:2800] = True
    preview = export.write_mesh_preview(tmp_path, "photo", points, image, foreground)
    assert preview.name == "photo_mesh_preview.glb"
    assert preview.stat().st_size < 4.5e6
    scene, mesh = read_glb(preview)
    assert VIEWER_FACES * 0.8 < len(mesh.faces) <= VIEWER_FACES
    placed = scene.to_mesh()  # the node's translation applied: centred on the median, for the viewer
    assert np.abs(np.median(placed.vertices, axis=0)).max() < 0.01
    red = np.asarray(mesh.visual.vertex_attributes["color"])[:, 0]
    top, bottom = placed.vertices[red < 1000, 1].mean(), placed.vertices[red > 60000, 1].mean()
    assert top > 0 > bottom, "the top of the photo is up (y up)"


def test_the_full_mesh_is_decimated_only_above_its_share_of_the_output_budget():
    points, label = pinhole_scene()
    foreground = label != WALL
    count = int(foreground.sum())
    assert step_for_bytes(meshable(points, foreground), 44 * count) == 1
    step = step_for_bytes(meshable(points, foreground), 44 * count / 3)
    assert step == 2 and 44 * foreground[::2, ::2].sum() <= 44 * count / 3


@pytest.mark.parametrize("noise", [0.0, 0.002])
def test_the_camera_is_recovered_from_a_pointmap_made_with_it(noise):
    points, label = pinhole_scene(height=300, width=400, fx=520.0, fy=505.0, cx=203.5, cy=148.25)
    rng = np.random.default_rng(0)
    points = points + rng.normal(0, noise, points.shape).astype(np.float32) * points[..., 2:]
    camera = fit_intrinsics(points, label != WALL)
    # Exact points give the camera back to float32 rounding; 0.2% noise of the depth (about 1 px) within 1%.
    tolerance = 1e-4 if noise == 0 else 1e-2
    fitted = (camera.fx, camera.fy, camera.cx, camera.cy)
    assert fitted == pytest.approx((520.0, 505.0, 203.5, 148.25), rel=tolerance)
    assert camera.residual < (0.01 if noise == 0 else 2.0) and camera.points == (label != WALL).sum()
    assert fit_intrinsics(points, np.zeros_like(label, bool)) is None


def test_16_bit_depth_png_gives_metres_back_within_one_step(tmp_path):
    points, _ = pinhole_scene()
    depth = points[..., 2].copy()
    depth[0, 0], depth[0, 1] = np.nan, -1.0  # no depth: written as 0
    scale = export.depth_png_scale(depth)
    (path,) = export.write_depth_png(tmp_path, "photo", depth, scale)
    assert path.name == "photo_depth_16bit.png"
    with Image.open(path) as png:
        assert png.mode in {"I;16", "I"} and png.size == (WIDTH, HEIGHT)
        stored_scale = float(png.text[export.DEPTH_SCALE_KEY])
        values = np.asarray(png, dtype=np.int64)
    assert stored_scale == scale and values.max() == 65535
    assert values[0, 0] == values[0, 1] == 0
    usable = values > 0
    assert np.abs(values[usable] * stored_scale - depth[usable]).max() <= stored_scale


def test_16_bit_normals_png_gives_the_normals_back_within_one_step(tmp_path):
    rng = np.random.default_rng(1)
    normals = rng.normal(size=(40, 50, 3))
    normals /= np.linalg.norm(normals, axis=2, keepdims=True)
    (path,) = export.write_normals_png(tmp_path, "photo", normals)
    assert path.name == "photo_normals_16bit.png"
    data = path.read_bytes()
    assert data[12:16] == b"IHDR" and data[24:26] == bytes([16, 2]), "16 bits per channel, RGB"
    assert zlib.crc32(data[12:29]) == int.from_bytes(data[29:33], "big")
    values = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)[..., ::-1]  # BGR to RGB
    assert values.dtype == np.uint16
    np.testing.assert_allclose(values / 65535 * 2 - 1, normals, atol=2 / 65535)


def test_the_depth_document_holds_the_camera_and_the_png_scale():
    points, label = pinhole_scene()
    camera = fit_intrinsics(points, label != WALL)
    document = export.depth_document(
        model_id="m",
        image_size=(HEIGHT, WIDTH),
        foreground_points=7,
        camera=camera,
        depth_scale=0.001,
        mesh_step=1,
    )
    text = json.dumps(document, allow_nan=False)
    assert json.loads(text)["camera"]["fx"] == pytest.approx(FX, rel=1e-4)
    assert document["image"] == {"width": WIDTH, "height": HEIGHT}
    assert document["depth_png"]["metres_per_unit"] == 0.001 and document["mesh"]["grid_step"] == 1


def _points_with_holes(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A noisy pointmap (60, 80, 3) with NaN, infinite and behind-the-camera points here and there."""
    rng = np.random.default_rng(seed)
    points = rng.normal(0, 1, (60, 80, 3)).astype(np.float32)
    points[..., 2] = np.abs(points[..., 2]) + 0.5
    for value, channel in ((np.nan, 0), (np.inf, 1), (-np.inf, 2), (-1.0, 2), (np.nan, 2)):
        rows, columns = rng.integers(0, 60, 40), rng.integers(0, 80, 40)
        points[rows, columns, channel] = value
    return points, rng.random((60, 80)) > 0.3


def test_usable_points_are_the_finite_foreground_in_front_of_the_camera():
    points, foreground = _points_with_holes()
    expected = foreground & np.isfinite(points).all(axis=2) & (points[..., 2] > 0)
    assert np.array_equal(points_in_front(np.moveaxis(points, -1, 0), foreground), expected)
    assert np.array_equal(
        points_in_front(np.ascontiguousarray(np.moveaxis(points, -1, 0)), foreground), expected
    )
    assert np.array_equal(meshable(points, foreground), expected)


def test_the_camera_fit_skips_foreground_points_without_a_usable_position():
    points, label = pinhole_scene(height=300, width=400, fx=520.0, fy=505.0, cx=203.5, cy=148.25)
    foreground = label != WALL
    points[::7, ::5] = np.nan
    points[::11, ::3, 2] = -2.0
    camera = fit_intrinsics(points, foreground)
    assert (camera.fx, camera.fy, camera.cx, camera.cy) == pytest.approx(
        (520.0, 505.0, 203.5, 148.25), rel=1e-4
    )
    assert camera.points == meshable(points, foreground).sum()


@pytest.mark.parametrize(
    "values, farthest",
    [
        ([1.0, 2.5, np.nan, -3.0], 2.5),
        ([1.0, np.inf, 4.0, np.nan], 4.0),  # infinity is no depth: the farthest finite one counts
        ([np.nan, np.nan], None),
        ([-1.0, 0.0, -np.inf], None),
        ([np.inf], None),
    ],
)
def test_the_depth_png_scale_maps_the_farthest_finite_depth_to_the_top_level(values, farthest):
    depth = np.array(values, dtype=np.float32).reshape(1, -1)
    scale = export.depth_png_scale(depth)
    assert scale == (1.0 if farthest is None else pytest.approx(farthest / export.DEPTH_LEVELS))
