"""A live webcam frame as the page sends it, turned into a clean image by the app's own input hygiene.

The page sends each frame as a `data:` URL (a base64 JPEG) inside Gradio's image payload. The stream event
takes that payload raw (preprocess=False), so Gradio never decodes a frame: its bytes are checked here
(length, then what `load_image` checks for every photo: the formats, the JPEG's scans, the size from the
header) before a pixel is decoded, against the limits of a video frame. A payload naming a file is read
only from Gradio's upload folder, as for every other event.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from sapiens2.serving.requests import upload
from sapiens2.vision.images import ImageInputError, LoadedImage, load_image
from sapiens2.vision.limits import Limits

# A 4K JPEG from a browser is 1-3 MB; the request itself is bounded by sapiens2.serving.bodies.
MAX_FRAME_BYTES = 6_000_000
_FRAME_URL = re.compile(r"data:image/[a-z0-9.+-]{1,40};base64,", re.IGNORECASE)

NOT_A_FRAME = (
    "The webcam frame could not be read: it is not an image the page sends. Please restart the webcam."
)


def frame_image(payload: Any) -> LoadedImage | None:
    """The frame of a webcam payload as a clean image; None when no frame was sent. ImageInputError (a
    sentence) for anything that is not an image within a video frame's limits."""
    if payload is None:
        return None
    if not isinstance(payload, dict):
        raise ImageInputError(NOT_A_FRAME)
    url = payload.get("url")
    if isinstance(url, str) and url[:5].lower() == "data:":
        return load_image(_frame_bytes(url), limits=Limits.of().for_frames())
    path, _ = upload(payload)
    if path is None:
        raise ImageInputError(NOT_A_FRAME)
    return load_image(path, limits=Limits.of().for_frames())


def _frame_bytes(url: str) -> bytes:
    """The bytes of a base64 `data:image/...` URL, refused when it is longer than a frame may be."""
    head = _FRAME_URL.match(url)
    if head is None:
        raise ImageInputError(NOT_A_FRAME)
    encoded = url[head.end() :]
    if len(encoded) > MAX_FRAME_BYTES * 4 // 3 + 4:
        raise ImageInputError(
            f"The webcam frame is too large: more than {MAX_FRAME_BYTES // 1_000_000} MB. Please use the "
            "webcam at a lower resolution."
        )
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError(NOT_A_FRAME) from None
