"""Sentences for errors: what happened and what to do next, shared by the app and the command line."""

from __future__ import annotations

import errno
import re

import torch

from sapiens2.errors import (
    CheckpointDownloadError,
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    LimitError,
    RequestError,
    Sapiens2Error,
)
from sapiens2.models.hub import offline_instructions
from sapiens2.vision.detector import DetectorError
from sapiens2.vision.images import ImageInputError

EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    ImageInputError,
    Sapiens2Error,
    DetectorError,
    ValueError,
    MemoryError,
    torch.cuda.OutOfMemoryError,
)
_OFFICIAL_REPO = re.compile(r"\bfacebook/sapiens2-[a-z]+-[0-9.]+b\b")
_ASK_OPERATOR = "The details were logged on the server; please try again later, or tell whoever runs it."


def is_expected(error: BaseException) -> bool:
    """True for errors caused by the input, the setup or the machine; False for bugs worth a traceback."""
    return isinstance(error, EXPECTED_ERRORS) or disk_full(error)


def disk_full(error: BaseException) -> bool:
    """True when `error` says the disk (or the user's quota on it) is full."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def describe_error(error: BaseException, *, public: bool = False) -> str:
    """One or two sentences a person can act on, never a stack trace.

    `public` is for people on the web: no server path, setting or Python text ever reaches them (the
    operator's sentence, with paths, goes to the log and to the command line).
    """
    if isinstance(error, (ImageInputError, LimitError)):
        return _sentence(str(error))
    if isinstance(error, RequestError):
        return f"The request cannot be run: {_sentence(str(error))}"
    if disk_full(error):
        if public:
            return "The server's disk is full, so the results could not be written. Please try again later."
        return "The disk is full, so the results could not be written (nothing partial was left). " + (
            "Please free some space and try again."
        )
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return (
            "The GPU ran out of memory. Choose a smaller model size or a smaller photo, or try again in a "
            "moment when the server is less busy."
        )
    if isinstance(error, MemoryError):
        return "The server ran out of memory. Choose a smaller model size or a smaller photo and try again."
    if public:
        return _public(error)
    return _operator(error)


def _public(error: BaseException) -> str:
    # Official repo ids are public names; everything else in a checkpoint error (folders, settings) is not.
    found = _OFFICIAL_REPO.search(str(error))
    model = f"The model {found.group(0)}" if found else "The model"
    if isinstance(error, CheckpointNotFoundError):
        if found:  # what to do names no folder or setting of this server: it helps whoever runs it
            return (
                f"{model} is not on this server, and the server cannot download it. Whoever runs the server "
                f"can add it. {offline_instructions(found.group(0))}"
            )
        return f"{model} is not available on this server. {_ASK_OPERATOR}"
    if isinstance(error, CheckpointDownloadError):
        return f"{model} could not be downloaded just now. Please try again in a moment."
    if isinstance(error, CheckpointError):
        return f"{model} could not be loaded: its files on this server are damaged. {_ASK_OPERATOR}"
    if isinstance(error, DetectorError):
        return f"The person detector could not be loaded on the server. {_ASK_OPERATOR}"
    if isinstance(error, ConfigError):
        return f"The server is not set up correctly: one of its settings is not valid. {_ASK_OPERATOR}"
    if isinstance(error, Sapiens2Error) and isinstance(error, ValueError):  # our own sentences (videos)
        return _sentence(str(error))
    return (
        "Something went wrong while running the model. The details were logged on the server; please try "
        "again, or try another photo."
    )


def _operator(error: BaseException) -> str:
    text = _sentence(str(error))
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
