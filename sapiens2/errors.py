"""Exceptions raised by the sapiens2 package."""


class Sapiens2Error(Exception):
    """Base class of every error raised by sapiens2."""


class ConfigError(Sapiens2Error, ValueError):
    """A config value is missing, malformed or not supported by this implementation."""


class CheckpointError(Sapiens2Error):
    """A checkpoint cannot be read or does not match the model it is loaded into."""


class CheckpointNotFoundError(CheckpointError):
    """No checkpoint exists at the given repo id, directory or file."""


class CheckpointDownloadError(CheckpointError):
    """A checkpoint file could not be downloaded: the connection failed, the Hub erred or the disk is full."""


class RequestError(Sapiens2Error, ValueError):
    """A request's own values (an option, a size, a task name) are not valid; the message says which."""


class LimitError(Sapiens2Error, ValueError):
    """An input is above what one request may cost (pixels, shape, frames, output); the message says the
    limit and how to get under it."""


class DeviceTimeError(LimitError):
    """A request used all the device time it may (its own, or what its client has left); the message says
    the limit and how to get under it."""


class OutOfSpaceError(Sapiens2Error, OSError):
    """The disk is full: a file could not be written (nothing partial is left)."""


class TrainingError(Sapiens2Error):
    """A training run cannot start or continue: bad options, a bad resume folder, out of memory."""


class DatasetError(TrainingError):
    """A training or validation dataset does not follow its layout; the message names the file and field."""
