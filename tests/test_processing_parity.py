"""Preprocessing against transformers' Sapiens2ImageProcessor: plain resize, padded resize, person crops.

Tolerance: max abs difference 1e-4 on the normalized model input (about 0.006 of one uint8 step); 255 times
that when the input is not rescaled to [0, 1] (the same relative error on values 255 times larger).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Sapiens2ImageProcessor

from sapiens2.errors import ConfigError
from sapiens2.models.kinds import KINDS
from sapiens2.vision import processing
from sapiens2.vision.processing import ProcessorSettings, crop_persons, preprocess

TOLERANCE = 1e-4
ASSETS = Path(__file__).resolve().parent.parent / "assets"
SMALL = (128, 96)


def _photo(name: str) -> np.ndarray:
    if name == "random":
        return np.random.default_rng(7).integers(0, 256, size=(173, 311, 3), dtype=np.uint8)
    return np.array(Image.open(ASSETS / name).convert("RGB"))


PHOTOS = ["grace_hopper.jpg", "astronaut.png", "random"]


def _reference(image: np.ndarray, size: tuple[int, int], **kwargs) -> torch.Tensor:
    processor = Sapiens2ImageProcessor(size={"height": size[0], "width": size[1]})
    return processor(image, return_tensors="pt", **kwargs)["pixel_values"]


def _assert_close(ours: torch.Tensor, reference: torch.Tensor, scale: float = 1.0) -> None:
    assert ours.shape == reference.shape
    assert ours.dtype == torch.float32
    assert (ours - reference.float()).abs().max().item() <= TOLERANCE * scale


@pytest.mark.parametrize("name", PHOTOS)
@pytest.mark.parametrize("do_pad", [False, True])
def test_whole_photo_matches_reference(name: str, do_pad: bool) -> None:
    image = _photo(name)
    ours = preprocess(image, ProcessorSettings(height=SMALL[0], width=SMALL[1], do_pad=do_pad))
    _assert_close(ours, _reference(image, SMALL, do_pad=do_pad))


@pytest.mark.parametrize("do_pad", [False, True])
def test_default_size_matches_reference(do_pad: bool) -> None:
    image = _photo("grace_hopper.jpg")
    ours = preprocess(image, ProcessorSettings(do_pad=do_pad))
    assert ours.shape == (1, 3, 1024, 768)
    _assert_close(ours, _reference(image, (1024, 768), do_pad=do_pad))


@pytest.mark.parametrize("size", [(64, 200), (200, 64), (96, 96)])
def test_padding_of_wide_tall_and_square_targets(size: tuple[int, int]) -> None:
    image = _photo("random")
    ours = preprocess(image, ProcessorSettings(height=size[0], width=size[1], do_pad=True))
    _assert_close(ours, _reference(image, size, do_pad=True))


def test_padding_is_black_before_normalization() -> None:
    settings = ProcessorSettings(height=64, width=64, do_pad=True)
    ours = preprocess(np.full((20, 40, 3), 255, dtype=np.uint8), settings)
    black = (0 - torch.tensor(settings.image_mean)) / torch.tensor(settings.image_std)
    assert torch.allclose(ours[0, :, 0, 0], black)  # top band: the 40-wide photo becomes 64x32
    assert torch.allclose(
        ours[0, :, 32, 32], (1 - torch.tensor(settings.image_mean)) / torch.tensor(settings.image_std)
    )


# Boxes (COCO x, y, w, h) that shrink (bilinear) and enlarge (bicubic), reach past every edge, and are
# thin in either direction, so both aspect-ratio corrections are exercised.
BOXES = [
    [40.0, 30.5, 300.2, 420.7],
    [10.25, 12.75, 30.5, 41.0],
    [-50.0, -20.0, 600.0, 700.0],
    [100.0, 50.0, 8.0, 120.0],
    [0.0, 100.0, 200.0, 6.5],
]


@pytest.mark.parametrize("name", PHOTOS)
def test_person_crops_match_reference(name: str) -> None:
    image = _photo(name)
    ours = crop_persons(image, BOXES, ProcessorSettings(height=SMALL[0], width=SMALL[1]))
    assert ours.shape == (len(BOXES), 3, *SMALL)
    _assert_close(ours, _reference(image, SMALL, boxes=[BOXES]))


def test_person_crops_at_default_size_match_reference() -> None:
    image = _photo("grace_hopper.jpg")
    # One shrinks, one enlarges, one enlarges past the right and bottom edges.
    boxes = [[120.0, 80.0, 260.0, 500.0], [300.0, 300.0, 150.0, 200.0], [450.0, 520.0, 100.0, 120.0]]
    ours = crop_persons(image, np.array(boxes), ProcessorSettings())
    _assert_close(ours, _reference(image, (1024, 768), boxes=[boxes]))


def test_boxes_as_tensor_array_or_lists() -> None:
    settings = ProcessorSettings(height=32, width=24)
    crops = crop_persons(_photo("random"), BOXES[:2], settings)
    assert torch.equal(crop_persons(_photo("random"), torch.tensor(BOXES[:2]), settings), crops)
    assert torch.equal(crop_persons(_photo("random"), np.array(BOXES[:2]), settings), crops)


def test_no_person_gives_an_empty_batch() -> None:
    assert crop_persons(_photo("random"), [], ProcessorSettings(height=32, width=24)).shape == (0, 3, 32, 24)


@pytest.mark.parametrize("box", [[0, 0, 0, 10], [0, 0, 10, -1], [0, float("nan"), 5, 5]])
def test_degenerate_boxes_are_refused(box: list[float]) -> None:
    with pytest.raises(ValueError):
        crop_persons(_photo("random"), [box], ProcessorSettings(height=32, width=24))


@pytest.mark.parametrize(
    "options",
    [
        {"do_normalize": False},
        {"do_rescale": False},
        {"image_mean": (0.5, 0.5, 0.5), "image_std": (0.25, 0.5, 1.0)},
        {"rescale_factor": 1 / 127.5, "image_mean": (1.0, 1.0, 1.0), "image_std": (1.0, 1.0, 1.0)},
    ],
)
def test_rescale_and_normalize_options_match_reference(options: dict) -> None:
    image = _photo("astronaut.png")
    scale = 1.0 if options.get("do_rescale", True) else 255.0
    ours = preprocess(image, ProcessorSettings(height=SMALL[0], width=SMALL[1], **options))
    _assert_close(ours, _reference(image, SMALL, **options), scale)
    crops = crop_persons(image, BOXES[:2], ProcessorSettings(height=SMALL[0], width=SMALL[1], **options))
    _assert_close(crops, _reference(image, SMALL, boxes=[BOXES[:2]], **options), scale)


def test_batches_pil_input_and_device() -> None:
    settings = ProcessorSettings(height=SMALL[0], width=SMALL[1])
    photos = [_photo("astronaut.png"), _photo("random")]
    batch = preprocess(photos, settings, device="cpu")
    assert batch.shape == (2, 3, *SMALL)
    assert batch.is_contiguous()
    for one, photo in zip(batch, photos, strict=True):
        assert torch.equal(one, preprocess(Image.fromarray(photo), settings)[0])
    flipped = photos[1][:, ::-1]  # negative strides and a read-only view are copied, not refused
    flipped.flags.writeable = False
    _assert_close(preprocess(flipped, settings), _reference(np.ascontiguousarray(flipped), SMALL))


@pytest.mark.parametrize(
    "image",
    [np.zeros((10, 10), np.uint8), np.zeros((10, 10, 4), np.uint8), np.zeros((10, 10, 3), np.float32)],
)
def test_non_rgb_uint8_arrays_are_refused(image: np.ndarray) -> None:
    with pytest.raises(ValueError):
        preprocess(image, ProcessorSettings())


def test_kind_defaults_pad_only_normal_and_pointmap() -> None:
    padded = {kind.name for kind in KINDS.values() if ProcessorSettings.for_kind(kind).do_pad}
    assert padded == {"normal", "pointmap"}
    assert ProcessorSettings.for_kind(KINDS["seg"]) == ProcessorSettings()


def _write_config(directory: Path, config: dict) -> Path:
    (directory / "preprocessor_config.json").write_text(json.dumps(config))
    return directory


def test_settings_read_a_saved_reference_config(tmp_path: Path) -> None:
    reference = Sapiens2ImageProcessor(
        size={"height": 512, "width": 384}, do_pad=True, image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.3, 0.4]
    )
    reference.save_pretrained(tmp_path)
    settings = ProcessorSettings.from_pretrained_dir(tmp_path)
    assert settings == ProcessorSettings(
        height=512, width=384, do_pad=True, image_mean=(0.5, 0.4, 0.3), image_std=(0.2, 0.3, 0.4)
    )
    image = _photo("random")
    _assert_close(preprocess(image, settings), reference(image, return_tensors="pt")["pixel_values"])


def test_settings_keep_processor_defaults_for_missing_keys(tmp_path: Path) -> None:
    settings = ProcessorSettings.from_pretrained_dir(_write_config(tmp_path, {"do_pad": True}))
    assert settings == ProcessorSettings(do_pad=True)


def test_settings_fall_back_to_task_defaults_without_a_file(tmp_path: Path) -> None:
    normal = KINDS["normal"]
    assert ProcessorSettings.from_pretrained_dir(tmp_path, normal) == ProcessorSettings.for_kind(normal)
    with pytest.raises(ConfigError):
        ProcessorSettings.from_pretrained_dir(tmp_path)


@pytest.mark.parametrize(
    "config",
    [
        {"resample": 3},
        {"do_center_crop": True},
        {"do_resize": False},
        {"size": {"shortest_edge": 512}},
        {"size": {"height": 0, "width": 768}},
        {"do_pad": "yes"},
        {"image_mean": [0.5, 0.5]},
        {"image_std": [0.0, 1.0, 1.0]},
        {"rescale_factor": -1},
        [1, 2, 3],
    ],
)
def test_unsupported_configs_raise_config_error(tmp_path: Path, config: object) -> None:
    with pytest.raises(ConfigError):
        ProcessorSettings.from_pretrained_dir(_write_config(tmp_path, config))


def test_unknown_keys_are_ignored_with_one_log_line_per_file(tmp_path: Path, caplog) -> None:
    """Keys that other transformers versions write (or that no Sapiens2 setting reads) change nothing."""
    config = {"data_format": "channels_first", "crop_pct": 0.9, "do_pad": True, "size_divisor": None}
    directory = _write_config(tmp_path, config)
    with caplog.at_level(logging.WARNING, logger="sapiens2.processing"):
        for _ in range(3):
            assert ProcessorSettings.from_pretrained_dir(directory) == ProcessorSettings(do_pad=True)
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        f"{directory / 'preprocessor_config.json'}: ignored the keys no Sapiens2 setting reads: "
        "data_format, crop_pct, size_divisor"
    ]


def test_assumed_settings_are_marked_and_described() -> None:
    assumed = ProcessorSettings.for_kind(KINDS["normal"])
    assert assumed.assumed and not ProcessorSettings().assumed and assumed == ProcessorSettings(do_pad=True)
    assert assumed.description() == (
        "1024x768 inputs (resized and padded, 0-255 scaled to 0-1, normalized with the ImageNet mean "
        "(0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225))"
    )
    other = ProcessorSettings(height=64, width=48, rescale_factor=0.5, image_mean=(0.5, 0.5, 0.5))
    assert other.description() == (
        "64x48 inputs (resized, scaled by 0.5, normalized with the mean (0.5, 0.5, 0.5) and std "
        "(0.229, 0.224, 0.225))"
    )


def test_unreadable_config_raises_config_error(tmp_path: Path) -> None:
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(ConfigError):
        ProcessorSettings.from_pretrained_dir(tmp_path)


@pytest.mark.parametrize("height", [40.0, 300.0, 700.0, 1200.0])  # crop scales from 20 down to 0.7
def test_banded_and_gathered_crops_agree(height: float) -> None:
    """Crops at half scale or more are sampled by banded matrix products, the others by gathering each tap;
    both ways give the same crop, here at every scale and past the photo's edges."""
    image = _photo("astronaut.png")
    box = [[image.shape[1] - 0.6 * height * 0.5, -0.2 * height, 0.6 * height, height]]
    settings = ProcessorSettings()
    banded = crop_persons(image, box, settings)
    gathered = processing._banded_crop
    try:
        processing._banded_crop = processing._gathered_crop
        assert (crop_persons(image, box, settings) - banded).abs().max() <= 1e-5
    finally:
        processing._banded_crop = gathered
