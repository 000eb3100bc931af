"""Export writers: pose JSON against its schema, PNG/npy round trips, binary PLY, atomic writes."""

import dataclasses
import json
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from sapiens2.data.metadata import keypoints308
from sapiens2.outputs import exports as export
from sapiens2.vision.detector import Detections
from sapiens2.vision.pose_decoding import Person

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "docs" / "pose-json-schema.json").read_text())
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def schema_errors(value, schema: dict, where: str = "$") -> list[str]:
    """The keywords of JSON Schema that docs/pose-json-schema.json uses, checked by hand."""
    errors = []
    if "const" in schema and value != schema["const"]:
        errors.append(f"{where}: {value!r} is not {schema['const']!r}")
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = any(
            (t == "number" and number) or (t == "integer" and number and float(value).is_integer())
            or (t in _TYPES and isinstance(value, _TYPES[t]))
            for t in types
        )
        if not ok:
            return [f"{where}: {value!r} is not of type {types}"]
    if isinstance(value, (int, float)) and "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{where}: {value} < {schema['minimum']}")
    if isinstance(value, dict):
        errors += [f"{where}: missing {key}" for key in schema.get("required", []) if key not in value]
        properties = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            errors += [f"{where}: unexpected {key}" for key in value if key not in properties]
        for key, sub in properties.items():
            if key in value:
                errors += schema_errors(value[key], sub, f"{where}.{key}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{where}: {len(value)} items")
        for i, item in enumerate(value):
            errors += schema_errors(item, schema.get("items", {}), f"{where}[{i}]")
    return errors


@pytest.fixture(scope="module", params=["grace_hopper.jpg", "astronaut.png"])
def photo(request) -> np.ndarray:
    return np.asarray(Image.open(ROOT / "assets" / request.param).convert("RGB"))


def _persons(count: int, height: int, width: int, box_scores=None) -> list[Person]:
    rng = np.random.default_rng(count)
    return [
        Person(
            box=[width * 0.1 * (i + 1), height * 0.1, width * 0.3, height * 0.8],
            keypoints=rng.uniform(0, min(height, width), (308, 2)),
            scores=rng.uniform(0, 1, 308).astype(np.float32),
            box_score=None if box_scores is None else box_scores[i],
        )
        for i in range(count)
    ]


def _ellipse_mask(height: int, width: int) -> np.ndarray:
    mask = np.zeros((height, width), np.uint8)
    cv2.ellipse(mask, (width // 2, height // 2), (width // 4, height // 3), 0, 0, 360, 1, -1)
    return mask.astype(bool)


def test_pose_json_validates_against_the_schema(tmp_path, photo):
    height, width = photo.shape[:2]
    persons = _persons(2, height, width, box_scores=[0.9, 0.6])
    boxes = np.array([p.box for p in persons], np.float32)
    detections = Detections(boxes, np.array([0.9, 0.6], np.float32), found=5)
    names = keypoints308().names
    paths = export.write_pose_json(
        tmp_path, "photo", persons, image_size=(height, width), keypoint_names=names,
        model_id="facebook/sapiens2-pose-0.4b", detections=detections,
    )
    assert paths == [tmp_path / "photo_pose.json"]
    document = json.loads(paths[0].read_text())
    assert schema_errors(document, SCHEMA) == []
    assert document["image"] == {"width": width, "height": height}
    assert document["detector"] == {"fallback": False, "capped": True, "found": 5}
    first = document["persons"][0]
    assert first["box_score"] == 0.9
    np.testing.assert_allclose(first["box_xywh"], boxes[0], atol=0.01)
    assert [k["name"] for k in first["keypoints"]] == list(names)
    xy = [[k["x"], k["y"]] for k in first["keypoints"]]
    np.testing.assert_allclose(xy, persons[0].keypoints, atol=0.01)
    np.testing.assert_allclose([k["score"] for k in first["keypoints"]], persons[0].scores, atol=1e-4)

    boxes_given = [dataclasses.replace(persons[0], box_score=None)]
    given = export.pose_document(boxes_given, image_size=(height, width), keypoint_names=names, model_id="m")
    assert schema_errors(given, SCHEMA) == []
    assert given["detector"] == {"fallback": False, "capped": False, "found": None}
    assert given["persons"][0]["box_score"] is None
    whole = np.array([[0, 0, width, height]], np.float32)
    fallback = Detections(whole, np.zeros(1, np.float32), fallback=True)
    alone = export.pose_document(
        persons[:1], image_size=(height, width), keypoint_names=names, model_id="m", detections=fallback
    )
    assert alone["detector"]["fallback"] and schema_errors(alone, SCHEMA) == []


def test_schema_check_rejects_broken_documents():
    names = ["a", "b"]
    person = Person(box=[1, 2, 3, 4], keypoints=[[1, 2], [3, 4]], scores=[0.5, 0.6])
    good = export.pose_document([person], image_size=(10, 20), keypoint_names=names, model_id="m")
    assert schema_errors(good, SCHEMA) == []
    missing = dict(good)
    del missing["detector"]
    wrong_type = json.loads(json.dumps(good))
    wrong_type["persons"][0]["keypoints"][1]["x"] = "3"
    short_box = json.loads(json.dumps(good))
    short_box["persons"][0]["box_xywh"] = [1, 2, 3]
    for broken in (missing, wrong_type, short_box, {**good, "extra": 1}, {**good, "version": 2}):
        assert schema_errors(broken, SCHEMA)


def test_schema_is_valid_json_schema_when_jsonschema_is_installed(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    person = Person(box=[1, 2, 3, 4], keypoints=[[1, 2]], scores=[0.5])
    document = export.pose_document([person], image_size=(10, 20), keypoint_names=["nose"], model_id="m")
    jsonschema.validate(document, SCHEMA)


def test_pose_frames_json_has_the_official_layout(tmp_path):
    persons = _persons(2, 100, 80)
    paths = export.write_pose_frames_json(tmp_path, "clip", [("000001.jpg", persons), ("000002.jpg", [])],
                                          image_size=(100, 80), threshold=0.3)
    assert paths == [tmp_path / "clip_predictions.json"]
    document = json.loads(paths[0].read_text())
    assert document["video"] == "clip" and document["image_size"] == [100, 80]
    assert document["num_keypoints"] == 308 and document["kpt_thr_used"] == 0.3
    assert [f["image_name"] for f in document["frames"]] == ["000001.jpg", "000002.jpg"]
    instance = document["frames"][0]["instances"][1]
    x, y, w, h = persons[1].box
    np.testing.assert_allclose(instance["bbox"], [x, y, x + w, y + h], atol=0.01)
    assert np.array(instance["keypoints"]).shape == (308, 2) and len(instance["keypoint_scores"]) == 308
    assert document["frames"][1]["instances"] == []


def test_segmentation_png_and_npy_round_trip(tmp_path, photo):
    height, width = photo.shape[:2]
    seg = (np.arange(height * width).reshape(height, width) % 29).astype(np.int64)
    png, npy = export.write_segmentation(tmp_path, "photo", seg)
    assert (png.name, npy.name) == ("photo_segmentation.png", "photo_segmentation.npy")
    with Image.open(png) as image:
        assert image.mode == "L"
        np.testing.assert_array_equal(np.asarray(image), seg)
    loaded = np.load(npy)
    assert loaded.dtype == np.uint8
    np.testing.assert_array_equal(loaded, seg)
    with pytest.raises(ValueError):
        export.write_segmentation(tmp_path, "bad", np.full((4, 4), 300))


def test_normals_depth_and_features_npy(tmp_path):
    rng = np.random.default_rng(0)
    normals = rng.standard_normal((12, 10, 3))
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    (normals_path,) = export.write_normals(tmp_path, "x", normals)
    assert normals_path.name == "x_normals.npy" and np.load(normals_path).dtype == np.float16
    np.testing.assert_allclose(np.load(normals_path), normals, atol=1e-3)
    depth = rng.uniform(1, 5, (12, 10))
    (depth_path,) = export.write_depth(tmp_path, "x", depth)
    assert np.load(depth_path).dtype == np.float32
    np.testing.assert_allclose(np.load(depth_path), depth, rtol=1e-6)
    cls, patches = rng.standard_normal(64), rng.standard_normal((64, 4, 3)).astype(np.float16)
    cls_path, patches_path = export.write_features(tmp_path, "x", cls, patches)
    assert (cls_path.name, patches_path.name) == ("x_cls.npy", "x_patches.npy")
    assert np.load(cls_path).shape == (64,) and np.load(patches_path).dtype == np.float32
    np.testing.assert_array_equal(np.load(patches_path), patches.astype(np.float32))
    with pytest.raises(ValueError):
        export.write_normals(tmp_path, "x", depth)
    with pytest.raises(ValueError):
        export.write_features(tmp_path, "x", cls[:10], patches)


def read_ply(path: Path) -> tuple[list[str], np.ndarray]:
    """A binary little-endian PLY of x y z float and red green blue uchar vertices."""
    data = path.read_bytes()
    end = data.index(b"end_header\n") + len(b"end_header\n")
    header = data[:end].decode("ascii").splitlines()
    count = int(next(line.split()[2] for line in header if line.startswith("element vertex")))
    dtype = np.dtype([(axis, "<f4") for axis in "xyz"] + [(c, "u1") for c in ("red", "green", "blue")])
    assert len(data) - end == count * dtype.itemsize
    return header, np.frombuffer(data, dtype=dtype, offset=end)


def test_point_cloud_ply_holds_the_foreground_with_photo_colours(tmp_path, photo):
    height, width = photo.shape[:2]
    foreground = _ellipse_mask(height, width)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    points = np.stack([x / width - 0.5, y / height - 0.5, 2.0 + x / width], axis=-1)
    points[height // 2, width // 2] = np.nan  # a foreground pixel without a valid point is left out
    (path,) = export.write_point_cloud(tmp_path, "photo", points, photo, foreground)
    assert path.name == "photo_points.ply"
    header, vertices = read_ply(path)
    assert header[:3] == ["ply", "format binary_little_endian 1.0", f"element vertex {foreground.sum() - 1}"]
    assert header[3:] == [
        "property float x", "property float y", "property float z",
        "property uchar red", "property uchar green", "property uchar blue", "end_header",
    ]
    keep = foreground.copy()
    keep[height // 2, width // 2] = False
    assert len(vertices) == keep.sum()
    xyz = np.stack([vertices["x"], vertices["y"], vertices["z"]], axis=1)
    rgb = np.stack([vertices["red"], vertices["green"], vertices["blue"]], axis=1)
    np.testing.assert_array_equal(xyz, points[keep])
    np.testing.assert_array_equal(rgb, photo[keep])


def test_matting_alpha_and_rgba_cutout(tmp_path, photo):
    height, width = photo.shape[:2]
    alpha = cv2.GaussianBlur(_ellipse_mask(height, width).astype(np.float32), (0, 0), 3)
    alpha_path, cutout_path = export.write_matting(tmp_path, "photo", photo, alpha)
    assert (alpha_path.name, cutout_path.name) == ("photo_alpha.png", "photo_cutout.png")
    with Image.open(alpha_path) as matte, Image.open(cutout_path) as cutout:
        assert matte.mode == "L" and cutout.mode == "RGBA"
        expected = np.round(alpha * 255).astype(np.uint8)
        assert np.abs(np.asarray(matte).astype(int) - expected).max() <= 1
        rgba = np.asarray(cutout)
    np.testing.assert_array_equal(rgba[..., :3], photo)
    np.testing.assert_array_equal(rgba[..., 3], np.asarray(Image.open(alpha_path)))


def test_picture_png_round_trip(tmp_path, photo):
    (path,) = export.write_picture(tmp_path, "photo", "_composite", photo)
    assert path == tmp_path / "photo_composite.png"
    with Image.open(path) as image:
        assert image.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(image), photo)
    with pytest.raises(ValueError):
        export.write_picture(tmp_path, "photo", "/../x", photo)
    with pytest.raises(ValueError):
        export.write_picture(tmp_path, "photo", "_f", photo.astype(np.float32))


def test_writes_are_atomic_and_stems_stay_in_the_folder(tmp_path, monkeypatch):
    seg = np.zeros((8, 8), np.uint8)
    for stem in ("../escape", "a/b", "", "..", "a\\b"):
        with pytest.raises(ValueError):
            export.write_segmentation(tmp_path, stem, seg)
    out = tmp_path / "new" / "folder"
    (first,) = export.write_depth(out, "frame", np.ones((4, 4)))
    old = first.read_bytes()

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        export.write_depth(out, "frame", np.zeros((4, 4)))
    assert first.read_bytes() == old, "a failed write leaves the previous file whole"
    assert sorted(p.name for p in out.iterdir()) == ["frame_depth.npy"], "no temporary file is left behind"
