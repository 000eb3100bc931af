"""Pictures: sizes, exact palette colours, masked backgrounds, turbo depth, matting, PCA, pose and grid."""

from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from sapiens2.data.metadata import body_parts, keypoints308
from sapiens2.outputs import pictures as visualize
from sapiens2.vision.pose_decoding import Person

ASSETS = Path(__file__).resolve().parents[1] / "assets"


@pytest.fixture(scope="module", params=["grace_hopper.jpg", "astronaut.png"])
def photo(request) -> np.ndarray:
    return np.asarray(Image.open(ASSETS / request.param).convert("RGB"))


def _body_parts_map(height: int, width: int) -> np.ndarray:
    """A synthetic segmentation: torso, face, hair and a hand on a background."""
    seg = np.zeros((height, width), np.uint8)
    cv2.rectangle(seg, (width // 5, height // 2), (4 * width // 5, height - 1), 23, -1)
    cv2.ellipse(seg, (width // 2, height // 4), (width // 8, height // 7), 0, 0, 360, 3, -1)
    cv2.ellipse(seg, (width // 2, height // 8), (width // 7, height // 14), 0, 0, 360, 4, -1)
    cv2.circle(seg, (width // 5, height - height // 10), max(2, width // 30), 15, -1)
    return seg


def _sphere_normals(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    n = np.stack([x / width - 0.5, 0.5 - y / height, np.full_like(x, 0.6)], axis=-1)
    return n / np.linalg.norm(n, axis=-1, keepdims=True)


def test_every_picture_has_the_input_size(photo):
    height, width = photo.shape[:2]
    seg = _body_parts_map(height, width)
    features = np.random.default_rng(0).standard_normal((16, 8, 6)).astype(np.float32)
    alpha = (seg > 0).astype(np.float32)
    depth = np.linspace(1.0, 3.0, height * width, dtype=np.float32).reshape(height, width)
    pictures = [
        visualize.draw_pose(photo, [], keypoints308()),
        visualize.overlay_segmentation(photo, seg, body_parts().palette),
        visualize.normals_picture(_sphere_normals(height, width), seg == 0),
        visualize.depth_picture(depth, seg > 0),
        visualize.alpha_picture(alpha),
        visualize.cutout_on_checkerboard(photo, alpha),
        visualize.checkerboard(height, width),
        visualize.pca_picture(features, (height, width)),
    ]
    for picture in pictures:
        assert picture.dtype == np.uint8 and picture.shape == (height, width, 3)


def test_segmentation_palette_exactly_where_the_mask_says(photo):
    seg = _body_parts_map(*photo.shape[:2])
    palette = np.array(body_parts().palette, dtype=np.uint8)
    solid = visualize.overlay_segmentation(photo, seg.astype(np.int64), body_parts().palette, opacity=1.0)
    np.testing.assert_array_equal(solid, palette[seg])
    np.testing.assert_array_equal(visualize.overlay_segmentation(photo, seg, palette, opacity=0.0), photo)
    rgba = np.dstack([photo, np.full(photo.shape[:2], 255, np.uint8)])
    np.testing.assert_array_equal(visualize.overlay_segmentation(rgba, seg, palette, opacity=0.0), photo)
    half = visualize.overlay_segmentation(photo, seg, palette, opacity=0.5).astype(int)
    expected = (photo.astype(int) + palette[seg]) / 2
    assert np.abs(half - expected).max() <= 1
    with pytest.raises(ValueError):
        visualize.overlay_segmentation(photo, np.full(photo.shape[:2], 29), palette)
    with pytest.raises(ValueError):
        visualize.overlay_segmentation(photo, seg[:-1], palette)


def test_legend_lists_present_classes_by_share():
    seg = _body_parts_map(300, 240)
    meta = body_parts()
    legend = visualize.segmentation_legend(seg, meta)
    counts = np.bincount(seg.ravel(), minlength=29)
    expected = sorted((k for k in range(1, 29) if counts[k]), key=lambda k: -counts[k])
    # The colour swatches down the left edge, top to bottom.
    column = legend[:, 20]
    swatches = [tuple(c) for i, c in enumerate(column) if (i == 0 or tuple(column[i - 1]) != tuple(c))]
    swatches = [c for c in swatches if c in set(meta.palette)]
    assert swatches == [meta.palette[k] for k in expected]
    assert legend.dtype == np.uint8 and legend.ndim == 3
    empty = visualize.segmentation_legend(np.zeros((10, 10), np.int32), meta)
    assert empty.shape[0] < legend.shape[0]


def test_normals_background_is_black(photo):
    height, width = photo.shape[:2]
    seg = _body_parts_map(height, width)
    normals = _sphere_normals(height, width)
    picture = visualize.normals_picture(normals, seg == 0)
    assert not picture[seg == 0].any()
    expected = (normals[seg > 0] + 1) / 2 * 255
    assert np.abs(picture[seg > 0] - expected).max() <= 1
    assert np.abs(visualize.normals_picture(normals).astype(float) - (normals + 1) / 2 * 255).max() <= 1


def _reference_depth_colors(depth: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The reference documentation's recipe: turbo on inverse depth between the 1st and 99th percentiles."""
    matplotlib = pytest.importorskip("matplotlib")
    values = depth[mask].astype(np.float64)
    low, high = np.percentile(values, [1, 99])
    inverse = 1.0 / np.maximum(values, 1e-6)
    inverse_low, inverse_high = 1.0 / max(high, 1e-6), 1.0 / max(low, 1e-6)
    t = np.clip((inverse - inverse_low) / (inverse_high - inverse_low + 1e-8), 0, 1)
    return (matplotlib.colormaps["turbo"](t)[:, :3] * 255).astype(np.uint8)


def test_turbo_table_matches_matplotlib():
    matplotlib = pytest.importorskip("matplotlib")
    reference = (matplotlib.colormaps["turbo"](np.arange(256))[:, :3] * 255).astype(int)
    assert np.abs(visualize._turbo_table()[:, 0].astype(int) - reference).max() <= 1


def test_depth_picture_follows_the_reference_recipe(photo):
    height, width = photo.shape[:2]
    seg = _body_parts_map(height, width)
    y, x = np.mgrid[0:height, 0:width]
    depth = (1.5 + 2.0 * y / height + 0.5 * np.sin(x / 17.0)).astype(np.float32)
    depth[0, 0] = np.nan
    picture = visualize.depth_picture(depth, seg > 0)
    assert (picture[seg == 0] == visualize.DEPTH_BACKGROUND).all()
    difference = np.abs(picture[seg > 0].astype(int) - _reference_depth_colors(depth, seg > 0))
    assert np.mean(difference.max(axis=1) > 2) < 0.01  # only pixels on a colour-bin edge may differ
    assert difference.max() <= 16  # and then by one turbo step
    near = np.unravel_index(np.argmin(np.where(seg > 0, depth, np.inf)), depth.shape)
    far = (height - 1, width // 2)
    assert picture[near][0] > picture[near][2], "near is red"
    assert picture[far][2] > picture[far][0], "far is blue"
    nobody = visualize.depth_picture(depth, np.zeros_like(seg, bool))
    assert (nobody == visualize.DEPTH_BACKGROUND).all()


def test_alpha_checkerboard_and_cutout(photo):
    height, width = photo.shape[:2]
    alpha = np.zeros((height, width), np.float32)
    alpha[:, : width // 2] = 1.0
    alpha[:, width // 2 : width // 2 + 4] = 0.5
    grey = visualize.alpha_picture(alpha)
    assert (grey[:, : width // 2] == 255).all() and (grey[:, width // 2 + 4 :] == 0).all()
    assert (grey[:, width // 2] == 128).all()
    np.testing.assert_array_equal(visualize.alpha_picture(np.round(alpha * 255).astype(np.uint8)), grey)

    board = visualize.checkerboard(height, width, cell=10)
    assert set(np.unique(board)) == set(visualize.CHECKER_GREYS)
    assert board[0, 0, 0] != board[0, 10, 0] and board[0, 0, 0] != board[10, 0, 0]
    assert board[0, 0, 0] == board[10, 10, 0] == board[9, 9, 0]

    cutout = visualize.cutout_on_checkerboard(photo, alpha)
    np.testing.assert_array_equal(cutout[:, : width // 2], photo[:, : width // 2])
    transparent = np.s_[:, width // 2 + 4 :]
    np.testing.assert_array_equal(cutout[transparent], visualize.checkerboard(height, width)[transparent])


def test_cutout_blends_like_one_whole_picture_blend(photo):
    height, width = photo.shape[:2]
    alpha = np.random.default_rng(2).uniform(-0.2, 1.2, (height, width)).astype(np.float32)
    weight = visualize.alpha_to_uint8(alpha).astype(np.float32) / np.float32(255)
    board = visualize.checkerboard(height, width)
    expected = cv2.blendLinear(np.ascontiguousarray(photo[..., :3]), board, weight, 1.0 - weight)
    np.testing.assert_array_equal(visualize.cutout_on_checkerboard(photo, alpha), expected)


def test_label_counts_count_every_class():
    seg = np.random.default_rng(3).integers(0, 29, (50, 70)).astype(np.uint8)
    np.testing.assert_array_equal(visualize.label_counts(seg, 29), np.bincount(seg.ravel(), minlength=29))
    assert visualize.label_counts(np.zeros((2, 2), np.int64), 3).tolist() == [4, 0, 0]


def test_pca_separates_regions_and_is_stable():
    rng = np.random.default_rng(1)
    regions = np.zeros((12, 9), int)
    regions[4:, 3:7] = 1
    regions[:3, :] = 2
    centres = rng.standard_normal((3, 48)).astype(np.float32) * 4
    features = centres[regions].transpose(2, 0, 1) + 0.1 * rng.standard_normal((48, 12, 9)).astype(np.float32)
    picture = visualize.pca_picture(features, (120, 90))
    assert picture.shape == (120, 90, 3)
    coarse = cv2.resize(picture, (9, 12), interpolation=cv2.INTER_NEAREST).astype(int)
    means = [coarse[regions == r].mean(axis=0) for r in range(3)]
    assert min(np.abs(means[a] - means[b]).max() for a, b in [(0, 1), (0, 2), (1, 2)]) > 60
    np.testing.assert_array_equal(picture, visualize.pca_picture(features.copy(), (120, 90)))
    with pytest.raises(ValueError):
        visualize.pca_picture(features[0], (120, 90))


def _person(meta, points: dict, box=(0, 0, 400, 400)):
    keypoints = np.zeros((len(meta.names), 2))
    scores = np.zeros(len(meta.names))
    for name, (xy, score) in points.items():
        keypoints[meta.names.index(name)] = xy
        scores[meta.names.index(name)] = score
    return Person(box, keypoints, scores)


def test_pose_draws_only_confident_points_and_their_links():
    meta = keypoints308()
    canvas = np.zeros((400, 400, 3), np.uint8)
    person = _person(meta, {
        "left_shoulder": ((100, 100), 0.9), "left_elbow": ((100, 300), 0.8),
        "right_shoulder": ((300, 100), 0.1), "tip_of_chin": ((300, 300), 0.9),
    }, box=(20, 20, 360, 360))
    drawn = visualize.draw_pose(canvas, [person], meta, threshold=0.3)
    assert not canvas.any(), "the input is not modified"
    shoulder, chin = meta.names.index("left_shoulder"), meta.names.index("tip_of_chin")
    assert tuple(drawn[100, 100]) == meta.keypoint_colors[shoulder]
    assert tuple(drawn[300, 300]) == meta.keypoint_colors[chin]
    link = meta.links.index((meta.names.index("left_shoulder"), meta.names.index("left_elbow")))
    across_link = np.abs(drawn[200, 97:104].astype(int) - meta.link_colors[link]).sum(axis=1)
    assert across_link.min() <= 40, "the line is anti-aliased but reaches its colour"
    assert not drawn[80:120, 280:320].any(), "a point under the threshold is not drawn"
    body_area = (drawn[70:130, 70:130].any(axis=2)).sum()
    face_area = (drawn[270:330, 270:330].any(axis=2)).sum()
    assert 0 < face_area < body_area / 4, "face points are small next to body joints"
    boxed = visualize.draw_pose(canvas, [person], meta, show_boxes=True)
    assert (boxed[19:22, 200] > 200).all(axis=1).any() and not drawn[19:22, 200].any()


def test_pose_sizes_grow_with_the_image(photo):
    meta = keypoints308()
    height, width = photo.shape[:2]
    areas = []
    for scale in (1, 4):
        image = cv2.resize(photo, (width * scale, height * scale))
        person = _person(meta, {"nose": ((width * scale / 2, height * scale / 2), 1.0)},
                         box=(0, 0, width * scale, height * scale))
        changed = (visualize.draw_pose(image, [person], meta) != image).any(axis=2)
        areas.append(changed.sum())
    assert areas[1] > 8 * areas[0]
    picture = visualize.draw_pose(photo, [_person(meta, {"nose": ((np.nan, 1e12), 1.0)})], meta)
    np.testing.assert_array_equal(picture, photo)


def test_pictures_for_the_page_are_shrunk_to_a_longest_side():
    picture = np.zeros((6000, 8000, 3), np.uint8)
    assert visualize.fit_for_display(picture, 4096).shape == (3072, 4096, 3)
    small = np.zeros((600, 512, 3), np.uint8)
    assert visualize.fit_for_display(small, 4096) is small
