"""Training data: layouts and their errors, heatmap targets against the package's decoder, flips against the
models' conventions, the official optimizer groups and schedule."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
import torch
from PIL import Image
from tiny_datasets import CLASS_NAMES, write_pointmaps, write_pose, write_segmentation

from sapiens2.data.metadata import body_parts
from sapiens2.errors import DatasetError
from sapiens2.models import losses
from sapiens2.models.modeling import flip_back
from sapiens2.training import augment, codecs, datasets, optim
from sapiens2.training.augment import DenseSample
from sapiens2.training.samples import canonical_pointmap
from sapiens2.vision.pose_decoding import decode_keypoints
from sapiens2.vision.processing import BOX_PADDING, boxes_xywh_to_cxcywh, crop_windows

# ---- heatmap targets ------------------------------------------------------------------------------------


def _crop_transform(box: list[float], input_size: tuple[int, int]) -> np.ndarray:
    center, size = crop_windows(boxes_xywh_to_cxcywh(torch.tensor([box])), input_size, BOX_PADDING)
    return augment.udp_warp_matrix(center[0].double().numpy(), size[0].double().numpy(), 0.0, input_size)


@pytest.mark.parametrize("input_size", [(1024, 768), (256, 192)])
def test_encoded_keypoints_decode_back_within_005_pixels(input_size):
    rng = np.random.default_rng(0)
    box = [130.3, 52.7, 210.4, 388.1]
    photo_points = np.array([box[:2]]) + rng.uniform(0.1, 0.9, (6, 2)) * np.array([box[2:]])
    crop_points = augment.transform_points(photo_points, _crop_transform(box, input_size))
    heatmap_size = (input_size[0] // 4, input_size[1] // 4)
    sigma = codecs.default_sigma(heatmap_size)
    assert sigma == (6.0 if input_size == (1024, 768) else 1.5)
    heatmaps, weights = codecs.encode_heatmaps(crop_points, np.ones(6), input_size, heatmap_size, sigma)
    assert weights.tolist() == [1.0] * 6
    decoded, _ = decode_keypoints(torch.from_numpy(heatmaps)[None], [box], input_size)
    assert np.abs(decoded[0].numpy() - photo_points).max() < 0.05


def test_unlabelled_and_outside_keypoints_get_no_target():
    points = np.array([[10.0, 10.0], [20.0, 20.0], [-80.0, 10.0]])
    heatmaps, weights = codecs.encode_heatmaps(points, np.array([1.0, 0.0, 1.0]), (64, 48), (16, 12), 1.0)
    assert weights.tolist() == [1.0, 0.0, 0.0]
    assert heatmaps[0].max() > 0.5 and heatmaps[1:].max() == 0


def test_flipped_pose_targets_are_the_flipped_back_heatmaps():
    """A mirrored crop's targets, mapped back the way the model maps flip-test heatmaps, are the
    original targets."""
    rng = np.random.default_rng(1)
    pairs = [(1, 2), (3, 4)]
    points, visible = rng.uniform(3, 44, (5, 2)), np.ones(5)
    original, _ = codecs.encode_heatmaps(points, visible, (64, 48), (16, 12), 1.0)
    mirrored_points, mirrored_visible = augment.flip_keypoints(points, visible, 48, pairs)
    mirrored, _ = codecs.encode_heatmaps(mirrored_points, mirrored_visible, (64, 48), (16, 12), 1.0)
    restored = flip_back(torch.from_numpy(mirrored)[None], pairs)[0]
    assert torch.allclose(restored, torch.from_numpy(original), atol=1e-6)


# ---- flips of dense labels ------------------------------------------------------------------------------


def test_left_right_classes_are_found_from_names():
    official = [(5, 14), (6, 15), (7, 16), (8, 17), (9, 18), (10, 19), (11, 20), (12, 21)]
    assert sorted(datasets.mirrored_pairs(body_parts().names)) == official
    assert datasets.mirrored_pairs(CLASS_NAMES) == ((2, 3),)
    assert datasets.mirrored_pairs(["Right Hand", "hand-left", "leftover"]) == ((1, 0),)


def test_flipped_segmentation_swaps_left_and_right_classes():
    classes = np.array([[0, 2, 1, 3, 255]], dtype=np.uint8)
    order = augment.flip_order(4, datasets.mirrored_pairs(CLASS_NAMES)).astype(np.uint8)
    flipped = augment.flip(DenseSample(np.zeros((1, 5, 3), np.uint8), {"classes": classes}), order)
    assert flipped.maps["classes"].tolist() == [[255, 2, 1, 3, 0]]


def test_flipped_normals_negate_x():
    normals = np.random.default_rng(0).normal(size=(4, 6, 3)).astype(np.float32)
    flipped = augment.flip(DenseSample(np.zeros((4, 6, 3), np.uint8), {"normals": normals.copy()}))
    expected = normals[:, ::-1] * np.array([-1, 1, 1], dtype=np.float32)
    assert np.array_equal(flipped.maps["normals"], expected)


def test_flipped_depth_gives_the_mirrored_pointmap_with_x_negated():
    rng = np.random.default_rng(0)
    depth = rng.uniform(2, 3, (6, 8)).astype(np.float32)
    camera = np.array([[700.0, 0, 3.2], [0, 710.0, 2.4], [0, 0, 1]])
    mask = np.ones((6, 8), bool)
    points, _ = canonical_pointmap(depth, camera, mask)
    flipped = augment.flip(DenseSample(np.zeros((6, 8, 3), np.uint8), {"depth": depth}, camera))
    flipped_points, _ = canonical_pointmap(flipped.maps["depth"], flipped.camera, mask)
    expected = points[:, :, ::-1] * np.array([-1, 1, 1], dtype=np.float32)[:, None, None]
    assert np.allclose(flipped_points, expected, atol=1e-5)


def test_resize_crop_and_pad_keep_the_camera_consistent():
    """Points rebuilt from a transformed depth map with the transformed camera are the same 3D points."""
    depth = np.full((40, 48), 2.5, np.float32)
    camera = np.array([[60.0, 0, 23.5], [0, 60.0, 19.5], [0, 0, 1]])
    sample = DenseSample(np.zeros((40, 48, 3), np.uint8), {"depth": depth}, camera)
    moved = augment.fit(
        augment.crop(augment.resize(sample, (80, 96)), 10, 20, 50, 60), (64, 48), keep_ratio=True
    )
    scale, left, top = 48 / 60, 0, (64 - 40) // 2
    row, column = 30, 20  # a pixel of the output, inside the content
    source_column = ((column - left + 0.5) / scale - 0.5 + 20 + 0.5) / 2 - 0.5
    source_row = ((row - top + 0.5) / scale - 0.5 + 10 + 0.5) / 2 - 0.5
    x_out = (column - moved.camera[0, 2]) * 2.5 / moved.camera[0, 0]
    y_out = (row - moved.camera[1, 2]) * 2.5 / moved.camera[1, 1]
    assert x_out == pytest.approx((source_column - camera[0, 2]) * 2.5 / camera[0, 0], abs=1e-6)
    assert y_out == pytest.approx((source_row - camera[1, 2]) * 2.5 / camera[1, 1], abs=1e-6)


def test_fitted_camera_matches_the_one_that_made_the_pointmap(tmp_path):
    write_pointmaps(tmp_path / "with", count=1, intrinsics=True)
    write_pointmaps(tmp_path / "without", count=1)
    [given] = datasets.read_pointmaps(tmp_path / "with")
    [fitted] = datasets.read_pointmaps(tmp_path / "without")
    depth, expected = datasets.load_depth_and_camera(given, (48, 40))
    _, camera = datasets.load_depth_and_camera(fitted, (48, 40))
    assert np.allclose(camera, expected, rtol=1e-4, atol=1e-3)
    assert (depth > 0).sum() > 100


def test_augmentations_are_the_same_for_the_same_seed(tmp_path):
    image = np.random.default_rng(0).integers(0, 255, (40, 48, 3), dtype=np.uint8)
    sample = DenseSample(image, {"classes": (image[..., 0] > 128).astype(np.uint8)})
    one = augment.augment_segmentation(np.random.default_rng(5), sample, (32, 24), None)
    two = augment.augment_segmentation(np.random.default_rng(5), sample, (32, 24), None)
    assert np.array_equal(one.image, two.image) and np.array_equal(one.maps["classes"], two.maps["classes"])


# ---- layouts and their errors ---------------------------------------------------------------------------


def test_pose_layout_reads_names_skeleton_and_flip_pairs(tmp_path):
    records, keypoints = datasets.read_pose(write_pose(tmp_path, count=3))
    assert len(records) == 3 and records[0].keypoints.shape == (5, 2)
    assert keypoints.flip_pairs == ((1, 2), (3, 4))
    assert keypoints.skeleton == ((0, 1), (0, 2), (0, 3), (0, 4))
    assert records[0].visible.tolist() == [1, 1, 1, 1, 0]


def test_pose_layout_errors_name_file_and_field(tmp_path):
    write_pose(tmp_path, count=2)
    data = json.loads((tmp_path / "annotations.json").read_text())
    data["annotations"][1]["keypoints"] = data["annotations"][1]["keypoints"][:-3]
    (tmp_path / "annotations.json").write_text(json.dumps(data))
    with pytest.raises(
        DatasetError, match=r"annotations\.json: annotations\[1\]\.keypoints must hold 15 numbers"
    ):
        datasets.read_pose(tmp_path)
    data["annotations"][1]["keypoints"] += [1, 2, 2]
    data["images"][0]["file_name"] = "missing.png"
    (tmp_path / "annotations.json").write_text(json.dumps(data))
    with pytest.raises(DatasetError, match=r"annotations\[0\]\.image_id: image file 'missing\.png'"):
        datasets.read_pose(tmp_path)


def test_segmentation_layout_errors(tmp_path):
    write_segmentation(tmp_path, count=2)
    (tmp_path / "masks" / "photo_1.png").unlink()
    with pytest.raises(DatasetError, match=r"masks: no \.png file for the photos photo_1"):
        datasets.read_segmentation(tmp_path)
    cv2.imwrite(str(tmp_path / "masks" / "photo_1.png"), np.full((60, 44), 7, np.uint8))
    records, classes = datasets.read_segmentation(tmp_path)
    assert classes.names == CLASS_NAMES
    with pytest.raises(
        DatasetError, match=r"photo_1\.png: class ids \[7\] are out of range: the model has 4"
    ):
        datasets.load_classes(records[1].target, len(classes.names), (60, 44))
    cv2.imwrite(str(tmp_path / "masks" / "photo_1.png"), np.zeros((30, 44), np.uint8))
    with pytest.raises(DatasetError, match=r"photo_1\.png: 30x44 pixels, but its photo is 60x44"):
        datasets.load_classes(records[1].target, 4, (60, 44))
    (tmp_path / "classes.json").write_text(json.dumps({"names": ["a", "b"], "palette": [[0, 0, 0]]}))
    with pytest.raises(
        DatasetError, match=r"classes\.json: 'palette' must hold one \[r, g, b\] per class \(2\)"
    ):
        datasets.read_classes(tmp_path / "classes.json")


def test_depth_maps_without_cameras_are_refused(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "depth").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "a.png"), np.zeros((8, 8, 3), np.uint8))
    np.save(tmp_path / "depth" / "a.npy", np.ones((8, 8), np.float32))
    with pytest.raises(DatasetError, match=r"depth maps need their camera; missing for a\.npy"):
        datasets.read_pointmaps(tmp_path)


# ---- optimizer and schedule -----------------------------------------------------------------------------


def test_layer_decay_and_weight_decay_groups_follow_the_official_runner():
    from tiny_models import tiny_config

    from sapiens2.models.config import Sapiens2Config
    from sapiens2.models.modeling import build_model

    model = build_model(Sapiens2Config.from_dict(tiny_config("seg")))
    groups = optim.parameter_groups(model, lr=1.0, layer_decay=0.5)
    rate = {id(p): (group["lr"], group["weight_decay"]) for group in groups for p in group["params"]}
    named = dict(model.named_parameters())
    # 3 blocks: embeddings are layer 0 (0.5^4), block i is layer i + 1, the head and final norm layer 4.
    assert rate[id(named["backbone.patch_embed.projection.weight"])] == (0.5**4, 0.1)
    assert rate[id(named["backbone.cls_token"])] == (0.5**4, 0.1)
    assert rate[id(named["backbone.blocks.0.attn.wq.weight"])] == (0.5**3, 0.1)
    assert rate[id(named["backbone.blocks.2.attn.wq.bias"])] == (0.5, 0.0)
    assert rate[id(named["backbone.ln1.weight"])] == (1.0, 0.0)
    assert rate[id(named["decode_head.conv_seg.weight"])] == (1.0, 0.1)


def test_schedule_warms_up_from_a_thousandth_then_decays_linearly_to_zero():
    assert optim.lr_factor(0, 500, 10000) == pytest.approx(1e-3)
    assert optim.lr_factor(250, 500, 10000) == pytest.approx(1e-3 + 0.999 / 2)
    assert optim.lr_factor(500, 500, 10000) == 1.0
    assert optim.lr_factor(5250, 500, 10000) == pytest.approx(0.5)
    assert optim.lr_factor(10000, 500, 10000) == 0.0
    assert optim.default_warmup(20000) == 500 and optim.default_warmup(100) == 5


def test_canonical_pointmap_scale_is_the_canonical_focal_over_fx():
    _, scale = canonical_pointmap(
        np.ones((2, 2), np.float32), np.diag([384.0, 384.0, 1.0]), np.ones((2, 2), bool)
    )
    assert scale == losses.CANONICAL_FOCAL_LENGTH / 384.0 == 2.0


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.update(bbox=[5000, 5000, 30, 40]), r"annotations\[1\]\.bbox .* mostly outside"),
        (lambda a: a["keypoints"].__setitem__(slice(3, 5), [58.0, -3.0]), None),  # just past the border
        (
            lambda a: a["keypoints"].__setitem__(slice(3, 5), [900.0, -700.0]),
            r"annotations\[1\]\.keypoints: 1 labelled keypoint\(s\) lie outside its photo \(56x64 pixels\), "
            r"the first left_hand at \[900\.0, -700\.0\]",
        ),
    ],
)
def test_people_outside_their_photo_are_refused_by_name(tmp_path, change, message):
    write_pose(tmp_path, count=2)
    data = json.loads((tmp_path / "annotations.json").read_text())
    change(data["annotations"][1])
    (tmp_path / "annotations.json").write_text(json.dumps(data))
    if message is None:  # annotators place a hidden hand a little past the border: kept
        assert len(datasets.read_pose(tmp_path)[0]) == 2
        return
    with pytest.raises(DatasetError, match=message):
        datasets.read_pose(tmp_path)


def test_training_photos_above_the_pixel_limit_are_refused_before_decoding(tmp_path, monkeypatch):
    write_pose(tmp_path, count=2)
    huge = tmp_path / "images" / "person_1.png"
    Image.new("L", (20000, 20000)).save(huge)  # a few hundred KB of zeros that decode to 400 megapixels
    with pytest.raises(DatasetError, match=r"person_1\.png: The image is too large: it unpacks to more"):
        datasets.read_pose(tmp_path)
    Image.new("L", (6000, 5000)).save(huge)
    with pytest.raises(DatasetError, match=r"person_1\.png: The image is too large: 6000x5000 pixels"):
        datasets.load_rgb(huge)
    monkeypatch.setenv("SAPIENS2_MAX_MEGAPIXELS", "40")
    assert datasets.photo_size(huge) == (5000, 6000)


def test_matting_trains_with_the_layer_decay_and_clipping_of_its_official_config():
    from sapiens2.training.tasks import get_training_task

    matting, pose = get_training_task("matting"), get_training_task("pose")
    assert (matting.layer_decay, matting.max_grad_norm) == (0.9, 4.0)
    assert (pose.layer_decay, pose.max_grad_norm) == (0.8, 2.0)
