"""What one request may cost: pixels, shape, video frames and output bytes, each with its sentence.

Every limit is read from its environment variable when it is checked (so an operator, or a test, can change
it without a restart) and refused with one sentence that says the limit and how to get under it; the same
sentence whichever way the input came in (any endpoint of the app, the command line, Python). Limits are
checked from headers before any pixel is decoded, and again on what was decoded, since headers can lie.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from sapiens2.errors import ConfigError, LimitError

MEGAPIXELS_ENV = "SAPIENS2_MAX_MEGAPIXELS"
ASPECT_ENV = "SAPIENS2_MAX_ASPECT"
FRAME_MEGAPIXELS_ENV = "SAPIENS2_MAX_FRAME_MEGAPIXELS"
VIDEO_FRAMES_ENV = "SAPIENS2_MAX_VIDEO_FRAMES"
OUTPUT_MB_ENV = "SAPIENS2_MAX_OUTPUT_MB"
JPEG_SCANS_ENV = "SAPIENS2_MAX_JPEG_SCANS"
VIDEO_SAMPLES_ENV = "SAPIENS2_MAX_VIDEO_SAMPLES"

# 24 MP takes every phone and most camera photos as they are (12 MP phones, 6000x4000 cameras); a 12 MP
# photo runs in every tab. A 10:1 strip is wider than any panorama a phone takes in one sweep at 24 MP.
DEFAULT_MEGAPIXELS = 24.0
DEFAULT_ASPECT = 10.0
DEFAULT_FRAME_MEGAPIXELS = 8.3  # 3840x2160 (4K UHD) is 8.29 megapixels
DEFAULT_VIDEO_FRAMES = 300  # 10 s at 30 frames per second
DEFAULT_OUTPUT_MB = 1536.0  # a 24 MP photo through All tasks writes about 1.1 GB
# A progressive JPEG from a camera or an editor has about 10 scans, and each scan costs a pass over the whole
# image: 23,000 scans of a 24 MP photo took 55 s to decode.
DEFAULT_JPEG_SCANS = 100
JPEG_SCANS_COUNTED = 100  # scans are counted up to this many times the limit, then the count stops
# FFmpeg keeps an index entry (tens of bytes) per sample it is told of: a million is nine hours at 30 frames
# per second, about 40 MB of index.
DEFAULT_VIDEO_SAMPLES = 1_000_000


def positive_setting(name: str, default: float, *, whole: bool = False) -> float:
    """The number in environment variable `name` (above 0), or `default` when it is unset; ConfigError
    with a sentence otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        kind = "a whole number" if whole else "a number"
        raise ConfigError(f"{name} must be {kind} above 0, not {raw!r}.")
    return value


@dataclass(frozen=True)
class Limits:
    """The limits in force: megapixels and aspect ratio of an image, megapixels of a video frame, frames of a
    video per request (app only; None: no limit), megabytes of files written per request, scans of a JPEG
    and samples in any one table of an MP4/MOV (counted before decoding)."""

    megapixels: float = DEFAULT_MEGAPIXELS
    aspect: float = DEFAULT_ASPECT
    frame_megapixels: float = DEFAULT_FRAME_MEGAPIXELS
    video_frames: int = DEFAULT_VIDEO_FRAMES
    output_mb: float = DEFAULT_OUTPUT_MB
    jpeg_scans: int = DEFAULT_JPEG_SCANS
    video_samples: int = DEFAULT_VIDEO_SAMPLES

    @classmethod
    def from_env(cls) -> Limits:
        """The limits from SAPIENS2_MAX_MEGAPIXELS, _ASPECT, _FRAME_MEGAPIXELS, _VIDEO_FRAMES, _OUTPUT_MB,
        _JPEG_SCANS and _VIDEO_SAMPLES."""
        return cls(
            megapixels=positive_setting(MEGAPIXELS_ENV, DEFAULT_MEGAPIXELS),
            aspect=max(1.0, positive_setting(ASPECT_ENV, DEFAULT_ASPECT)),
            frame_megapixels=positive_setting(FRAME_MEGAPIXELS_ENV, DEFAULT_FRAME_MEGAPIXELS),
            video_frames=int(positive_setting(VIDEO_FRAMES_ENV, DEFAULT_VIDEO_FRAMES, whole=True)),
            output_mb=positive_setting(OUTPUT_MB_ENV, DEFAULT_OUTPUT_MB),
            jpeg_scans=int(positive_setting(JPEG_SCANS_ENV, DEFAULT_JPEG_SCANS, whole=True)),
            video_samples=int(positive_setting(VIDEO_SAMPLES_ENV, DEFAULT_VIDEO_SAMPLES, whole=True)),
        )

    def for_frames(self) -> Limits:
        """These limits with a video frame's megapixels for images: what a live webcam frame may be."""
        return replace(self, megapixels=self.frame_megapixels)

    def check_image(self, width: int, height: int) -> None:
        """Refuse an image above the megapixel limit or with a strip's shape, from its header."""
        _check_shape(width, height, self.aspect, "image's")
        if width * height > self.megapixels * 1e6:
            raise LimitError(
                f"The image is too large: {width}x{height} pixels ({width * height / 1e6:.1f} megapixels) is "
                f"above this server's limit of {self.megapixels:g} megapixels. Please resize it to at most "
                f"{_example(self.megapixels)} pixels and try again."
            )

    def check_frame(self, width: int, height: int) -> None:
        """Refuse a video whose frames are above the frame limit or have a strip's shape."""
        _check_shape(width, height, self.aspect, "video frames'")
        if width * height > self.frame_megapixels * 1e6:
            raise LimitError(
                f"The video's frames are too large: {width}x{height} pixels ({width * height / 1e6:.1f} "
                f"megapixels) is above this server's limit of {self.frame_megapixels:g} megapixels per "
                f"frame. Please resize the video to at most {_example(self.frame_megapixels)} and try again."
            )

    def check_jpeg_scans(self, scans: int) -> None:
        """Refuse a JPEG with more scans (progressive passes) than the limit, counted from its markers up to
        JPEG_SCANS_COUNTED times the limit."""
        if scans > self.jpeg_scans:
            counted = self.jpeg_scans * JPEG_SCANS_COUNTED
            how_many = f"more than {counted}" if scans > counted else str(scans)
            raise LimitError(
                f"The JPEG image has {how_many} scans (progressive passes), above this server's limit of "
                f"{self.jpeg_scans}; each pass decodes the whole image again, and a photo has about 10. "
                "Please re-save it as an ordinary (baseline) JPEG or as a PNG and try again."
            )

    def check_output(self, written_bytes: int) -> None:
        """Refuse a request whose files take more than the output limit."""
        if written_bytes > self.output_mb * 1e6:
            raise LimitError(
                f"The results are too large: they would take {written_bytes / 1e6:.0f} MB of files, above "
                f"this server's limit of {self.output_mb:g} MB per request. Please send a smaller image "
                "and try again."
            )


def too_large_unknown(megapixels: float) -> LimitError:
    """The sentence for an image whose size cannot be read but is known to be too large (a bomb)."""
    return LimitError(
        f"The image is too large: it unpacks to more than this server's limit of {megapixels:g} megapixels "
        "(or holds metadata that does). Please re-save it at a normal size without its metadata and try "
        "again."
    )


def _check_shape(width: int, height: int, aspect: float, what: str) -> None:
    long, short = max(width, height), min(width, height)
    if short <= 0 or long / short > aspect:
        ratio = f"{long / short:.0f} to 1" if short > 0 else "no height"
        raise LimitError(
            f"The {what} shape is too narrow: {width}x{height} pixels is a strip ({ratio}), above this "
            f"server's limit of {aspect:g} to 1 between the long and the short side. Please crop it "
            "closer to a photo's shape and try again."
        )


def _example(megapixels: float) -> str:
    """A 3:2 size (width x height) of about `megapixels`, as an example of what fits."""
    height = int(math.sqrt(megapixels * 1e6 / 1.5))
    return f"{int(height * 1.5)}x{height}"
