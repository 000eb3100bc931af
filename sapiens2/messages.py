"""Sentences for errors: what happened and what to do next, shared by the app and the command line."""

from __future__ import annotations

import torch

from .detector import DetectorError
from .errors import CheckpointDownloadError, CheckpointError, CheckpointNotFoundError, ConfigError
from .images import ImageInputError

EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    ImageInputError,
    CheckpointError,
    DetectorError,
    ConfigError,
    ValueError,
    MemoryError,
    torch.cuda.OutOfMemoryError,
)


def is_expected(error: BaseException) -> bool:
    """True for errors caused by the input, the setup or the machine; False for bugs worth a traceback."""
    return isinstance(error, EXPECTED_ERRORS)


def describe_error(error: BaseException) -> str:
    """One or two sentences a person can act on, never a stack trace."""
    text = _sentence(str(error))
    if isinstance(error, ImageInputError):
        return text
    if isinstance(error, CheckpointNotFoundError):
        return f"The model could not be found or downloaded: {text}"
    if isinstance(error, CheckpointDownloadError):
        return f"The model could not be downloaded: {text} Please try again in a moment."
    if isinstance(error, CheckpointError):
        if "HF_TOKEN" in text:
            return f"The model could not be downloaded: {text}"
        return (
            f"The model could not be loaded: {text} If its files are damaged, delete them (from the "
            "Hugging Face cache or SAPIENS2_CHECKPOINT_DIR) so that they are fetched again."
        )
    if isinstance(error, DetectorError):
        return (
            f"The person detector could not run: {text} Set SAPIENS2_DETECTOR to an ultralytics model name "
            "such as yolo11m.pt or to the path of a local .pt file."
        )
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return (
            "The GPU ran out of memory. Choose a smaller model size or a smaller photo, or try again in a "
            "moment when the server is less busy."
        )
    if isinstance(error, MemoryError):
        return "The server ran out of memory. Choose a smaller model size or a smaller photo and try again."
    if isinstance(error, ConfigError):
        return f"A setting is not valid: {text}"
    if isinstance(error, ValueError):
        return f"The request cannot be run: {text}"
    return (
        f"Something went wrong while running the model ({type(error).__name__}). The details were logged "
        "on the server; please try again, or try another photo."
    )


def _sentence(text: str) -> str:
    """`text` ending with a full stop (its first letter is kept: it may begin a repo id or a path)."""
    text = text.strip() or "no details"
    return text if text.endswith((".", "!", "?")) else text + "."
