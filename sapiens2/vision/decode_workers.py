"""Image decoding with a deadline: in warm worker processes that are abandoned when a decode runs too long.

The header checks (formats, pixels, a JPEG's scans) refuse what they can see, but a file could still pass
them all and take minutes to decode. `DecodeWorkers` runs `load_image` for a file or bytes in a separate
process (started by forkserver, so no thread or lock of the server is copied into it; its pixels come back
through shared memory) and waits at most
$SAPIENS2_DECODE_SECONDS; a decode that runs past it has its process killed and replaced, and the request
gets a sentence, while the server's thread goes on serving. Workers are started ahead of need and reused,
so a normal photo pays only for its pixels crossing a pipe (measured in docs/reliability.md).

The web app installs the workers while it serves (`decoding_in_workers`); the command line, the batch
engine and Python callers decode in their own process.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import signal
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from sapiens2.settings import current
from sapiens2.vision import images
from sapiens2.vision.images import ImageInputError, LoadedImage, load_image
from sapiens2.vision.limits import Limits

log = logging.getLogger("sapiens2.app")

SHARED_BYTES = 2**20  # smaller pixels go through the pipe: a shared block costs more to make than to pickle
WARM_WORKERS = 2  # started ahead: one per model worker of the app
KEPT_WORKERS = 6  # kept once started: the app's 2 model requests and 4 webcam streams decoding at once
START_SECONDS = 120.0  # a worker's start, on a busy machine
READY = "ready"


def decode_seconds() -> float:
    """How long one image may take to decode: $SAPIENS2_DECODE_SECONDS, or 20."""
    return current().decode_seconds


def too_slow(seconds: float) -> ImageInputError:
    return ImageInputError(
        f"The image took longer than this server's limit of {seconds:g} seconds to decode, so it was "
        "abandoned. Please re-save it as an ordinary JPEG or PNG and try again."
    )


DECODER_STOPPED = ImageInputError(
    "The image could not be decoded: the decoder stopped before it finished (the image may need more "
    "memory than this server has). Please send a smaller image."
)


def _serve(connection: Connection) -> None:
    """A worker's life: decode each (source, max side, limits) it is sent and send back the image or the
    sentence, until its pipe closes. A Ctrl-C in the server's terminal is the server's to handle, and a
    pipe the server closed (it is stopping) ends the worker without a word."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        connection.send(READY)
        while True:
            source, max_side, limits = connection.recv()
            try:
                answer: Any = _shared(load_image(source, max_side=max_side, limits=limits))
            except ImageInputError as error:
                answer = ImageInputError(str(error))
            except Exception:  # anything else is the server's problem, said in the parent's words
                answer = DECODER_STOPPED
            connection.send(answer)
    except (EOFError, OSError):
        return


def _shared(image: LoadedImage) -> tuple:
    """The image with its pixels of SHARED_BYTES or more moved into shared memory (named blocks the parent
    reads and removes): a copy each way instead of a pickle through the pipe."""
    return (_to_block(image.rgb), _to_block(image.alpha), image.original_size, image.scale, image.notes)


def _to_block(pixels: np.ndarray | None) -> Any:
    if pixels is None or pixels.nbytes < SHARED_BYTES:
        return pixels
    block = SharedMemory(create=True, size=max(1, pixels.nbytes))
    np.ndarray(pixels.shape, pixels.dtype, buffer=block.buf)[...] = pixels
    block.close()
    return block.name, pixels.shape, pixels.dtype.str


def _from_block(reference: Any) -> np.ndarray | None:
    if reference is None or isinstance(reference, np.ndarray):
        return reference
    name, shape, dtype = reference
    block = SharedMemory(name=name)
    try:
        return np.array(np.ndarray(shape, np.dtype(dtype), buffer=block.buf))
    finally:
        block.close()
        block.unlink()


def _image(answer: tuple) -> LoadedImage:
    rgb, alpha, original_size, scale, notes = answer
    return LoadedImage(_from_block(rgb), _from_block(alpha), original_size, scale, notes)


class _Worker:
    def __init__(self, context: Any) -> None:
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=_serve, args=(theirs,), daemon=True, name="sapiens2-decode")
        self.process.start()
        theirs.close()
        self.started = False

    def wait_until_started(self) -> None:
        """Wait for the worker to be ready (the deadline counts the decode, not the start); EOFError if it
        does not start."""
        if not self.started:
            if not self.connection.poll(START_SECONDS) or self.connection.recv() != READY:
                raise EOFError
            self.started = True

    def decode(self, request: tuple, seconds: float) -> Any:
        """The worker's answer, or TimeoutError when none came within `seconds`."""
        self.wait_until_started()
        self.connection.send(request)
        if not self.connection.poll(seconds):
            raise TimeoutError
        return self.connection.recv()

    def stop(self) -> None:
        self.process.kill()
        self.process.join()
        self.connection.close()


class DecodeWorkers:
    """Worker processes that decode images under a deadline: `warm` of them started ahead, up to `kept`
    kept for the next decodes once started."""

    def __init__(self, warm: int = WARM_WORKERS, kept: int = KEPT_WORKERS) -> None:
        self._context = multiprocessing.get_context("forkserver")
        # Workers are forked from a server process that has imported this module (and torch, which the
        # package imports) once, so each starts in a moment and shares those pages.
        self._context.set_forkserver_preload([__name__])
        self._warm, self._kept = warm, max(warm, kept)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self.abandoned = 0
        self._refill()

    def decode(self, source: Any, max_side: int, limits: Limits) -> LoadedImage:
        """`load_image(source)` in a worker; ImageInputError when it fails or runs past the deadline."""
        if callable(getattr(source, "read", None)):
            source = source.read()
        if isinstance(source, (bytearray, memoryview)):
            source = bytes(source)
        seconds = decode_seconds()
        worker = self._take()
        try:
            answer = worker.decode((source, max_side, limits), seconds)
        except TimeoutError:
            self._abandon(worker, "ran past its deadline")
            raise too_slow(seconds) from None
        except (EOFError, OSError):  # the worker died: killed for memory, most often
            self._abandon(worker, "stopped")
            raise DECODER_STOPPED from None
        self._give_back(worker)
        if isinstance(answer, ImageInputError):
            raise answer
        return _image(answer)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()

    def _take(self) -> _Worker:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None or not worker.process.is_alive():
            worker = _Worker(self._context)
        return worker

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            keep = not self._closed and len(self._idle) < self._kept
            if keep:
                self._idle.append(worker)
        if not keep:
            worker.stop()

    def _abandon(self, worker: _Worker, why: str) -> None:
        self.abandoned += 1
        log.warning("an image decode %s; its worker was replaced", why)
        worker.stop()
        self._refill()

    def _refill(self) -> None:
        """Start workers up to `warm` in the background, so no request waits for one to start."""

        def start() -> None:
            while True:
                with self._lock:
                    if self._closed or len(self._idle) >= self._warm:
                        return
                worker = _Worker(self._context)
                try:
                    worker.wait_until_started()
                except (EOFError, OSError):
                    log.warning("an image decode worker did not start")
                    worker.stop()
                    return
                self._give_back(worker)

        threading.Thread(target=start, daemon=True, name="sapiens2-decode-start").start()


@contextlib.contextmanager
def decoding_in_workers(warm: int = WARM_WORKERS) -> Iterator[DecodeWorkers]:
    """While the block runs, `load_image` decodes every file and bytes object in workers, under the
    deadline (arrays and PIL images are already decoded and stay in-process)."""
    workers = DecodeWorkers(warm)
    images.decode_elsewhere(workers.decode)
    try:
        yield workers
    finally:
        images.decode_elsewhere(None)
        workers.close()
