"""A bounded scratch area: one fresh folder per request under one root, bounded by folders and by bytes,
and what each client's answers write, counted.

A request writes its answer's files here; Gradio then copies them into its own cache, where they stay for
the cache's life. So once Gradio has its copy (`drop_after_copy`), the request's folder is deleted; the
folders of requests still writing are bounded together by bytes (`SAPIENS2_SCRATCH_MB`), and the bytes each
client's answers leave in Gradio's cache are counted over the cache's life like uploads
(`SAPIENS2_ANSWER_QUOTA_MB` per client, `SAPIENS2_ANSWER_TOTAL_MB` for everyone), so one client cannot fill
the disk the others' answers need.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sapiens2.errors import LimitError
from sapiens2.outputs.partial_files import make_folder
from sapiens2.serving.uploads import MB, UploadLedger
from sapiens2.settings import current

DEFAULT_KEEP = 64
# SAPIENS2_SCRATCH_MB's 4000: two requests at the 1536 MB output limit; SAPIENS2_ANSWER_QUOTA_MB's 3000: two
# of the largest answers in the cache's life, per client.
DEFAULT_WINDOW = 2400.0  # the app's Gradio cache life plus its sweep interval, in seconds


class AnswerLedger(UploadLedger):
    """Bytes of answers per client and in all over the last `window` seconds, as uploads are counted."""

    def _over(self, mine: int, everyone: int, size: int) -> str | None:
        minutes = f"{self.window / 60:.0f} minutes"
        if mine + size > self.quota_bytes:
            return (
                f"The results were not kept: with them, your results of the last {minutes} would take more "
                f"than this server's limit of {self.quota_bytes / MB:.0f} MB per person (results are kept "
                f"for {minutes}). Please try again later, or send a smaller image or clip."
            )
        if everyone + size > self.total_bytes:
            return (
                "The results were not kept: the server's space for results is full just now. Please try "
                "again in a few minutes."
            )
        return None


class ScratchSpace:
    """Hands out per-request folders under `root`, keeping only the newest `keep` of them on disk.

    Files are only needed until the web server has copied them into its own cache, which happens as soon
    as the request returns, so a few dozen folders are plenty even under load.
    """

    def __init__(
        self,
        root: str | Path | None = None,
        keep: int = DEFAULT_KEEP,
        max_bytes: int | None = None,
        ledger: UploadLedger | None = None,
    ):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="sapiens2-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        settings = current()
        self.max_bytes = max_bytes or settings.scratch_mb * MB
        self.ledger = ledger or AnswerLedger(
            settings.answer_quota_mb * MB, settings.answer_total_mb * MB, DEFAULT_WINDOW
        )
        self.trusted_proxies = settings.trusted_proxies  # clients are told apart as uploads' are
        self._handed_over: set[Path] = set()
        self._counter = itertools.count()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def request_folder(self) -> Iterator[Path]:
        """A new folder for one request's files, deleted when the request fails (or its page goes away)
        before its answer is handed over."""
        folder = self.new_folder()
        try:
            yield folder
        except BaseException:
            self.discard(folder)
            raise

    def new_folder(self) -> Path:
        """A new empty folder; the oldest folders beyond `keep` are deleted first. The root is made again
        when something (a temporary-file cleaner) deleted it."""
        with self._lock:
            make_folder(self.root)  # not once the process is stopping: its cleanup removed the root
            self._prune(self.keep - 1)
            folder = self.root / f"{time.time_ns():020d}-{next(self._counter):06d}"
            folder.mkdir()
            return folder

    def folders(self) -> list[Path]:
        """Folders held now, oldest first."""
        try:
            return sorted(path for path in self.root.iterdir() if path.is_dir())
        except FileNotFoundError:
            return []

    def size_bytes(self) -> int:
        """Bytes of every file under the root."""
        return self.folder_bytes(self.root)

    @staticmethod
    def folder_bytes(folder: Path) -> int:
        """Bytes of every file under `folder` (0 when it is gone)."""
        total = 0
        # os.walk skips a folder another request deletes while it is read (rglob raises there).
        for parent, _, names in os.walk(folder):
            for name in names:
                with contextlib.suppress(OSError):  # deleted meanwhile
                    status = os.lstat(os.path.join(parent, name))
                    total += status.st_size if stat.S_ISREG(status.st_mode) else 0
        return total

    def discard(self, folder: Path) -> None:
        """Delete one folder handed out before."""
        with self._lock:
            self._handed_over.discard(Path(folder))
        shutil.rmtree(folder, ignore_errors=True)

    def hand_over(self, folder: Path, client: str) -> None:
        """A request's answer is complete in `folder`: count its bytes to `client`, or refuse it
        (LimitError) when the folders being written take more than `max_bytes` or the client's answers
        their quota. The folder is deleted once Gradio has copied it (`release`)."""
        size = self.folder_bytes(folder)
        if self.size_bytes() - self._handed_over_bytes() > self.max_bytes:
            raise LimitError(
                "The results were not kept: the server's space for results being written is full just now "
                f"(its limit is {self.max_bytes / MB:.0f} MB). Please try again in a minute."
            )
        refusal = self.ledger.take(client, size)
        if refusal:
            raise LimitError(refusal)
        with self._lock:
            self._handed_over.add(Path(folder))

    def release(self, paths: Iterable[str]) -> None:
        """Delete the handed-over folders that hold any of `paths`: their files have been copied."""
        folders = set()
        for path in paths:
            try:
                relative = Path(path).absolute().relative_to(self.root.absolute())
            except ValueError:
                continue
            if relative.parts:
                folders.add(self.root / relative.parts[0])
        with self._lock:
            done = folders & self._handed_over
            self._handed_over -= done
        for folder in done:
            shutil.rmtree(folder, ignore_errors=True)

    def _handed_over_bytes(self) -> int:
        with self._lock:
            folders = list(self._handed_over)
        return sum(self.folder_bytes(folder) for folder in folders)

    def remove(self) -> None:
        """Delete the root and everything in it."""
        shutil.rmtree(self.root, ignore_errors=True)

    def _prune(self, keep: int) -> None:
        folders = self.folders()
        for folder in folders[: max(0, len(folders) - keep)]:
            self._handed_over.discard(folder)
            shutil.rmtree(folder, ignore_errors=True)


def drop_after_copy(demo: Any, scratch: ScratchSpace) -> None:
    """Delete a request's scratch folder as soon as Gradio has copied its answer into its cache.

    Gradio copies an answer's files in `postprocess_data`, right after the handler returns (or yields);
    a folder is deleted there only once its request handed it over (`ScratchSpace.hand_over`, its last
    answer), so a streamed request keeps its folder until its end.
    """
    postprocess = demo.postprocess_data

    async def postprocess_then_drop(block_fn: Any, predictions: Any, state: Any) -> Any:
        try:
            return await postprocess(block_fn, predictions, state)
        finally:
            scratch.release(_strings(predictions))

    demo.postprocess_data = postprocess_then_drop


def _strings(value: Any) -> list[str]:
    """Every string in a handler's outputs (lists, dicts and Gradio updates searched)."""
    found, pending = [], [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif hasattr(item, "value"):  # a component returned as an update
            pending.append(getattr(item, "value", None))
    return found
