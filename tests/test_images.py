"""Input hygiene: every battery file and every array / PIL input becomes clean RGB or a clear sentence."""

from __future__ import annotations

import io
import random
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from bad_inputs import CASE_NAMES, FRAME_COLOURS, PHOTO, TRAVERSAL_NAME, BadInput, make_bad_inputs, png_bytes
from PIL import Image, ImageFile

from sapiens2.errors import ConfigError, Sapiens2Error
from sapiens2.vision.images import (
    MIN_SIDE,
    ImageInputError,
    LoadedImage,
    load_image,
    sanitize_filename,
)


@pytest.fixture(scope="module")
def battery(tmp_path_factory: pytest.TempPathFactory) -> dict[str, BadInput]:
    return make_bad_inputs(tmp_path_factory.mktemp("bad_inputs"))


class _Unseekable(io.RawIOBase):
    """A stream that can only be read forwards, like a socket or a pipe."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:
        chunk = self._data.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def _source(case: BadInput, kind: str) -> object:
    data = case.path.read_bytes()
    return {
        "path": case.path,
        "str": str(case.path),
        "bytes": data,
        "file": io.BytesIO(data),
        "unseekable": _Unseekable(data),
    }[kind]


def _assert_clean(image: LoadedImage, size: tuple[int, int]) -> None:
    assert image.rgb.shape == (*size, 3)
    assert image.rgb.dtype == np.uint8
    assert image.rgb.flags.c_contiguous and image.rgb.flags.writeable
    assert image.original_size == size
    if image.alpha is not None:
        assert image.alpha.shape == size and image.alpha.dtype == np.uint8


@pytest.mark.parametrize("kind", ["path", "bytes", "file"])
@pytest.mark.parametrize("name", CASE_NAMES)
def test_battery_case(battery: dict[str, BadInput], name: str, kind: str) -> None:
    case = battery[name]
    if case.error is not None:
        with pytest.raises(ImageInputError, match=re.escape(case.error)) as caught:
            load_image(_source(case, kind))
        message = str(caught.value)
        assert str(case.path.parent) not in message and "Traceback" not in message
        assert message.endswith(".") and message[0].isupper()
        return
    image = load_image(_source(case, kind))
    assert case.size is not None
    _assert_clean(image, case.size)
    assert (image.alpha is not None) == case.alpha
    if case.note is not None:
        assert any(case.note in note for note in image.notes), image.notes


@pytest.mark.parametrize("name", ["truncated_png", "bad_data_crc_png", "animated_gif", "exif_rotated"])
def test_unseekable_stream_behaves_like_the_file(battery: dict[str, BadInput], name: str) -> None:
    case = battery[name]
    try:
        expected: object = load_image(case.path).rgb
    except ImageInputError as exc:
        expected = str(exc)
    try:
        got: object = load_image(_source(case, "unseekable")).rgb
    except ImageInputError as exc:
        got = str(exc)
    if isinstance(expected, str):
        assert got == expected
    else:
        np.testing.assert_array_equal(got, expected)


def _mutated(data: bytes, rng: random.Random) -> bytes:
    """The file cut short, with a few bytes overwritten, or with junk inserted."""
    choice = rng.randrange(3)
    if choice == 0:
        return data[: rng.randrange(len(data))]
    mutated = bytearray(data)
    if choice == 1:
        for _ in range(rng.randint(1, 8)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
    else:
        at = rng.randrange(len(mutated))
        mutated[at:at] = rng.randbytes(rng.randint(1, 64))
    return bytes(mutated)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(
    "name",
    ["animated_gif", "animated_png", "animated_webp", "png16_grey", "float_tiff_nan", "bmp", "exif_rotated"],
)
def test_mutated_files_load_or_are_refused_but_never_crash(battery: dict[str, BadInput], name: str) -> None:
    data = battery[name].path.read_bytes()
    rng = random.Random(name)
    for _ in range(40):
        try:
            load_image(_mutated(data, rng))
        except ImageInputError:
            pass


@pytest.mark.parametrize("name", ["bomb_png_30000", "huge_gif_header", "over_megapixels_gif"])
def test_bomb_refused_from_the_header_without_decoding(
    battery: dict[str, BadInput], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_decoding(self: ImageFile.ImageFile) -> None:
        raise AssertionError("the pixels of a decompression bomb were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    Image.init()  # importing Pillow's plugins the first time is not the load's own memory
    tracemalloc.start()
    try:
        with pytest.raises(ImageInputError, match="too large"):
            load_image(battery[name].path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000
    assert battery[name].path.stat().st_size < 1000


@pytest.mark.parametrize("name", ["ztxt_bomb", "iccp_bomb", "itxt_bomb"])
def test_metadata_bombs_are_too_large_not_damaged(battery: dict[str, BadInput], name: str) -> None:
    # Pillow stops unpacking a text or colour-profile chunk after 1 MiB; the 50 MB it holds are never made.
    tracemalloc.start()
    try:
        with pytest.raises(ImageInputError, match="The image is too large") as caught:
            load_image(battery[name].path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "damaged" not in str(caught.value)
    assert peak < 8_000_000


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_just_over_the_pixel_limit_is_refused_with_its_size() -> None:
    with pytest.raises(
        ImageInputError, match=r"6001x4000 pixels \(24.0 megapixels\).*limit of 24 megapixels"
    ):
        load_image(png_bytes(6001, 4000))


def test_large_legal_photo_keeps_original_and_fits_the_model(battery: dict[str, BadInput]) -> None:
    image = load_image(battery["large_photo"].path)
    assert image.original_size == (4000, 6000)
    assert image.scale == pytest.approx(4096 / 6000)
    assert image.model_size == (2731, 4096)
    assert image.model_rgb.shape == (2731, 4096, 3) and image.model_rgb.dtype == np.uint8
    # A model-side pixel maps back to the original through `scale`.
    y, x = 1500, 2000  # inside the 2731x4096 model picture
    back = image.rgb[round(y / image.scale), round(x / image.scale)].astype(int)
    assert np.abs(image.model_rgb[y, x].astype(int) - back).max() < 12


def test_max_side_argument_and_environment(
    battery: dict[str, BadInput], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = battery["webp"].path
    assert load_image(path, max_side=300).model_rgb.shape == (300, 256, 3)
    monkeypatch.setenv("SAPIENS2_MAX_SIDE", "120")
    image = load_image(path)
    assert image.model_size == (120, 102) and image.rgb.shape == (600, 512, 3)
    assert "Downscaled from 512x600 to 102x120" in image.notes[0]
    monkeypatch.setenv("SAPIENS2_MAX_SIDE", "big")
    with pytest.raises(ConfigError, match="SAPIENS2_MAX_SIDE"):
        load_image(path)
    with pytest.raises(ConfigError, match="max_side"):
        load_image(path, max_side=MIN_SIDE - 1)


def test_small_image_is_its_own_model_image(battery: dict[str, BadInput]) -> None:
    image = load_image(battery["bmp"].path)
    assert image.scale == 1.0 and image.notes == []
    assert image.model_rgb is image.rgb


def test_first_frame_of_animations_and_page_of_tiffs(battery: dict[str, BadInput]) -> None:
    for name in ("animated_gif", "animated_png", "animated_webp", "multipage_tiff"):
        rgb = load_image(battery[name].path).rgb
        assert np.abs(rgb.astype(int) - FRAME_COLOURS[0]).max() <= 2, name


def test_exif_orientation_is_applied(battery: dict[str, BadInput]) -> None:
    path = battery["exif_rotated"].path
    with Image.open(path) as stored:
        as_stored = np.asarray(stored.convert("RGB"))
    np.testing.assert_array_equal(load_image(path).rgb, np.rot90(as_stored, k=-1))


def test_sixteen_bit_png_keeps_the_high_byte(battery: dict[str, BadInput]) -> None:
    path = battery["png16_grey"].path
    with Image.open(path) as image:
        values = np.asarray(image)
    rgb = load_image(path).rgb
    np.testing.assert_array_equal(rgb[..., 1], (values >> 8).astype(np.uint8))


def test_float_tiff_nan_becomes_black(battery: dict[str, BadInput]) -> None:
    path = battery["float_tiff_nan"].path
    with Image.open(path) as image:
        values = np.asarray(image)
    rgb = load_image(path).rgb
    assert (rgb[np.isnan(values)] == 0).all()
    finite = ~np.isnan(values)
    np.testing.assert_array_equal(rgb[..., 0][finite], np.rint(values[finite] * 255).astype(np.uint8))


def test_cmyk_and_greyscale_colours(battery: dict[str, BadInput]) -> None:
    with Image.open(PHOTO) as photo:
        reference = np.asarray(photo.convert("RGB")).astype(int)
    cmyk = load_image(battery["cmyk_jpeg"].path).rgb.astype(int)
    assert np.abs(cmyk - reference).mean() < 6
    grey = load_image(battery["greyscale_jpeg"].path).rgb
    assert (grey[..., 0] == grey[..., 1]).all() and (grey[..., 1] == grey[..., 2]).all()


def test_transparency_is_composited_on_white_and_kept(battery: dict[str, BadInput]) -> None:
    path = battery["half_transparent_png"].path
    with Image.open(path) as image:
        rgba = np.asarray(image).astype(int)
    loaded = load_image(path)
    np.testing.assert_array_equal(loaded.alpha, rgba[..., 3])
    expected = (rgba[..., :3] * rgba[..., 3:] + 255 * (255 - rgba[..., 3:]) + 127) // 255
    np.testing.assert_array_equal(loaded.rgb, expected)

    palette = load_image(battery["palette_transparency"].path)
    assert palette.alpha is not None
    hidden = palette.alpha == 0
    assert hidden.any() and (palette.rgb[hidden] == 255).all()


def test_traversal_name_is_neutralised(battery: dict[str, BadInput]) -> None:
    case = battery["traversal_name"]
    assert case.sent_name == TRAVERSAL_NAME
    assert sanitize_filename(case.sent_name) == "passwd.png"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("../../etc/passwd.png", "passwd.png"),
        ("/etc/shadow", "shadow"),
        ("C:\\Windows\\System32\\evil.png", "evil.png"),
        ("..\\..\\boot.ini", "boot.ini"),
        ("a\x00b.png", "a_b.png"),
        ("my holiday photo (1).JPG", "my_holiday_photo_1_.JPG"),
        ("café.png", "café.png"),
        ("．．／．．／x.png", "x.png"),
        ("..", "image"),
        ("", "image"),
        ("   ", "image"),
        (".bashrc", "bashrc"),
        ("-rf.png", "rf.png"),
        ("CON.png", "_CON.png"),
        ("nul", "_nul"),
        ("report\u202egnp.exe", "report_gnp.exe"),
    ],
)
def test_sanitize_filename(name: str, expected: str) -> None:
    assert sanitize_filename(name) == expected


def test_sanitize_filename_limits_length_and_keeps_extension() -> None:
    name = sanitize_filename("a" * 500 + ".png")
    assert len(name) == 120 and name.endswith(".png")


@pytest.mark.parametrize(
    ("array", "expected_grey"),
    [
        (np.full((40, 50), 7, np.uint8), 7),
        (np.full((40, 50, 1), 7, np.uint8), 7),
        (np.ones((40, 50), bool), 255),
        (np.full((40, 50), 0x1234, np.uint16), 0x12),
        (np.full((40, 50), 0x1234, ">u2"), 0x12),
        (np.full((40, 50), 0.5, np.float32), 128),
        (np.full((40, 50), 0.5, np.float16), 128),
        (np.full((40, 50), 200, np.int32), 200),
    ],
)
def test_array_dtypes_without_stretching(array: np.ndarray, expected_grey: int) -> None:
    image = load_image(array)
    _assert_clean(image, (40, 50))
    assert (image.rgb == expected_grey).all()
    assert not any("Stretched" in note for note in image.notes)


def test_array_out_of_range_is_stretched_with_a_note() -> None:
    floats = np.linspace(-5.0, 10.0, 40 * 50).reshape(40, 50)
    image = load_image(floats)
    assert image.rgb.min() == 0 and image.rgb.max() == 255
    assert "Stretched pixel values from the range -5 to 10 onto 0 to 255." in image.notes
    ints = load_image(np.arange(40 * 50, dtype=np.int64).reshape(40, 50))
    assert ints.rgb[0, 0, 0] == 0 and ints.rgb[-1, -1, 0] == 255


def test_array_nan_and_inf_are_replaced_with_a_note() -> None:
    values = np.full((40, 50, 3), 0.25)
    values[0, 0] = np.nan
    values[0, 1] = np.inf
    values[0, 2] = 0.75
    image = load_image(values)
    assert image.rgb[0, 0, 0] == 64 and image.rgb[0, 1, 0] == 191
    assert "Replaced 6 pixel values that were not numbers (NaN or infinite)." in image.notes


def test_rgba_array_keeps_alpha_and_does_not_share_memory() -> None:
    rgba = np.zeros((40, 50, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = 255
    rgba[:10, :, 3] = 0
    image = load_image(rgba)
    assert (image.rgb[:10] == 255).all() and (image.rgb[10:, :, 0] == 200).all()
    assert (image.alpha == rgba[..., 3]).all()
    rgb_input = np.zeros((40, 50, 3), np.uint8)
    loaded = load_image(rgb_input)
    rgb_input[:] = 9
    assert (loaded.rgb == 0).all()


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.zeros((3, 480, 640), np.float32), "channels-first"),
        (np.zeros((1, 480, 640), np.uint8), "channels-first"),
        (np.zeros((2, 480, 640, 3), np.uint8), "must have shape"),
        (np.zeros((480, 640, 2), np.uint8), "must have shape"),
        (np.zeros(480, np.uint8), "must have shape"),
        (np.zeros((48, 64), complex), "must hold numbers"),
        (np.zeros((48, 64), object), "must hold numbers"),
        (np.full((48, 64), np.nan), "no valid pixel values"),
        (np.zeros((16, 640, 3), np.uint8), "too small (640x16 pixels)"),
        (np.zeros((0, 0), np.uint8), "too small"),
        (np.broadcast_to(np.uint8(0), (10000, 9000)), "too large"),
        (np.zeros((40, 50, 4), np.uint8), "completely transparent"),
    ],
)
def test_array_refusals(array: np.ndarray, message: str) -> None:
    with pytest.raises(ImageInputError, match=re.escape(message)):
        load_image(array)


@pytest.mark.parametrize(
    ("mode", "alpha", "note"),
    [
        ("1", False, None),
        ("L", False, None),
        ("LA", True, None),
        ("P", False, None),
        ("PA", True, None),
        ("RGB", False, None),
        ("RGBA", True, None),
        ("CMYK", False, "CMYK"),
        ("YCbCr", False, None),
        ("I;16", False, "16-bit"),
        ("I;16B", False, "16-bit"),
        ("I", False, None),
        ("F", False, None),
    ],
)
def test_pil_modes(mode: str, alpha: bool, note: str | None) -> None:
    colour = {"RGBA": (10, 20, 30, 255), "LA": (10, 255), "PA": (0, 255)}.get(mode, 1)
    image = load_image(Image.new(mode, (50, 40), colour))
    _assert_clean(image, (40, 50))
    assert (image.alpha is not None) == alpha
    assert (note is None) == (not image.notes)
    if note is not None:
        assert note in image.notes[0]


def test_pil_image_with_orientation_tag_is_turned_upright() -> None:
    image = Image.new("RGB", (64, 40), "white")
    image.getexif()[0x0112] = 8
    assert load_image(image).rgb.shape == (64, 40, 3)


def test_unsupported_colour_mode_is_refused() -> None:
    with pytest.raises(ImageInputError, match="'La' colour mode"):
        load_image(Image.new("La", (40, 40)))


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (None, "No image was given"),
        (42, "from a int object"),
        ([[0, 1], [2, 3]], "from a list object"),
        ("https://example.com/cat.jpg", "Web addresses are not opened"),
        ("file:///etc/passwd", "Web addresses are not opened"),
        ("data:image/png;base64,AAAA", "Web addresses are not opened"),
        ("bad\x00name.png", "not valid"),
    ],
)
def test_other_sources_are_refused(source: object, message: str) -> None:
    with pytest.raises(ImageInputError, match=re.escape(message)):
        load_image(source)


def test_missing_file_and_folder_messages_hide_the_server_path(tmp_path: Path) -> None:
    with pytest.raises(ImageInputError) as missing:
        load_image(tmp_path / "secret_dir" / "holiday.jpg")
    assert str(missing.value) == "No file named 'holiday.jpg' was found. Please check the name."
    with pytest.raises(ImageInputError) as folder:
        load_image(tmp_path)
    assert "is a folder, not an image file" in str(folder.value)
    assert str(tmp_path.parent) not in str(folder.value)


def test_error_type_is_both_package_error_and_value_error() -> None:
    assert issubclass(ImageInputError, Sapiens2Error) and issubclass(ImageInputError, ValueError)
