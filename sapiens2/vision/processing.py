"""Model inputs from RGB photos: resize, symmetric pad, top-down person crops and normalization."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from sapiens2.errors import ConfigError
from sapiens2.models.kinds import ModelKind

log = logging.getLogger("sapiens2.processing")

ImageLike = np.ndarray | Image.Image
Size = tuple[int, int]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BOX_PADDING = 1.25
_BILINEAR = 2  # PIL's resampling code, the only one the preprocessor config may name

# preprocessor_config.json keys that change nothing for RGB photos at inference (labels, heatmap targets
# and a crop_size that do_center_crop=False leaves unused; do_convert_rgb acts on grey or RGBA input only).
_INERT_KEYS = frozenset(
    {
        "image_processor_type",
        "do_convert_rgb",
        "processor_class",
        "crop_size",
        "default_to_square",
        "do_reduce_labels",
        "keypoint_heatmap_downscale_factor",
        "keypoint_heatmap_sigma",
    }
)
_FIXED_KEYS = {"do_resize": True, "do_center_crop": False, "resample": _BILINEAR}


@dataclass(frozen=True)
class ProcessorSettings:
    """How photos become model inputs: target size (height, width), padding, rescale and normalization."""

    height: int = 1024
    width: int = 768
    do_pad: bool = False
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = IMAGENET_MEAN
    image_std: tuple[float, float, float] = IMAGENET_STD
    # True for the built-in settings of a kind, used where a checkpoint has no preprocessor_config.json.
    assumed: bool = field(default=False, compare=False, repr=False)

    @property
    def size(self) -> Size:
        """Model input size as (height, width)."""
        return self.height, self.width

    @classmethod
    def for_kind(cls, kind: ModelKind, size: Size | None = None) -> ProcessorSettings:
        """Built-in settings of a model kind: `size` (default 1024x768), ImageNet statistics, padding where
        the kind pads."""
        height, width = size or (cls.height, cls.width)
        return cls(height=height, width=width, do_pad=kind.padded, assumed=True)

    def description(self) -> str:
        """The settings in words: "1024x768 inputs (resized and padded, ...)"."""
        steps = ["resized and padded" if self.do_pad else "resized"]
        if self.do_rescale:
            one_255th = abs(self.rescale_factor - 1 / 255) < 1e-12
            steps.append("0-255 scaled to 0-1" if one_255th else f"scaled by {self.rescale_factor:g}")
        if self.do_normalize:
            imagenet = (self.image_mean, self.image_std) == (IMAGENET_MEAN, IMAGENET_STD)
            statistics = "ImageNet " if imagenet else ""
            steps.append(f"normalized with the {statistics}mean {self.image_mean} and std {self.image_std}")
        return f"{self.height}x{self.width} inputs ({', '.join(steps)})"

    @classmethod
    def from_config(cls, config: dict, source: str = "preprocessor config") -> ProcessorSettings:
        """Settings from the keys of a preprocessor_config.json (`source` names it in messages); missing keys
        keep the processor defaults, and keys that no Sapiens2 setting reads are ignored, as transformers
        ignores them (one log line per file)."""
        settings = cls()
        unknown = []
        for key, value in config.items():
            if key in _INERT_KEYS:
                continue
            if key in _FIXED_KEYS:
                if value is not None and value != _FIXED_KEYS[key]:
                    raise ConfigError(f"preprocessor {key}={value!r} is not supported")
            elif key == "size":
                settings = replace(settings, **_size(value))
            elif key in ("do_pad", "do_rescale", "do_normalize"):
                if not isinstance(value, bool):
                    raise ConfigError(f"preprocessor {key} must be true or false, got {value!r}")
                settings = replace(settings, **{key: value})
            elif key == "rescale_factor":
                if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                    raise ConfigError(f"preprocessor rescale_factor must be a positive number, got {value!r}")
                settings = replace(settings, rescale_factor=float(value))
            elif key in ("image_mean", "image_std"):
                settings = replace(settings, **{key: _channel_values(key, value)})
            else:
                unknown.append(key)
        if unknown:
            _log_ignored_keys(source, tuple(unknown))
        return settings

    @classmethod
    def from_pretrained_dir(
        cls, path: str | Path, kind: ModelKind | None = None, size: Size | None = None
    ) -> ProcessorSettings:
        """Settings from `path`/preprocessor_config.json, or the kind's built-in ones at `size` when there is
        none."""
        config_path = Path(path) / "preprocessor_config.json"
        if not config_path.is_file():
            if kind is None:
                raise ConfigError(f"{config_path} does not exist and no model kind was given for defaults")
            return cls.for_kind(kind, size)
        try:
            config = json.loads(config_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ConfigError(f"cannot read {config_path}: {error}") from error
        if not isinstance(config, dict):
            raise ConfigError(f"{config_path} must hold a JSON object")
        return cls.from_config(config, str(config_path))


@functools.cache
def _log_ignored_keys(source: str, keys: tuple[str, ...]) -> None:
    """One log line per file and set of keys, however often the file is read."""
    log.warning("%s: ignored the keys no Sapiens2 setting reads: %s", source, ", ".join(keys))


def _size(value: object) -> dict[str, int]:
    if not isinstance(value, dict) or set(value) != {"height", "width"}:
        raise ConfigError(f"preprocessor size must be {{'height': int, 'width': int}}, got {value!r}")
    if not all(isinstance(side, int) and not isinstance(side, bool) and side > 0 for side in value.values()):
        raise ConfigError(f"preprocessor size must hold positive integers, got {value!r}")
    return {"height": value["height"], "width": value["width"]}


def _channel_values(key: str, value: object) -> tuple[float, float, float]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = [value] * 3
    if (
        not isinstance(value, list | tuple)
        or len(value) != 3
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    ):
        raise ConfigError(f"preprocessor {key} must be a number or three numbers, got {value!r}")
    if key == "image_std" and min(value) <= 0:
        raise ConfigError(f"preprocessor image_std must be positive, got {value!r}")
    return float(value[0]), float(value[1]), float(value[2])


def rgb_array(image: ImageLike) -> np.ndarray:
    """The photo as a numpy (H, W, 3) uint8 RGB array; numpy input is returned as is when possible."""
    if isinstance(image, Image.Image):
        array = np.array(image.convert("RGB"))
    elif isinstance(image, np.ndarray):
        array = image
        if not array.flags.writeable or any(stride < 0 for stride in array.strides):
            array = array.copy()  # torch.from_numpy needs writable memory with positive strides
    else:
        raise TypeError(f"expected a numpy array or a PIL image, got {type(image).__name__}")
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"expected an RGB uint8 image of shape (H, W, 3), got {array.dtype} {array.shape}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"image is empty: {array.shape}")
    return array


def image_to_tensor(image: ImageLike) -> torch.Tensor:
    """A uint8 (3, H, W) tensor of an RGB photo (numpy HxWx3 uint8 or PIL); numpy input is not copied."""
    # A (3, H, W) view of HWC memory is channels-last, torch's fastest layout for uint8 antialiased resize.
    return torch.from_numpy(rgb_array(image)).permute(2, 0, 1)


def size_text(size: Size) -> str:
    """A (height, width) size as messages write it: 1024x768."""
    return f"{size[0]}x{size[1]}"


def fit_size(source_size: Size, target_size: Size) -> Size:
    """Largest (height, width) with the aspect ratio of `source_size` that fits inside `target_size`."""
    height, width = source_size
    scale = min(target_size[0] / height, target_size[1] / width)
    return int(height * scale), int(width * scale)


def content_box(source_size: Size, settings: ProcessorSettings) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) of the photo inside the model input; all of it when not padded."""
    if not settings.do_pad:
        return 0, 0, settings.height, settings.width
    height, width = fit_size(source_size, settings.size)
    top = (settings.height - height) // 2
    left = (settings.width - width) // 2
    return top, left, top + height, left + width


def resize_image(image: torch.Tensor, settings: ProcessorSettings) -> torch.Tensor:
    """Resize a uint8 (3, H, W) photo to the model size, bilinear with antialiasing, padding with black."""
    source_size = (image.shape[1], image.shape[2])
    top, left, bottom, right = content_box(source_size, settings)
    if min(bottom - top, right - left) <= 0:
        raise ValueError(f"image of size {source_size} is too elongated to fit {settings.size}")
    batch = image.unsqueeze(0)
    if (bottom - top, right - left) != source_size:
        batch = F.interpolate(
            batch, size=(bottom - top, right - left), mode="bilinear", align_corners=False, antialias=True
        )
    if settings.do_pad:
        padding = (left, settings.width - right, top, settings.height - bottom)
        batch = F.pad(batch, padding, value=0)
    return batch


def normalize(pixels: torch.Tensor, settings: ProcessorSettings) -> torch.Tensor:
    """float32 model input from pixels in [0, 255] (uint8 or float), shape (N, 3, H, W)."""
    return _normalize_(pixels.to(torch.float32, memory_format=torch.contiguous_format, copy=True), settings)


def _normalize_(values: torch.Tensor, settings: ProcessorSettings) -> torch.Tensor:
    """`normalize` in place on a float32 tensor."""
    if settings.do_normalize:
        mean = torch.tensor(settings.image_mean, device=values.device)
        std = torch.tensor(settings.image_std, device=values.device)
        if settings.do_rescale:
            # Rescale folded into the statistics, in float32, as transformers' processor does.
            mean = mean * (1.0 / settings.rescale_factor)
            std = std * (1.0 / settings.rescale_factor)
        return values.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
    if settings.do_rescale:
        return values.mul_(settings.rescale_factor)
    return values


def preprocess(
    images: ImageLike | Sequence[ImageLike],
    settings: ProcessorSettings,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Whole-photo model input (N, 3, height, width) float32 on `device` for one photo or a list of them."""
    batch = [images] if isinstance(images, np.ndarray | Image.Image) else list(images)
    if not batch:
        raise ValueError("no image given")
    resized = torch.cat([resize_image(image_to_tensor(image), settings) for image in batch])
    return normalize(resized.to(device) if device is not None else resized, settings)


Boxes = torch.Tensor | np.ndarray | Sequence[Sequence[float]]


def as_boxes(boxes: Boxes, device: torch.device | str | None = None) -> torch.Tensor:
    """Boxes (N, 4) as a float32 tensor on `device` from a tensor, an array or nested lists."""
    return torch.as_tensor(boxes, dtype=torch.float32, device=device).reshape(-1, 4)


def boxes_xywh_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    """COCO boxes (x, y, width, height) to (center x, center y, width, height)."""
    x, y, width, height = boxes.unbind(-1)
    return torch.stack([x + 0.5 * width, y + 0.5 * height, width, height], dim=-1)


def crop_windows(
    boxes_cxcywh: torch.Tensor, output_size: Size, padding: float = BOX_PADDING
) -> tuple[torch.Tensor, torch.Tensor]:
    """Centers (N, 2) and sizes (N, 2) as (x, y) of the crop windows: boxes grown by `padding`, then widened
    or heightened to the output aspect ratio."""
    center_x, center_y, width, height = boxes_cxcywh.unbind(-1)
    width = width * padding
    height = height * padding
    aspect = output_size[1] / output_size[0]
    wider = (width > height * aspect).unsqueeze(-1)
    sizes = torch.where(
        wider, torch.stack([width, width / aspect], dim=-1), torch.stack([height * aspect, height], dim=-1)
    )
    return torch.stack([center_x, center_y], dim=-1), sizes


def _cubic_weights(t: torch.Tensor) -> torch.Tensor:
    """Keys cubic convolution weights (a = -0.75) of the 4 taps around each fractional offset t in [0, 1)."""
    a = -0.75

    def near(d: torch.Tensor) -> torch.Tensor:  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: torch.Tensor) -> torch.Tensor:  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return torch.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], dim=-1)


def _sampling_taps(
    start: torch.Tensor, step: torch.Tensor, half_extent: torch.Tensor, count: int, length: int, cubic: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Source indices (count, taps) and weights of one axis of a crop, zero weight outside the photo."""
    # Same float32 steps as transformers' crop grid and grid_sample(align_corners=True): pixel position,
    # normalized to [-1, 1] and back, so the sampled positions are identical to the last bit.
    positions = torch.arange(count, dtype=torch.float32) / step + start - half_extent
    normalized = 2.0 * positions / (length - 1) - 1.0
    source = (normalized + 1) * torch.tensor((length - 1) / 2, dtype=torch.float32)
    first = source.floor()
    fraction = source - first
    if cubic:
        offsets, weights = torch.arange(-1, 3), _cubic_weights(fraction)
    else:
        offsets, weights = torch.arange(2), torch.stack([1 - fraction, fraction], dim=-1)
    indices = first.long().unsqueeze(-1) + offsets
    inside = (indices >= 0) & (indices < length)
    return indices.clamp(0, length - 1), weights * inside


def _weighted_sum(taps: Sequence[torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """Sum of taps[i] times weights[i]."""
    total = taps[0] * weights[0]
    for values, weight in zip(taps[1:], weights[1:], strict=True):
        total.addcmul_(values, weight)
    return total


def crop_persons(
    image: ImageLike,
    boxes_xywh: Boxes,
    settings: ProcessorSettings,
    device: torch.device | str | None = None,
    padding: float = BOX_PADDING,
) -> torch.Tensor:
    """Top-down model inputs (N, 3, height, width) float32 for N person boxes (COCO x, y, w, h) of a photo.

    Each crop window is the box grown by `padding` at the model's aspect ratio, sampled bilinearly when it
    shrinks and bicubically when it enlarges, black outside the photo: the affine warp without rotation.
    """
    array = rgb_array(image)
    boxes = as_boxes(boxes_xywh, device="cpu")
    if not (boxes.isfinite().all() and (boxes[:, 2:] > 0).all()):
        raise ValueError("person boxes must be finite with a positive width and height")
    image_height, image_width, _ = array.shape
    if min(image_height, image_width) < 2:
        raise ValueError(f"person crops need a photo of 2x2 pixels or more, got {image_height}x{image_width}")
    out_height, out_width = settings.size
    centers, sizes = crop_windows(boxes_xywh_to_cxcywh(boxes), settings.size, padding)
    crops = torch.empty(len(boxes), 3, out_height, out_width)
    for crop, (center_x, center_y), (width, height) in zip(crops, centers, sizes, strict=True):
        step_x, step_y = (out_width - 1) / width, (out_height - 1) / height
        scale = float(torch.minimum(step_x, step_y))
        cubic = scale >= 1.0
        columns, column_weights = _sampling_taps(center_x, step_x, 0.5 * width, out_width, image_width, cubic)
        rows, row_weights = _sampling_taps(center_y, step_y, 0.5 * height, out_height, image_height, cubic)
        # A band of outputs reads about 1 / scale source pixels each: banded matrix products win (3-4 times
        # faster) down to half scale; below it gathering the two bilinear taps is faster (bench_crops.py).
        sample = _banded_crop if scale >= _BANDED_FROM_SCALE else _gathered_crop
        sample(array, crop, (rows, row_weights), (columns, column_weights))
    return _normalize_(crops.to(device) if device is not None else crops, settings)


Taps = tuple[torch.Tensor, torch.Tensor]  # source indices (count, taps) and their weights along one axis
_BAND = 32  # outputs per block of the banded products
_BANDED_FROM_SCALE = 0.5  # the smallest scale (crop pixels per photo pixel) sampled by banded products


def _gathered_crop(array: np.ndarray, crop: torch.Tensor, row_taps: Taps, column_taps: Taps) -> None:
    """Fill `crop` (3, H, W) from the uint8 photo by gathering each tap: separable, along x then y."""
    (rows, row_weights), (columns, column_weights) = row_taps, column_taps
    out_height, out_width = crop.shape[1:]
    # Separable: interpolate the distinct source rows along x, then combine them along y. The uint8 gathers
    # run in numpy (much faster than torch indexing here); only crop-sized data becomes float.
    needed, row_of_tap = torch.unique(rows, return_inverse=True)
    source_rows = array[needed.numpy()].reshape(len(needed), -1)  # (rows, W * 3)
    channel_columns = (columns.T.unsqueeze(-1) * 3 + torch.arange(3)).flatten(1)  # (taps, out_width * 3)
    picked = torch.from_numpy(np.take(source_rows, channel_columns.numpy(), axis=1)).float()
    along_x = _weighted_sum(picked.unbind(1), column_weights.T.repeat_interleave(3, dim=1))
    along_y = _weighted_sum(
        [along_x.index_select(0, tap) for tap in row_of_tap.T], row_weights.T.unsqueeze(-1)
    )
    crop.copy_(along_y.view(out_height, out_width, 3).permute(2, 0, 1))


def _banded_crop(array: np.ndarray, crop: torch.Tensor, row_taps: Taps, column_taps: Taps) -> None:
    """Fill `crop` (3, H, W) from the uint8 photo as two banded matrix products, along x then y: each block
    of outputs times the weights of the few source pixels its taps reach."""
    (rows, row_weights), (columns, column_weights) = row_taps, column_taps
    top, bottom = int(rows.min()), int(rows.max()) + 1
    left, right = int(columns.min()), int(columns.max()) + 1
    source = torch.from_numpy(array[top:bottom, left:right]).permute(2, 0, 1).float()  # what any tap reaches
    rows, columns = rows - top, columns - left
    across, down = _tap_matrix(columns, column_weights), _tap_matrix(rows, row_weights)
    along_x = torch.empty(3, source.shape[1], crop.shape[2])
    for start, stop, first, last in _bands(columns):
        along_x[:, :, start:stop] = source[:, :, first:last] @ across[start:stop, first:last].T
    for start, stop, first, last in _bands(rows):
        crop[:, start:stop] = down[start:stop, first:last] @ along_x[:, first:last]


def _tap_matrix(indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The (count, sources) matrix with each output's tap weights at its source indices."""
    matrix = torch.zeros(len(indices), int(indices.max()) + 1)
    return matrix.scatter_add_(1, indices, weights)


def _bands(indices: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """(start, stop, first source, last source + 1) of each block of `_BAND` consecutive outputs."""
    lows, highs = indices.min(dim=1).values, indices.max(dim=1).values
    return [
        (start, min(start + _BAND, len(indices)), int(lows[start : start + _BAND].min()),
         int(highs[start : start + _BAND].max()) + 1)
        for start in range(0, len(indices), _BAND)
    ]  # fmt: skip


def unpad(maps: torch.Tensor, source_size: Size, settings: ProcessorSettings) -> torch.Tensor:
    """Crop maps (..., height, width) at model input resolution to the photo's area, dropping the padding."""
    top, left, bottom, right = content_box(source_size, settings)
    return maps[..., top:bottom, left:right]
