"""The battery of awkward and hostile image files that every way into the package must survive.

`make_bad_inputs(directory)` writes one file per case and says what `vision.images.load_image` must make
of it: an ImageInputError whose message contains `error`, or an image with the listed properties.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

ASSETS = Path(__file__).resolve().parent.parent / "assets"
PHOTO = ASSETS / "grace_hopper.jpg"  # 512 wide, 600 high
SQUARE = ASSETS / "astronaut.png"  # 512 x 512
PHOTO_SIZE = (600, 512)
SQUARE_SIZE = (512, 512)
TRAVERSAL_NAME = "../../etc/passwd.png"
FRAME_COLOURS = ((255, 0, 0), (0, 0, 255))
SMALL_SIZE = (48, 64)  # (H, W) of the small synthetic images


@dataclass(frozen=True)
class BadInput:
    """One file of the battery and what load_image must make of it."""

    path: Path
    error: str | None = None  # a substring of the ImageInputError message; None when the file must load
    size: tuple[int, int] | None = None  # (H, W) of the loaded rgb
    alpha: bool = False  # whether the loaded image keeps an alpha channel
    note: str | None = None  # a substring of one of the loaded image's notes
    upload_name: str | None = None  # the name a client sends with the file, when it is not path.name

    @property
    def sent_name(self) -> str:
        """The file name as a client would send it."""
        return self.upload_name or self.path.name


def make_bad_inputs(directory: Path) -> dict[str, BadInput]:
    """Write every case of the battery into `directory` and return them by name."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return {name: write(directory) for name, write in _CASES.items()}


def png_bytes(width: int, height: int, bit_depth: int = 8, colour_type: int = 2, raw: bytes = b"") -> bytes:
    """A PNG written chunk by chunk; `raw` is the filtered scanline data (any header can be claimed)."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(raw))
        + _png_chunk(b"IEND", b"")
    )


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _gif_header(width: int, height: int) -> bytes:
    screen = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    one_pixel = b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return screen + one_pixel + b"\x3b"


def _photo() -> Image.Image:
    with Image.open(PHOTO) as image:
        return image.convert("RGB")


def _square() -> Image.Image:
    with Image.open(SQUARE) as image:
        return image.convert("RGB")


def _save(image: Image.Image, path: Path, fmt: str, **options: object) -> Path:
    image.save(path, fmt, **options)
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _empty(d: Path) -> BadInput:
    return BadInput(_write(d / "empty.jpg", b""), error="empty")


def _text_as_jpeg(d: Path) -> BadInput:
    text = b"Shopping list:\n- eggs\n- milk\n" * 20
    return BadInput(_write(d / "notes.jpg", text), error="not an image in a supported format")


def _truncated_jpeg(d: Path) -> BadInput:
    data = PHOTO.read_bytes()
    return BadInput(_write(d / "truncated.jpg", data[: len(data) * 6 // 10]), error="incomplete")


def _truncated_png(d: Path) -> BadInput:
    data = SQUARE.read_bytes()
    return BadInput(_write(d / "truncated.png", data[: len(data) * 6 // 10]), error="incomplete")


def _bad_data_crc_png(d: Path) -> BadInput:
    data = bytearray(SQUARE.read_bytes())
    data[-13] ^= 0xFF  # the last byte of the CRC of the chunk before IEND (an IDAT)
    return BadInput(_write(d / "bad_crc.png", bytes(data)), error="damaged")


def _bad_header_crc_png(d: Path) -> BadInput:
    data = bytearray(SQUARE.read_bytes())
    data[29] ^= 0xFF  # the IHDR chunk's CRC
    return BadInput(_write(d / "bad_header_crc.png", bytes(data)), error="damaged")


def _tiny(d: Path) -> BadInput:
    return BadInput(_save(Image.new("RGB", (1, 1), "white"), d / "tiny.png", "PNG"), error="too small")


def _bomb_png(d: Path) -> BadInput:
    return BadInput(_write(d / "bomb.png", png_bytes(30000, 30000)), error="too large")


def _huge_gif_header(d: Path) -> BadInput:
    return BadInput(_write(d / "huge.gif", _gif_header(65535, 65535)), error="too large")


def _zero_size_png(d: Path) -> BadInput:
    return BadInput(_write(d / "zero_width.png", png_bytes(0, 600)), error="damaged")


def _animated(d: Path, fmt: str, suffix: str, **options: object) -> BadInput:
    frames = [Image.new("RGB", SMALL_SIZE[::-1], colour) for colour in FRAME_COLOURS]
    path = d / f"animated.{suffix}"
    frames[0].save(path, fmt, save_all=True, append_images=frames[1:], duration=100, loop=0, **options)
    return BadInput(path, size=SMALL_SIZE, note="first frame")


def _multipage_tiff(d: Path) -> BadInput:
    pages = [Image.new("RGB", SMALL_SIZE[::-1], colour) for colour in FRAME_COLOURS]
    path = d / "pages.tif"
    pages[0].save(path, "TIFF", save_all=True, append_images=pages[1:])
    return BadInput(path, size=SMALL_SIZE, note="first page")


def _gradient16() -> np.ndarray:
    height, width = SMALL_SIZE
    return (np.arange(height * width, dtype=np.uint32).reshape(height, width) * 21).astype(np.uint16)


def _png16_grey(d: Path) -> BadInput:
    path = _save(Image.fromarray(_gradient16()), d / "grey16.png", "PNG")
    return BadInput(path, size=SMALL_SIZE, note="16-bit")


def _png16_rgb(d: Path) -> BadInput:
    height, width = SMALL_SIZE
    pixels = np.stack([_gradient16()] * 3, axis=2).astype(">u2")
    raw = b"".join(b"\x00" + row.tobytes() for row in pixels)
    return BadInput(_write(d / "rgb16.png", png_bytes(width, height, 16, 2, raw)), size=SMALL_SIZE)


def _cmyk_jpeg(d: Path) -> BadInput:
    path = _save(_photo().convert("CMYK"), d / "cmyk.jpg", "JPEG", quality=95)
    return BadInput(path, size=PHOTO_SIZE, note="CMYK")


def _greyscale_jpeg(d: Path) -> BadInput:
    return BadInput(_save(_photo().convert("L"), d / "grey.jpg", "JPEG"), size=PHOTO_SIZE)


def _transparent_png(d: Path) -> BadInput:
    image = _square().convert("RGBA")
    image.putalpha(0)
    return BadInput(_save(image, d / "transparent.png", "PNG"), error="completely transparent")


def _half_transparent_png(d: Path) -> BadInput:
    image = _square().convert("RGBA")
    ramp = np.tile(np.linspace(0, 255, SQUARE_SIZE[1]).astype(np.uint8), (SQUARE_SIZE[0], 1))
    image.putalpha(Image.fromarray(ramp))
    path = _save(image, d / "half_transparent.png", "PNG")
    return BadInput(path, size=SQUARE_SIZE, alpha=True, note="white")


def _exif_rotated(d: Path) -> BadInput:
    image = _photo()
    exif = image.getexif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    path = _save(image, d / "rotated.jpg", "JPEG", exif=exif.tobytes(), quality=95)
    return BadInput(path, size=PHOTO_SIZE[::-1], note="upright")


def _float_tiff_nan(d: Path) -> BadInput:
    height, width = SMALL_SIZE
    values = np.linspace(0.0, 1.0, height * width, dtype=np.float32).reshape(height, width)
    values[::7, ::5] = np.nan
    path = _save(Image.fromarray(values, mode="F"), d / "float_nan.tif", "TIFF")
    return BadInput(path, size=SMALL_SIZE, note="not numbers")


def _large_photo(d: Path) -> BadInput:
    image = _photo().resize((6000, 4000), Image.Resampling.BILINEAR)  # 24 megapixels: the default limit
    path = _save(image, d / "large.jpg", "JPEG", quality=85)
    return BadInput(path, size=(4000, 6000), note="Downscaled from 6000x4000 to 4096x2731")


def _over_megapixels_gif(d: Path) -> BadInput:
    # 35 bytes claiming a 16000x5000 canvas: every picture and export of it would be 80 megapixels.
    return BadInput(_write(d / "canvas.gif", _gif_header(16000, 5000)), error="above this server's limit of")


def _strip_png(d: Path, width: int, height: int) -> BadInput:
    rows = b"".join(b"\x00" + bytes(width * 3) for _ in range(height))  # compresses to a few kilobytes
    return BadInput(
        _write(d / f"strip_{width}x{height}.png", png_bytes(width, height, raw=rows)), error="strip"
    )


def _metadata_bomb_png(d: Path, kind: bytes) -> BadInput:
    """A small PNG with a text or colour-profile chunk that unpacks to 50 MB of zeros."""
    prefix = {b"zTXt": b"k\x00\x00", b"iCCP": b"p\x00\x00", b"iTXt": b"k\x00\x01\x00\x00\x00"}[kind]
    chunk = _png_chunk(kind, prefix + zlib.compress(bytes(50_000_000), 9))
    plain = png_bytes(*SMALL_SIZE[::-1], raw=b"".join(b"\x00" + bytes(SMALL_SIZE[1] * 3) for _ in range(48)))
    name = f"{kind.decode().lower()}_bomb.png"
    return BadInput(_write(d / name, plain[:33] + chunk + plain[33:]), error="too large")


def _traversal_name(d: Path) -> BadInput:
    path = _save(_square(), d / "traversal.png", "PNG")
    return BadInput(path, size=SQUARE_SIZE, upload_name=TRAVERSAL_NAME)


def _palette_transparency(d: Path) -> BadInput:
    image = _square().quantize(16)
    image.info["transparency"] = 0
    return BadInput(_save(image, d / "palette.png", "PNG", transparency=0), size=SQUARE_SIZE, alpha=True)


def _one_bit(d: Path) -> BadInput:
    return BadInput(_save(_photo().convert("1"), d / "one_bit.png", "PNG"), size=PHOTO_SIZE)


def _webp(d: Path) -> BadInput:
    return BadInput(_save(_photo(), d / "photo.webp", "WEBP", quality=90), size=PHOTO_SIZE)


def _bmp(d: Path) -> BadInput:
    return BadInput(_save(_photo(), d / "photo.bmp", "BMP"), size=PHOTO_SIZE)


def _jpeg_named_png(d: Path) -> BadInput:
    return BadInput(_write(d / "really_a_jpeg.png", PHOTO.read_bytes()), size=PHOTO_SIZE)


def _pcx(d: Path) -> BadInput:
    return BadInput(_save(_photo(), d / "photo.pcx", "PCX"), error="not an image in a supported format")


def _pdf(d: Path) -> BadInput:
    return BadInput(_save(_photo(), d / "photo.pdf", "PDF"), error="PDF files are not supported")


def _heic(d: Path) -> BadInput:
    box = struct.pack(">I", 24) + b"ftypheic" + b"\x00\x00\x00\x00" + b"mif1heic"
    return BadInput(_write(d / "photo.heic", box + bytes(200)), error="HEIC/HEIF files are not supported")


def _svg(d: Path) -> BadInput:
    svg = b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64"/>\n'
    return BadInput(_write(d / "drawing.svg", svg), error="SVG files are not supported")


def _jpeg_with_trailing_junk(d: Path) -> BadInput:
    return BadInput(_write(d / "trailing_junk.jpg", PHOTO.read_bytes() + bytes(4096)), size=PHOTO_SIZE)


_CASES: dict[str, Callable[[Path], BadInput]] = {
    "empty": _empty,
    "text_as_jpeg": _text_as_jpeg,
    "truncated_jpeg": _truncated_jpeg,
    "truncated_png": _truncated_png,
    "bad_data_crc_png": _bad_data_crc_png,
    "bad_header_crc_png": _bad_header_crc_png,
    "tiny_1x1": _tiny,
    "bomb_png_30000": _bomb_png,
    "huge_gif_header": _huge_gif_header,
    "zero_width_png": _zero_size_png,
    "animated_gif": lambda d: _animated(d, "GIF", "gif"),
    "animated_png": lambda d: _animated(d, "PNG", "png"),
    "animated_webp": lambda d: _animated(d, "WEBP", "webp", lossless=True),
    "multipage_tiff": _multipage_tiff,
    "png16_grey": _png16_grey,
    "png16_rgb": _png16_rgb,
    "cmyk_jpeg": _cmyk_jpeg,
    "greyscale_jpeg": _greyscale_jpeg,
    "transparent_png": _transparent_png,
    "half_transparent_png": _half_transparent_png,
    "exif_rotated": _exif_rotated,
    "float_tiff_nan": _float_tiff_nan,
    "large_photo": _large_photo,
    "over_megapixels_gif": _over_megapixels_gif,
    "strip_100000x32": lambda d: _strip_png(d, 100_000, 32),
    "strip_32x20000": lambda d: _strip_png(d, 32, 20_000),
    "ztxt_bomb": lambda d: _metadata_bomb_png(d, b"zTXt"),
    "iccp_bomb": lambda d: _metadata_bomb_png(d, b"iCCP"),
    "itxt_bomb": lambda d: _metadata_bomb_png(d, b"iTXt"),
    "traversal_name": _traversal_name,
    "palette_transparency": _palette_transparency,
    "one_bit": _one_bit,
    "webp": _webp,
    "bmp": _bmp,
    "jpeg_named_png": _jpeg_named_png,
    "jpeg_trailing_junk": _jpeg_with_trailing_junk,
    "pcx": _pcx,
    "pdf": _pdf,
    "heic": _heic,
    "svg": _svg,
}
CASE_NAMES = tuple(_CASES)
