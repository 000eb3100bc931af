"""Input hygiene: turn any image a user sends into clean RGB uint8 pixels, or a sentence saying why not.

Design: `LoadedImage.rgb` keeps every pixel of the image as the user sent it (after EXIF orientation);
`LoadedImage.model_rgb` is the same image with its longest side fitted to `max_side`, computed on first
use. Pipelines run the model on `model_rgb` and map results back with `scale` (coordinates divided by
it) or by resizing maps to `original_size`.

Damaged files are always refused, truncated ones included: this module never asks Pillow to decode a
partial image (it leaves `ImageFile.LOAD_TRUNCATED_IMAGES` alone, which is False by default).
URLs are never fetched and file names are never used to build paths.
"""

from __future__ import annotations

import io
import os
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import IO, Any

import cv2
import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from sapiens2.errors import ConfigError, LimitError, Sapiens2Error
from sapiens2.settings import current
from sapiens2.vision.files import file_problem, open_regular
from sapiens2.vision.limits import JPEG_SCANS_COUNTED, Limits, too_large_unknown
from sapiens2.vision.structure import jpeg_scans

MIN_SIDE = 32
SUPPORTED_FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF")

_SUPPORTED_WORDS = "JPEG, PNG, WebP, GIF, BMP or TIFF"
_SNIFF_BYTES = 512
_MAX_NAME_CHARS = 120
# Magic bytes: (offset, signature, format name, whether this module reads it). The first match wins.
_SIGNATURES: tuple[tuple[int, bytes, str, bool], ...] = (
    (0, b"\x89PNG\r\n\x1a\n", "PNG", True),
    (0, b"\xff\xd8\xff", "JPEG", True),
    (0, b"GIF8", "GIF", True),
    (8, b"WEBP", "WebP", True),
    (0, b"II*\x00", "TIFF", True),
    (0, b"MM\x00*", "TIFF", True),
    (0, b"BM", "BMP", True),
    (0, b"%PDF", "PDF", False),
    (0, b"%!PS", "PostScript", False),
    (0, b"8BPS", "Photoshop (PSD)", False),
    *((4, b"ftyp" + brand, "HEIC/HEIF", False) for brand in (b"heic", b"heix", b"heim", b"heis", b"mif1")),
    (4, b"ftypavi", "AVIF", False),
    (4, b"ftyp", "Video (MP4/MOV)", False),
)
_decoder: Callable[[Any, int, Limits], LoadedImage] | None = None
_ALPHA_MODES = frozenset({"RGBA", "RGBa", "LA", "La", "PA"})
_WINDOWS_RESERVED = frozenset(
    {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}
)


class ImageInputError(Sapiens2Error, ValueError):
    """An input cannot be used as an image; the message says what is wrong and what to do."""


@dataclass(eq=False)
class LoadedImage:
    """A clean image: full-size RGB (and alpha), plus what the model sees and notes for the user."""

    rgb: np.ndarray
    alpha: np.ndarray | None
    original_size: tuple[int, int]
    scale: float = 1.0
    notes: list[str] = field(default_factory=list)

    @property
    def model_size(self) -> tuple[int, int]:
        """(H, W) of `model_rgb`."""
        return _scaled_size(*self.original_size, self.scale)

    @cached_property
    def model_rgb(self) -> np.ndarray:
        """The image the model should see: `rgb` downscaled by `scale` (the same array when scale is 1)."""
        return _resize(self.rgb, self.model_size)


def default_max_side() -> int:
    """Longest image side the model sees: $SAPIENS2_MAX_SIDE, or 4096."""
    return current().max_side


def load_image(source: Any, *, max_side: int | None = None, limits: Limits | None = None) -> LoadedImage:
    """Read a path, bytes, file object, PIL image or numpy array; raise ImageInputError if it is unusable.

    Its size is checked against `limits` (the server's limits for photos when None) before any pixel is
    decoded."""
    side = default_max_side() if max_side is None else _checked_max_side(max_side, "max_side")
    limits = Limits.of() if limits is None else limits
    notes: list[str] = []
    if source is None:
        raise ImageInputError("No image was given. Please choose an image file.")
    if _decoder is not None and not isinstance(source, (np.ndarray, Image.Image)):
        return _decoder(source, side, limits)
    if isinstance(source, np.ndarray):
        rgb, alpha = _from_array(source, notes, limits)
    elif isinstance(source, Image.Image):
        rgb, alpha = _from_pil(source, notes, limits)
    else:
        rgb, alpha = _from_stream(source, notes, limits)
    return _finish(rgb, alpha, side, notes)


def decode_elsewhere(decoder: Callable[[Any, int, Limits], LoadedImage] | None) -> None:
    """Have `load_image` hand every file and bytes object to `decoder(source, max_side, limits)` (the web
    app's decode workers, sapiens2.vision.decode_workers), or decode them here again (None)."""
    global _decoder
    _decoder = decoder


def sanitize_filename(name: str, default: str = "image") -> str:
    """A safe bare file name derived from user input: no folders, no control or odd characters."""
    text = unicodedata.normalize("NFKC", str(name)).replace("\\", "/").rsplit("/", 1)[-1]
    text = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in text)
    text = re.sub(r"_+", "_", text).strip("._-")
    if len(text) > _MAX_NAME_CHARS:
        stem, ext = os.path.splitext(text)
        ext = ext[:16]
        text = stem[: _MAX_NAME_CHARS - len(ext)] + ext
    if text.split(".", 1)[0].upper() in _WINDOWS_RESERVED:
        text = "_" + text
    return text or default


def _checked_max_side(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_SIDE:
        raise ConfigError(f"{what} must be a whole number of pixels of at least {MIN_SIDE}, not {value!r}.")
    return value


def _fit_scale(height: int, width: int, max_side: int) -> float:
    return min(1.0, max_side / max(height, width))


def _scaled_size(height: int, width: int, scale: float) -> tuple[int, int]:
    return max(1, round(height * scale)), max(1, round(width * scale))


def _resize(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    if size == pixels.shape[:2]:
        return pixels
    return cv2.resize(pixels, (size[1], size[0]), interpolation=cv2.INTER_AREA)


def _note(notes: list[str], text: str) -> None:
    if text not in notes:
        notes.append(text)


def _check_size(width: int, height: int, limits: Limits) -> None:
    """The request limits (sapiens2.vision.limits), checked from the header before any pixel is decoded."""
    if min(width, height) < MIN_SIDE:
        raise ImageInputError(
            f"The image is too small ({width}x{height} pixels). Please send an image at least "
            f"{MIN_SIDE} pixels wide and {MIN_SIDE} pixels high."
        )
    try:
        limits.check_image(width, height)
    except LimitError as error:
        raise ImageInputError(str(error)) from None


def _too_large(limits: Limits) -> ImageInputError:
    return ImageInputError(str(too_large_unknown(limits.megapixels)))


def _from_stream(source: Any, notes: list[str], limits: Limits) -> tuple[np.ndarray, np.ndarray | None]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _decode(io.BytesIO(bytes(source)), notes, limits)
    if isinstance(source, (str, os.PathLike)):
        with _open_path(source) as stream:
            return _decode(stream, notes, limits)
    if callable(getattr(source, "read", None)):
        seekable = getattr(source, "seekable", None)
        if not (callable(seekable) and seekable()):
            source = io.BytesIO(source.read())
        return _decode(source, notes, limits)
    raise ImageInputError(
        f"Cannot read an image from a {type(source).__name__} object. Please pass a file path, bytes, "
        "a file object, a PIL image or a numpy array."
    )


def _open_path(source: str | os.PathLike) -> IO[bytes]:
    path = os.fsdecode(os.fspath(source))
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://|^data:", path):
        raise ImageInputError(
            "Web addresses are not opened. Please download the image and send the file itself."
        )
    shown = sanitize_filename(path, default="(no name)")
    try:
        return open_regular(path)
    except ValueError:
        raise ImageInputError("The file name is not valid (it contains a NUL character).") from None
    except OSError as exc:
        raise ImageInputError(file_problem(exc, shown, "an image file")) from None


def _decode(stream: IO[bytes], notes: list[str], limits: Limits) -> tuple[np.ndarray, np.ndarray | None]:
    stream.seek(0)
    head = stream.read(_SNIFF_BYTES)
    if not head:
        raise ImageInputError("The file is empty (0 bytes). Please choose an image file.")
    if head.startswith(b"\xff\xd8"):
        _check_jpeg_scans(stream, limits)
    try:
        # verify() checks PNG chunk checksums, which decoding skips; it cannot decode, so reopen after.
        with _open_header(stream, head) as probe:
            probe.verify()
        image = _open_header(stream, head)
    except ImageInputError:
        raise
    except Exception as exc:  # a hostile file can make Pillow raise almost anything
        raise _decode_error(exc, limits) from exc
    with image:
        return _from_pil(image, notes, limits)


def _check_jpeg_scans(stream: IO[bytes], limits: Limits) -> None:
    """Refuse a JPEG whose scans would take minutes to decode, counted from its markers before decoding."""
    stream.seek(0)
    try:
        limits.check_jpeg_scans(jpeg_scans(stream.read(), stop_after=limits.jpeg_scans * JPEG_SCANS_COUNTED))
    except LimitError as error:
        raise ImageInputError(str(error)) from None


def _open_header(stream: IO[bytes], head: bytes) -> Image.Image:
    Image.init()  # registers every plugin (once), so `formats` may name WEBP and TIFF
    stream.seek(0)
    try:
        return Image.open(stream, formats=SUPPORTED_FORMATS)
    except UnidentifiedImageError:
        raise _unidentified(head) from None


def _unidentified(head: bytes) -> ImageInputError:
    for offset, magic, name, supported in _SIGNATURES:
        if head[offset : offset + len(magic)] == magic:
            if supported:
                return ImageInputError(
                    f"The file looks like a {name} image but it is damaged and cannot be opened. "
                    "Please re-save or re-export it and try again."
                )
            return _unsupported(name)
    if b"<svg" in head.lower():
        return _unsupported("SVG")
    return ImageInputError(
        f"The file is not an image in a supported format. Please send a {_SUPPORTED_WORDS} image."
    )


def _unsupported(name: str) -> ImageInputError:
    return ImageInputError(
        f"{name} files are not supported. Please convert the image to JPEG or PNG and try again."
    )


def _decode_error(exc: BaseException, limits: Limits) -> ImageInputError:
    text = str(exc)
    # Pillow's own bomb check, and its limits on compressed text and colour-profile chunks (zTXt, iTXt, iCCP).
    if isinstance(exc, Image.DecompressionBombError) or "too large" in text or "Too much memory" in text:
        return _too_large(limits)
    if isinstance(exc, MemoryError):
        return ImageInputError("There is not enough memory to open this image. Please send a smaller image.")
    if isinstance(exc, EOFError) or "truncated" in text.lower():
        return ImageInputError(
            "The image file is incomplete: it ends before all of its pixels (often an interrupted "
            "upload or copy). Please upload it again."
        )
    return ImageInputError(
        "The image data is damaged and cannot be decoded. Please re-save or re-export the image "
        "and try again."
    )


def _from_pil(image: Image.Image, notes: list[str], limits: Limits) -> tuple[np.ndarray, np.ndarray | None]:
    _check_size(*image.size, limits)
    try:
        # Asking whether a GIF is animated reads its second frame, which may be the damaged part.
        first_of_many = getattr(image, "is_animated", False) and image.tell() == 0
        image.load()
    except Exception as exc:  # a hostile file can make Pillow raise almost anything
        raise _decode_error(exc, limits) from exc
    if first_of_many and image.format != "MPO":
        what = "page of a multi-page" if image.format == "TIFF" else "frame of an animated"
        _note(notes, f"Used the first {what} image.")
    image = _upright(image, notes)
    if image.mode.startswith("I") or image.mode == "F":
        return _from_array(np.asarray(image), notes, limits)
    if image.mode == "CMYK":
        _note(notes, "Converted CMYK colours to RGB; colours may differ slightly from print software.")
    has_alpha = image.mode in _ALPHA_MODES or "transparency" in image.info
    target = "RGBA" if has_alpha else "RGB"
    try:
        pixels = np.asarray(image if image.mode == target else image.convert(target))
    except ValueError:
        raise ImageInputError(
            f"Images in the '{image.mode}' colour mode are not supported. Please convert it to RGB."
        ) from None
    return (pixels[..., :3], pixels[..., 3]) if has_alpha else (pixels, None)


def _upright(image: Image.Image, notes: list[str]) -> Image.Image:
    try:
        orientation = image.getexif().get(ExifTags.Base.Orientation, 1)
        if orientation not in range(2, 9):
            return image
        upright = ImageOps.exif_transpose(image)
    except Exception:  # malformed EXIF blocks raise many kinds of errors
        _note(notes, "The photo's orientation tag could not be read; the image is used as stored.")
        return image
    _note(notes, "Turned the photo upright using its orientation tag (EXIF).")
    return upright


def _from_array(array: np.ndarray, notes: list[str], limits: Limits) -> tuple[np.ndarray, np.ndarray | None]:
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[..., 0]
    if array.ndim == 3 and array.shape[0] in (1, 3, 4) and array.shape[2] not in (3, 4):
        raise ImageInputError(
            f"The array of shape {array.shape} looks channels-first. Please pass it as height x width x "
            "channels, for example array.transpose(1, 2, 0)."
        )
    if not (array.ndim == 2 or (array.ndim == 3 and array.shape[2] in (3, 4))):
        raise ImageInputError(
            f"A numpy image must have shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), not {array.shape}."
        )
    if array.dtype.kind not in "biuf":
        raise ImageInputError(f"A numpy image must hold numbers (bool, integer or float), not {array.dtype}.")
    _check_size(array.shape[1], array.shape[0], limits)
    if array.ndim == 2:
        grey = _to_uint8(array, notes)
        return np.repeat(grey[..., None], 3, axis=2), None
    alpha = _to_uint8(array[..., 3], notes) if array.shape[2] == 4 else None
    return _to_uint8(array[..., :3], notes), alpha


def _to_uint8(values: np.ndarray, notes: list[str]) -> np.ndarray:
    if values.dtype.kind == "b":
        return values.astype(np.uint8) * np.uint8(255)
    if values.dtype == np.uint8:
        return values
    if values.dtype.kind == "u" and values.dtype.itemsize == 2:
        _note(notes, "Converted a 16-bit image to 8 bits.")
        return (values >> 8).astype(np.uint8)
    if values.dtype.kind == "f":
        values = _finite(values.astype(np.float32), notes)
        low, high = float(values.min()), float(values.max())
        if low >= 0.0 and high <= 1.0:
            return np.rint(values * 255.0).astype(np.uint8)
    else:
        low, high = float(values.min()), float(values.max())
        if low >= 0 and high <= 255:
            return values.astype(np.uint8)
    _note(notes, f"Stretched pixel values from the range {low:g} to {high:g} onto 0 to 255.")
    span = (high - low) or 1.0
    return np.rint((values.astype(np.float32) - low) * (255.0 / span)).astype(np.uint8)


def _finite(values: np.ndarray, notes: list[str]) -> np.ndarray:
    finite = np.isfinite(values)
    if finite.all():
        return values
    if not finite.any():
        raise ImageInputError("The image holds no valid pixel values (they are all NaN or infinite).")
    valid = values[finite]
    low, high = float(valid.min()), float(valid.max())
    count = int(finite.size - np.count_nonzero(finite))
    _note(notes, f"Replaced {count} pixel values that were not numbers (NaN or infinite).")
    return np.nan_to_num(values, nan=low, posinf=high, neginf=low)


def _finish(rgb: np.ndarray, alpha: np.ndarray | None, max_side: int, notes: list[str]) -> LoadedImage:
    if alpha is not None and alpha.min() < 255:
        if alpha.max() == 0:
            raise ImageInputError(
                "The image is completely transparent, so there is nothing to analyse. "
                "Please send an image with visible content."
            )
        rgb = _over_white(rgb, alpha)
        _note(notes, "Transparent areas were filled with white; the transparency is kept separately.")
    height, width = rgb.shape[:2]
    scale = _fit_scale(height, width, max_side)
    if scale < 1.0:
        new_height, new_width = _scaled_size(height, width, scale)
        _note(
            notes,
            f"Downscaled from {width}x{height} to {new_width}x{new_height} for the model; "
            "results are mapped back to the original size.",
        )
    # Copies, so the result is writable and never shares memory with the caller's array.
    return LoadedImage(
        rgb=np.array(rgb, order="C"),
        alpha=None if alpha is None else np.array(alpha, order="C"),
        original_size=(height, width),
        scale=scale,
        notes=notes,
    )


def _over_white(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    weight = alpha[..., None].astype(np.uint16)
    blended = (rgb.astype(np.uint16) * weight + 255 * (255 - weight) + 127) // 255
    return blended.astype(np.uint8)
