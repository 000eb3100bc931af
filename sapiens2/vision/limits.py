"""What one request may cost: pixels, shape, video frames and output bytes, each with its sentence.

Every limit comes from the settings (`SAPIENS2_MAX_*`, sapiens2.settings) and is refused with one sentence
that says the limit and how to get under it; the same sentence whichever way the input came in (any endpoint
of the app, the command line, Python). Limits are checked from headers before any pixel is decoded, and again
on what was decoded, since headers can lie.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sapiens2.errors import LimitError
from sapiens2.settings import Settings, current

JPEG_SCANS_COUNTED = 100  # scans are counted up to this many times the limit, then the count stops
_DEFAULTS = Settings()


@dataclass(frozen=True)
class Limits:
    """The limits in force: megapixels and aspect ratio of an image, megapixels of a video frame, frames of a
    video per request (app only; None: no limit), megabytes of files written per request, scans of a JPEG
    and samples in any one table of an MP4/MOV (counted before decoding)."""

    megapixels: float = _DEFAULTS.max_megapixels
    aspect: float = _DEFAULTS.max_aspect
    frame_megapixels: float = _DEFAULTS.max_frame_megapixels
    video_frames: int = _DEFAULTS.max_video_frames
    output_mb: float = _DEFAULTS.max_output_mb
    jpeg_scans: int = _DEFAULTS.max_jpeg_scans
    video_samples: int = _DEFAULTS.max_video_samples

    @classmethod
    def of(cls, settings: Settings | None = None) -> Limits:
        """The limits `settings` give (the settings in force when None)."""
        settings = settings or current()
        return cls(
            megapixels=settings.max_megapixels,
            aspect=max(1.0, settings.max_aspect),
            frame_megapixels=settings.max_frame_megapixels,
            video_frames=settings.max_video_frames,
            output_mb=settings.max_output_mb,
            jpeg_scans=settings.max_jpeg_scans,
            video_samples=settings.max_video_samples,
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
