"""Post-processing against transformers' Sapiens2ImageProcessor.post_process_* on random model outputs.

Tolerances: pose keypoints 1e-3 px (0.05 px for maps with no positive value) and scores 1e-5; dense
maps 1e-5 (normals, mattes) or 1e-5 relative (pointmaps); segmentation labels equal except at float32
ties (top-2 logits within 1e-5); composites equal, or within one uint8 step where the reference
interpolates a 1x1 colour tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import Sapiens2ImageProcessor

from sapiens2.models.kinds import NORMAL
from sapiens2.vision.dense import (
    composite,
    matting_to_image,
    normals_to_image,
    pointmap_to_image,
    resize_maps,
    segmentation_labels,
    to_hwc,
    unit_vectors_,
)
from sapiens2.vision.pose_decoding import DARK_KERNEL_SIZE, average_flip, decode_keypoints
from sapiens2.vision.processing import BOX_PADDING, ProcessorSettings, as_boxes

KEYPOINT_TOLERANCE = 1e-3
UNDEFINED_TOLERANCE = 0.05  # keypoints of maps with no positive value (score <= 0)
SCORE_TOLERANCE = 1e-5
MAP_TOLERANCE = 1e-5
TIE = 1e-5


def _reference(size: tuple[int, int], **kwargs) -> Sapiens2ImageProcessor:
    return Sapiens2ImageProcessor(size={"height": size[0], "width": size[1]}, **kwargs)


# --- segmentation -------------------------------------------------------------------------------------


def _assert_labels_equal_but_ties(
    ours: torch.Tensor, scores: torch.Tensor, reference: torch.Tensor, tie: float = TIE
) -> None:
    assert ours.dtype == torch.int64 and ours.shape == reference.shape
    differ = ours != reference
    if differ.any():  # only where the two best classes tie up to rounding
        top2 = scores.float().movedim(0, -1)[differ].topk(2, dim=-1).values
        assert ((top2[:, 0] - top2[:, 1]).abs() <= tie * top2[:, 0].abs().clamp_min(1)).all()


@pytest.mark.parametrize(
    "size",
    [(100, 75), (20, 15), (33, 71), (32, 24), (1, 1)],
    ids=["up", "down", "odd", "same", "single"],
)
def test_segmentation_matches_reference(size: tuple[int, int]) -> None:
    logits = torch.randn(2, 29, 32, 24, generator=torch.Generator().manual_seed(0))
    reference = _reference((32, 24)).post_process_semantic_segmentation(
        SimpleNamespace(logits=logits), target_sizes=[size, size], return_segmentation_scores=True
    )
    labels = segmentation_labels(logits, size)
    scores = resize_maps(logits, size)
    for index, expected in enumerate(reference):
        assert torch.equal(scores[index], expected["segmentation_scores"])
        _assert_labels_equal_but_ties(labels[index], scores[index], expected["segmentation"])


def test_segmentation_without_resize_matches_reference() -> None:
    logits = torch.randn(2, 5, 16, 12, generator=torch.Generator().manual_seed(1))
    reference = _reference((16, 12)).post_process_semantic_segmentation(SimpleNamespace(logits=logits))
    for ours, expected in zip(segmentation_labels(logits), reference, strict=True):
        assert torch.equal(ours, expected)
    assert resize_maps(logits, (16, 12)) is logits


def _body_part_logits(height: int, width: int, classes: int, seed: int) -> torch.Tensor:
    """Smooth logits with large regions, like a body-part segmentation (few cells on class borders)."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randn(1, classes, 6, 5, generator=generator) * 4
    noise = torch.randn(1, classes, height, width, generator=generator) * 0.05
    return torch.nn.functional.interpolate(coarse, size=(height, width), mode="bicubic") + noise


@pytest.mark.parametrize("classes", [29, 257])  # 257: labels no longer fit the uint8 shortcut
def test_segmentation_of_smooth_logits_at_large_upscale(classes: int) -> None:
    logits = _body_part_logits(64, 48, classes, seed=2)
    size = (509, 383) if classes < 256 else (254, 191)
    scores = torch.nn.functional.interpolate(logits, size=size, mode="bilinear", align_corners=False)
    _assert_labels_equal_but_ties(segmentation_labels(logits, size)[0], scores[0], scores[0].argmax(0))


def test_segmentation_of_bfloat16_logits() -> None:
    logits = _body_part_logits(32, 24, 29, seed=3).to(torch.bfloat16)
    size = (101, 77)
    scores = torch.nn.functional.interpolate(logits, size=size, mode="bilinear", align_corners=False)
    labels = segmentation_labels(logits, size)
    _assert_labels_equal_but_ties(labels[0], scores[0], scores[0].argmax(0), tie=2 * 2**-7)


# --- pose ---------------------------------------------------------------------------------------------


def _heatmaps(persons: int, keypoints: int, height: int, width: int, seed: int) -> torch.Tensor:
    """Gaussian peaks (sigma 2 cells, heights 0.2 to 1) at sub-cell positions, with noise."""
    generator = torch.Generator().manual_seed(seed)
    centers = (
        torch.rand(persons, keypoints, 2, generator=generator) * torch.tensor([width - 5, height - 5]) + 2
    )
    peaks = torch.rand(persons, keypoints, 1, 1, generator=generator) * 0.8 + 0.2
    ys = torch.arange(height).view(1, 1, -1, 1)
    xs = torch.arange(width).view(1, 1, 1, -1)
    distance = (xs - centers[..., 0, None, None]) ** 2 + (ys - centers[..., 1, None, None]) ** 2
    noise = 0.01 * torch.randn(persons, keypoints, height, width, generator=generator)
    return peaks * torch.exp(-distance / 8) + noise


@dataclass(frozen=True)
class PersonPose:
    """One person as transformers' post_process_pose_estimation gives it."""

    keypoints: torch.Tensor
    scores: torch.Tensor
    labels: torch.Tensor
    box_xyxy: torch.Tensor


def decode_pose(
    heatmaps, boxes_xywh, input_size=(1024, 768), heatmaps_flipped=None, threshold=None
) -> list[PersonPose]:
    """decode_keypoints' results laid out like the reference's, keypoints at or under `threshold` dropped."""
    keypoints, scores = decode_keypoints(
        heatmaps, boxes_xywh, input_size, heatmaps_flipped, DARK_KERNEL_SIZE, BOX_PADDING
    )
    boxes = as_boxes(boxes_xywh)
    boxes_xyxy = torch.cat([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], dim=-1)
    labels = torch.arange(keypoints.shape[1])
    people = []
    for person_keypoints, person_scores, box in zip(keypoints, scores, boxes_xyxy, strict=True):
        keep = person_scores > threshold if threshold is not None else slice(None)
        people.append(PersonPose(person_keypoints[keep], person_scores[keep], labels[keep], box))
    return people


IMAGE_BOXES = [[[10.0, 20.0, 150.5, 300.25], [200.0, 5.0, 80.0, 60.0]], [[-30.0, 40.0, 400.0, 90.0]]]


def _assert_persons_match(ours: list, reference: list[list[dict]]) -> None:
    flat = [person for image in reference for person in image]
    assert len(ours) == len(flat)
    for person, expected in zip(ours, flat, strict=True):
        assert torch.equal(person.labels, expected["labels"])
        torch.testing.assert_close(person.scores, expected["scores"], rtol=0, atol=SCORE_TOLERANCE)
        # A map with no positive value has no keypoint: both decode it from the flat cells -1 and 0 with
        # a near-singular Hessian, so rounding is amplified there and only a looser match is asked.
        found = expected["scores"] > 0
        error = (person.keypoints - expected["keypoints"]).abs().amax(dim=-1)
        assert (error[found] <= KEYPOINT_TOLERANCE).all() and (error[~found] <= UNDEFINED_TOLERANCE).all()
        assert torch.equal(person.box_xyxy, expected["bbox"])


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("threshold", [None, 0.5])
def test_pose_matches_reference(flip: bool, threshold: float | None) -> None:
    input_size = (256, 192)
    heatmaps = _heatmaps(3, 17, 64, 48, seed=3)
    # The mirrored pass (already flipped back by the model) puts its peaks one cell to the right.
    flipped = heatmaps.roll(1, dims=-1) + 0.01 * torch.randn(heatmaps.shape) if flip else None
    boxes = [box for image in IMAGE_BOXES for box in image]
    reference = _reference(input_size).post_process_pose_estimation(
        SimpleNamespace(heatmaps=heatmaps),
        boxes=IMAGE_BOXES,
        outputs_flipped=SimpleNamespace(heatmaps=flipped) if flip else None,
        threshold=threshold,
    )
    ours = decode_pose(heatmaps, boxes, input_size, heatmaps_flipped=flipped, threshold=threshold)
    _assert_persons_match(ours, reference)
    if threshold is not None:
        assert 0 < sum(len(person.labels) for person in ours) < 3 * 17  # the threshold did drop some


def test_pose_at_default_size_matches_reference() -> None:
    heatmaps = _heatmaps(1, 20, 256, 192, seed=5)
    boxes = [[100.5, 40.25, 900.0, 2600.0]]
    reference = Sapiens2ImageProcessor().post_process_pose_estimation(
        SimpleNamespace(heatmaps=heatmaps), boxes=[boxes]
    )
    _assert_persons_match(decode_pose(heatmaps, np.array(boxes)), reference)


@pytest.mark.parametrize("kind", ["no-positive-value", "weak", "strong", "at-the-edge"])
def test_pose_of_unusual_heatmaps_matches_reference(kind: str) -> None:
    """Maps where the blur's rescaling or the border matters: no positive value (the reference decodes
    from cell -1 and reads the previous map), peaks near the 1e-3 log clamp or above the 50 one, peaks on
    the first and last cells."""
    heatmaps = _heatmaps(3, 6, 32, 24, seed=8)
    if kind == "no-positive-value":
        heatmaps[0, 0] = -heatmaps[0, 0].abs() - 0.1
        heatmaps[1, 3] = -heatmaps[1, 3].abs() - 0.1
    elif kind == "weak":
        heatmaps[:, :3] = heatmaps[:, :3].clamp_min(0) * 2e-3
    elif kind == "strong":
        heatmaps[:, 2:] *= 80
    else:
        heatmaps[:, :, 0, 0] = 5.0
        heatmaps[:, 3:, -1, -1] = 6.0
    boxes = [box for image in IMAGE_BOXES for box in image]
    reference = _reference((128, 96)).post_process_pose_estimation(
        SimpleNamespace(heatmaps=heatmaps), boxes=IMAGE_BOXES
    )
    _assert_persons_match(decode_pose(heatmaps, boxes, (128, 96)), reference)


def test_decode_keypoints_shapes_and_flip_average() -> None:
    heatmaps = _heatmaps(2, 5, 32, 24, seed=6)
    boxes = torch.tensor([[0.0, 0.0, 60.0, 80.0], [10.0, 10.0, 30.0, 30.0]])
    keypoints, scores = decode_keypoints(heatmaps, boxes, (128, 96))
    assert keypoints.shape == (2, 5, 2) and keypoints.dtype == torch.float32 and scores.shape == (2, 5)
    same, _ = decode_keypoints(heatmaps, boxes, (128, 96), heatmaps_flipped=heatmaps.clone())
    assert torch.equal(same, keypoints)
    assert torch.equal(average_flip(heatmaps, 3 * heatmaps), 2 * heatmaps)
    with pytest.raises(ValueError):
        decode_keypoints(heatmaps, boxes[:1], (128, 96))
    assert decode_pose(heatmaps[:0], np.zeros((0, 4))) == []


# --- normals and pointmaps ----------------------------------------------------------------------------


SOURCE_SIZES = [(100, 40), (30, 90), (48, 64)]


@pytest.mark.parametrize("source_size", SOURCE_SIZES, ids=["tall", "wide", "same-aspect"])
@pytest.mark.parametrize("target_size", [None, (17, 23)], ids=["photo-size", "target-size"])
def test_normals_match_reference(source_size: tuple[int, int], target_size: tuple[int, int] | None) -> None:
    normals = torch.randn(2, 3, 64, 48, generator=torch.Generator().manual_seed(7))
    reference = _reference((64, 48), do_pad=True).post_process_normal_estimation(
        SimpleNamespace(normals=normals),
        source_sizes=[source_size] * 2,
        target_sizes=None if target_size is None else [target_size] * 2,
    )
    settings = ProcessorSettings(height=64, width=48, do_pad=True)
    ours = normals_to_image(normals, source_size, settings, target_size)
    assert ours.shape == (2, 3, *(target_size or source_size))
    for one, expected in zip(ours, reference, strict=True):
        assert (one - expected["normals"]).abs().max() <= MAP_TOLERANCE


def test_normals_at_default_size_match_reference() -> None:
    normals = torch.randn(1, 3, 1024, 768, generator=torch.Generator().manual_seed(8))
    source_size = (600, 512)
    reference = Sapiens2ImageProcessor(do_pad=True).post_process_normal_estimation(
        SimpleNamespace(normals=normals), source_sizes=[source_size]
    )
    ours = normals_to_image(normals, source_size, ProcessorSettings.for_kind(NORMAL))
    assert (ours[0] - reference[0]["normals"]).abs().max() <= MAP_TOLERANCE


@pytest.mark.parametrize("with_scales", [True, False])
@pytest.mark.parametrize("source_size", SOURCE_SIZES, ids=["tall", "wide", "same-aspect"])
def test_pointmaps_match_reference(with_scales: bool, source_size: tuple[int, int]) -> None:
    generator = torch.Generator().manual_seed(9)
    pointmaps = torch.randn(2, 3, 64, 48, generator=generator) * 3
    scales = torch.rand(2, 1, generator=generator) + 0.5 if with_scales else None
    reference = _reference((64, 48), do_pad=True).post_process_pointmap_estimation(
        SimpleNamespace(pointmaps=pointmaps, scales=scales), source_sizes=[source_size] * 2
    )
    ours = pointmap_to_image(
        pointmaps, scales, source_size, ProcessorSettings(height=64, width=48, do_pad=True)
    )
    for one, expected in zip(ours, reference, strict=True):
        assert (one - expected["pointmap"]).abs().max() <= MAP_TOLERANCE * expected["pointmap"].abs().max()


def test_maps_of_unpadded_models_are_only_resized() -> None:
    normals = torch.randn(1, 3, 64, 48, generator=torch.Generator().manual_seed(10))
    reference = _reference((64, 48)).post_process_normal_estimation(
        SimpleNamespace(normals=normals), target_sizes=[(100, 40)]
    )
    ours = normals_to_image(normals, (100, 40), ProcessorSettings(height=64, width=48))
    assert (ours[0] - reference[0]["normals"]).abs().max() <= MAP_TOLERANCE


# --- matting ------------------------------------------------------------------------------------------


def _matting(seed: int) -> SimpleNamespace:
    generator = torch.Generator().manual_seed(seed)
    alphas = torch.rand(2, 1, 32, 24, generator=generator) * 1.1 - 0.05  # a little outside [0, 1]
    foregrounds = alphas * (torch.rand(2, 3, 32, 24, generator=generator) * 1.1 - 0.05)
    return SimpleNamespace(foregrounds=foregrounds, alphas=alphas)


@pytest.mark.parametrize("size", [None, (50, 70)])
def test_matting_matches_reference(size: tuple[int, int] | None) -> None:
    outputs = _matting(11)
    reference = _reference((32, 24)).post_process_image_matting(
        outputs, target_sizes=None if size is None else [size] * 2
    )
    foreground, alpha = matting_to_image(outputs.foregrounds, outputs.alphas, size)
    for index, expected in enumerate(reference):
        assert torch.equal(foreground[index], expected["foreground"])
        assert torch.equal(alpha[index], expected["alpha"])


def test_composite_over_an_image_matches_reference() -> None:
    outputs = _matting(12)
    background = np.random.default_rng(13).integers(0, 256, size=(41, 29, 3), dtype=np.uint8)
    reference = _reference((32, 24)).post_process_image_matting(
        outputs, target_sizes=[(300, 400)] * 2, backgrounds=background
    )
    foreground, alpha = matting_to_image(outputs.foregrounds, outputs.alphas, (300, 400))
    ours = composite(foreground, alpha, background)
    assert ours.dtype == torch.uint8 and ours.shape == (2, 3, 300, 400)
    for one, expected in zip(ours, reference, strict=True):
        assert torch.equal(one, expected["composite"])


def test_composite_over_a_colour_matches_reference() -> None:
    outputs = _matting(14)
    colour = (0, 177, 64)
    foreground, alpha = matting_to_image(outputs.foregrounds, outputs.alphas, (50, 70))
    ours = composite(foreground, alpha, colour)
    processor = _reference((32, 24))
    full = np.broadcast_to(np.array(colour, dtype=np.uint8), (50, 70, 3)).copy()
    exact = processor.post_process_image_matting(outputs, target_sizes=[(50, 70)] * 2, backgrounds=full)
    tiny = processor.post_process_image_matting(
        outputs,
        target_sizes=[(50, 70)] * 2,
        backgrounds=torch.tensor(colour, dtype=torch.uint8).view(3, 1, 1),
    )
    for one, expected, interpolated in zip(ours, exact, tiny, strict=True):
        assert torch.equal(one, expected["composite"])
        assert (one.int() - interpolated["composite"].int()).abs().max() <= 1


def test_transparent_composite_is_straight_rgba() -> None:
    generator = torch.Generator().manual_seed(15)
    alpha = torch.rand(2, 1, 40, 30, generator=generator)
    colour = torch.rand(2, 3, 40, 30, generator=generator)
    rgba = composite(alpha * colour, alpha, None)
    assert rgba.dtype == torch.uint8 and rgba.shape == (2, 4, 40, 30)
    assert torch.equal(rgba[:, 3:], (alpha * 255.999).to(torch.uint8))
    opaque = alpha[:, 0] > 0.05
    assert ((rgba[:, :3].float() / 255 - colour).abs().amax(1)[opaque] <= 1 / 255).all()


def test_composite_refuses_bad_backgrounds() -> None:
    foreground, alpha = matting_to_image(_matting(16).foregrounds, _matting(16).alphas)
    for background in [(0, 300, 0), (1, 2), np.zeros((4, 4), np.uint8), "green", torch.zeros(3, 4, 4).long()]:
        with pytest.raises(ValueError):
            composite(foreground, alpha, background)


def test_to_hwc() -> None:
    chw = torch.arange(24).view(2, 3, 4)
    assert to_hwc(chw).shape == (3, 4, 2) and to_hwc(chw)[1, 2, 1] == chw[1, 1, 2]
    assert to_hwc(chw[0]).shape == (3, 4)
    for dtype in (torch.uint8, torch.float32, torch.int64):  # planes interleaved by OpenCV, or by torch
        planes = torch.arange(3 * 5 * 7).view(1, 3, 5, 7).to(dtype)
        expected = planes[0].permute(1, 2, 0).numpy()
        np.testing.assert_array_equal(to_hwc(planes[0]), expected)
        pixels_last = planes.contiguous(memory_format=torch.channels_last)
        np.testing.assert_array_equal(to_hwc(pixels_last[0]), expected)
    view = to_hwc(pixels_last[0])
    view[0, 0, 0] = 99
    assert pixels_last[0, 0, 0, 0] == 99, "a channels-last tensor is read in place"


def test_channels_last_resize_is_the_resize_within_an_ulp() -> None:
    maps = torch.randn(2, 3, 40, 30, generator=torch.Generator().manual_seed(4))
    plain, pixels_last = resize_maps(maps, (97, 61)), resize_maps(maps, (97, 61), channels_last=True)
    assert pixels_last.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(pixels_last, plain, rtol=2e-7, atol=1e-6)


def test_unit_vectors_match_normalize() -> None:
    vectors = torch.randn(20, 30, 3, generator=torch.Generator().manual_seed(5))
    vectors[3, 4] = 0
    expected = F.normalize(vectors, dim=-1).numpy()
    unit = unit_vectors_(vectors.numpy().copy())
    np.testing.assert_allclose(unit, expected, rtol=0, atol=2e-7)
    assert not unit[3, 4].any()


def test_cpu_blur_equals_the_convolution_blur():
    """The OpenCV blur used on the CPU, a chunk of maps at a time, matches torch's zero-padded separable
    convolution: each blurred map's maximum and the values read from it."""
    from sapiens2.vision.pose_decoding import _conv_blur, _gaussian_kernel, _separable_blur_reads

    generator = torch.Generator().manual_seed(3)
    maps = torch.randn(2000, 40, 28, generator=generator)  # more than one chunk
    kernel = _gaussian_kernel(11, maps.dtype, maps.device)
    which = torch.randint(0, 2000, (500,), generator=generator)
    pixels = torch.randint(0, 40 * 28, (500,), generator=generator)
    maxima, values = _separable_blur_reads(maps, kernel, which, pixels)
    expected = _conv_blur(maps.unsqueeze(1), kernel)
    torch.testing.assert_close(maxima, expected.amax(dim=(1, 2, 3)), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(values, expected.view(2000, -1)[which, pixels], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("size", [(97, 41), (300, 217), (20, 17)])
def test_noisy_logits_take_the_banded_path_and_stay_exact(size):
    """Logits that disagree between neighbours almost everywhere are resized band by band, exactly."""
    logits = torch.randn(2, 29, 33, 24, generator=torch.Generator().manual_seed(5))
    expected = F.interpolate(logits, size=size, mode="bilinear", align_corners=False).argmax(1)
    torch.testing.assert_close(segmentation_labels(logits, size), expected, rtol=0, atol=0)
