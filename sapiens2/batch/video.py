"""Videos: frames decoded on a background thread, run through a task in batches, written back as a video.

Frames are read with OpenCV while the model works on the previous batch (a bounded queue between the two),
so the accelerator does not wait on decoding. The overlay video keeps the source frame rate divided by the
stride; a task with a frame log (pose: the official demo's JSON) also writes one record of every frame.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from sapiens2.batch.motion_video import VideoMotion, motion_suffixes, wanted
from sapiens2.errors import DeviceTimeError
from sapiens2.outputs.partial_files import make_folder, partial
from sapiens2.progress import Progress, within
from sapiens2.runtime.jobs import check_cancelled
from sapiens2.runtime.runtime import Runtime
from sapiens2.tasks.outputs import draw_result
from sapiens2.tasks.registry import Task, get_task
from sapiens2.vision.images import sanitize_filename
from sapiens2.vision.limits import Limits
from sapiens2.vision.video_files import VideoError, bare_name, checked_video, open_capture

VIDEO_EXTENSIONS = frozenset({".mp4", ".mov", ".avi", ".mkv", ".webm"})
DEFAULT_MAX_SECONDS = 10.0
# Container -> OpenCV codec. mp4v is fast to write and plays in desktop players; browsers play the VP8
# WebM without a converter.
VIDEO_FORMATS = {"mp4": "mp4v", "webm": "VP80"}
# What OpenCV's FFmpeg prints on stderr when it opens a VP8 WebM writer: the muxer stores no codec tag,
# which changes nothing in the file.
_HARMLESS_WRITER_NOTES = (b"is not supported with codec id",)
_stderr_lock = threading.Lock()

_END = object()


@dataclass(frozen=True)
class VideoInfo:
    """What the container says: frames per second, frame count (None when unknown) and frame size."""

    fps: float
    frame_count: int | None
    width: int
    height: int

    @property
    def duration(self) -> float | None:
        """Length in seconds, when the frame count is known."""
        return None if self.frame_count is None else self.frame_count / self.fps


@dataclass(frozen=True)
class VideoJob:
    """A task to run on a video and what to write.

    Frames go through the model `batch_size` at a time (None: the runtime's); `stride` keeps every n-th
    frame; `max_frames` and `max_seconds` (of source time; None for no limit) cut the video short. The
    video shows the task's first picture of each frame, as a VP8 WebM that browsers play or, with
    video_format="mp4", an mp4v MP4 (much faster to write; desktop players only); `write_log` also writes
    the task's frame log, if it has one. `options` holds the task's options and its video options (pose:
    tracking, smoothing, detect_every), by name.
    """

    task: str
    path: str | os.PathLike
    out_dir: str | os.PathLike
    size: str | None = None
    model: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    stem: str | None = None
    max_seconds: float | None = DEFAULT_MAX_SECONDS
    max_frames: int | None = None
    stride: int = 1
    batch_size: int | None = None
    video_format: str = "webm"
    write_video: bool = True
    write_log: bool = True
    write_view: bool = False  # with motion capture: also the 3-D view's file (the first frame behind)
    limits: Limits | None = None  # the app's: frames above its frame size are refused (None: any size)

    def __post_init__(self) -> None:
        for name in ("stride", "max_frames", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.video_format not in VIDEO_FORMATS:
            raise ValueError(f"video format {self.video_format!r} is not one of {', '.join(VIDEO_FORMATS)}")

    @property
    def output_stem(self) -> str:
        """The stem of the files written: `stem`, else the video's own name made safe."""
        return self.stem or sanitize_filename(Path(self.path).stem, default="video")


@dataclass
class VideoResult:
    """A processed video: the video and the frame log (None when not written), frames run, the video's
    frame rate, seconds of wall time, persons detected over all frames (None for tasks that detect none),
    notes for the user, the videos of the task's other pictures (pose: the ControlNet drawing) and the
    files in other tools' formats written beside the log (pose: COCO results, OpenPose's folder of
    frames)."""

    video_path: Path | None
    log_path: Path | None
    frames: int
    fps: float
    seconds: float
    persons: int | None = None
    notes: list[str] = field(default_factory=list)
    format_paths: list[Path] = field(default_factory=list)
    picture_paths: list[Path] = field(default_factory=list)
    motion_paths: list[Path] = field(default_factory=list)  # the motion files (with motion capture)
    view_path: Path | None = None  # the file a 3-D viewer shows (with motion capture and `write_view`)

    @property
    def frames_per_second(self) -> float:
        """Throughput: frames decoded, run through the model and written, per second of wall time."""
        return self.frames / self.seconds if self.seconds > 0 else 0.0

    @property
    def files(self) -> list[Path]:
        """The files written."""
        video = [self.video_path] if self.video_path is not None else []
        log = [self.log_path] if self.log_path is not None else []
        return video + self.picture_paths + log + self.format_paths + self.motion_paths


def _open(path: str | os.PathLike) -> cv2.VideoCapture:
    """A capture of `path`, once its own bytes say it is a video we decode (`vision.video_files`)."""
    with checked_video(path) as name:
        return open_capture(name, bare_name(path))


def _info(capture: cv2.VideoCapture) -> VideoInfo:
    fps = capture.get(cv2.CAP_PROP_FPS)
    count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
    return VideoInfo(
        fps=fps if math.isfinite(fps) and fps > 0 else 25.0,
        frame_count=count if count > 0 else None,
        width=int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
        height=int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)),
    )


def video_info(path: str | os.PathLike) -> VideoInfo:
    """Frame rate, frame count and size of a video file; VideoError when it cannot be opened."""
    capture = _open(path)
    try:
        return _info(capture)
    finally:
        capture.release()


def source_frame_limit(info: VideoInfo, max_seconds: float | None) -> int | None:
    """Source frames inside the first `max_seconds` (None: no limit)."""
    return None if max_seconds is None else math.ceil(max_seconds * info.fps)


def planned_frames(
    info: VideoInfo, *, stride: int = 1, max_frames: int | None = None, max_seconds: float | None = None
) -> int | None:
    """How many frames a run will take from the video; None when the container does not say."""
    limit = source_frame_limit(info, max_seconds)
    source = info.frame_count if limit is None else min(info.frame_count or limit, limit)
    if source is None:
        return max_frames
    taken = math.ceil(source / stride)
    return taken if max_frames is None else min(taken, max_frames)


class FrameReader:
    """Decodes every `stride`-th frame (RGB; stride >= 1) on a background thread into a bounded queue.

    Iterating gives (source frame index, RGB uint8) pairs; leaving the `with` block stops the thread.
    """

    def __init__(
        self,
        capture: cv2.VideoCapture,
        *,
        stride: int = 1,
        max_frames: int | None = None,
        source_limit: int | None = None,
        queue_size: int = 16,
        limits: Limits | None = None,
    ):
        self._capture = capture
        self._limits = limits
        self.cut_short = False  # True when a limit, not the end of the video, stopped the reading
        self._stride = stride
        self._max_frames = max_frames
        self._source_limit = source_limit
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._decode, name="sapiens2-video-decode", daemon=True)

    def __enter__(self) -> FrameReader:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _put(self, item: Any) -> bool:
        """Queue `item`, waiting for room; False once the reader is stopped."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _wanted(self, index: int, taken: int) -> bool | None:
        """True to decode frame `index`, False to skip it, None when the run has all its frames."""
        if self._source_limit is not None and index >= self._source_limit:
            self.cut_short = True
            return None
        if self._max_frames is not None and taken >= self._max_frames:
            self.cut_short = True
            return None
        return index % self._stride == 0

    def _decode(self) -> None:
        index = taken = 0
        try:
            while (wanted := self._wanted(index, taken)) is not None:
                if not wanted:
                    if not self._capture.grab():
                        break
                else:
                    ok, bgr = self._capture.read()
                    if not ok:
                        break
                    if self._limits is not None:  # the container's header may have lied about the size
                        self._limits.check_frame(bgr.shape[1], bgr.shape[0])
                    if not self._put((index, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))):
                        return
                    taken += 1
                index += 1
        except Exception as error:  # handed to the consumer, which raises it
            self._put(error)
        self._put(_END)


class VideoFileWriter:
    """A video (codec chosen by the file's extension, see VIDEO_FORMATS) written under a hidden name and
    renamed into place when complete; RGB frames in."""

    def __init__(self, path: Path, fps: float):
        self.path = path
        self._temporary = path.with_name(f".{path.stem}.{secrets.token_hex(6)}{path.suffix}")
        self._fps = fps
        self._writer: cv2.VideoWriter | None = None
        self._size: tuple[int, int] | None = None
        self._temporaries = contextlib.ExitStack()

    def __enter__(self) -> VideoFileWriter:
        return self

    def write(self, rgb: np.ndarray) -> None:
        """Append one frame; the first frame sets the video's size, later ones are fitted to it."""
        height, width = rgb.shape[:2]
        if self._writer is None:
            make_folder(self.path.parent)
            self._size = (width, height)
            codec = VIDEO_FORMATS[self.path.suffix[1:]]
            self._writer = self._temporaries.enter_context(partial(self._temporary, self._open))
            if not self._writer.isOpened():
                raise VideoError(f"OpenCV cannot write {codec} video at {self.path}")
        if (width, height) != self._size:
            rgb = cv2.resize(rgb, self._size, interpolation=cv2.INTER_AREA)
        self._writer.write(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))

    def _open(self, temporary: Path) -> cv2.VideoWriter:
        fourcc = cv2.VideoWriter_fourcc(*VIDEO_FORMATS[self.path.suffix[1:]])
        with _native_notes_dropped(_HARMLESS_WRITER_NOTES):
            return cv2.VideoWriter(os.fspath(temporary), fourcc, self._fps, self._size)

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        with self._temporaries:  # the temporary is removed if this fails
            if self._writer is not None:
                self._writer.release()
            if exc_type is not None:
                self._temporary.unlink(missing_ok=True)
            elif self._writer is not None:
                os.replace(self._temporary, self.path)


@contextlib.contextmanager
def _native_notes_dropped(harmless: tuple[bytes, ...]) -> Iterator[None]:
    """Leave out of stderr the lines native code prints there that contain one of `harmless`; every other
    line written meanwhile, by any thread, is passed on."""
    with _stderr_lock, tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(True) if not any(n in line for n in harmless)]
            if kept:
                os.write(2, b"".join(kept))


def video_outputs(
    task: Task,
    out_dir: str | os.PathLike,
    stem: str,
    *,
    video_format: str = "webm",
    write_video: bool = True,
    write_log: bool = True,
    options: Mapping[str, Any] | None = None,
) -> list[Path]:
    """The files process_video writes: out_dir/{stem}_{task}.mp4 (or .webm), a video of each picture the
    task also shows as one (pose: {stem}_controlnet.webm), the task's frame log and the other formats the
    `options` (by name; None: the defaults) ask for beside it."""
    if video_format not in VIDEO_FORMATS:
        raise ValueError(f"video format {video_format!r} is not one of {', '.join(VIDEO_FORMATS)}")
    out_dir = Path(out_dir)
    paths = []
    if write_video:
        paths.append(out_dir / f"{stem}_{task.name}.{video_format}")
        paths += [out_dir / f"{stem}{p.suffix}.{video_format}" for p in task.pictures if p.in_videos]
    if task.frame_log is not None and write_log:
        suffixes = task.frame_log.format_suffixes(task.own_options(options or {}))
        paths += [out_dir / f"{stem}{suffix}" for suffix in (task.frame_log.suffix, *suffixes)]
        if (options or {}).get("motion") and any(o.name == "motion" for o in task.video_options):
            paths += [out_dir / f"{stem}{suffix}" for suffix in motion_suffixes()]
    return paths


def process_video(
    runtime: Runtime,
    job: VideoJob,
    progress: Progress | None = None,
    hold: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> VideoResult:
    """Run a video job: the task on the video's frames, writing the videos and the task's frame log.

    `progress(fraction, text)` follows each batch. `hold()`, when given, is held around the model's
    loading and around each batch's model work, and let go between them (the app lends its device to
    other requests there). A request that runs out of device time (DeviceTimeError) after some frames
    keeps them: the video and files hold those frames, and a note says why the rest were left out.
    """
    hold = hold or contextlib.nullcontext
    task = get_task(job.task)
    options, video_options = task.coerce_video_options(job.options, runtime.device)
    batch_size = job.batch_size or runtime.batch_size
    stem = job.output_stem
    targets = video_outputs(task, job.out_dir, stem, video_format=job.video_format)
    shown = [picture.title for picture in task.pictures if picture.in_videos]
    titles = [task.pictures[0].title, *shown]  # the task's video shows its first picture
    threshold = options.get("threshold", 0.0)
    capture_motion = None
    if wanted(video_options) and job.write_log:
        capture_motion = VideoMotion(runtime, job.size, 1.0, threshold)
    # Load the models before the clock starts, and fail before decoding.
    with hold():
        runtime.prepare(job.model or task.repo_id(job.size), progress)
        if capture_motion is not None:
            capture_motion.prepare(progress)
    log = task.frame_log(task.own_options(options)) if task.frame_log is not None and job.write_log else None
    follower = None
    if task.frame_follower is not None:  # across a device boundary every model call is costly
        batched = runtime.device_boundary is not None
        follower = task.frame_follower({**options, **video_options}, batched)
    if follower is not None and follower.sequential:
        batch_size = 1  # each frame's run needs the frame before
    capture = _open(job.path)
    try:
        info = _info(capture)
        if job.limits is not None:
            job.limits.check_frame(info.width, info.height)
        reader = FrameReader(
            capture,
            stride=job.stride,
            max_frames=job.max_frames,
            source_limit=source_frame_limit(info, job.max_seconds),
            queue_size=2 * batch_size,
            limits=job.limits,
        )
        fps = info.fps / job.stride
        if capture_motion is not None:
            capture_motion.fps = fps
        sinks = [VideoFileWriter(path, fps) for path in targets[: 1 + len(shown)]] if job.write_video else []
        total = planned_frames(
            info, stride=job.stride, max_frames=job.max_frames, max_seconds=job.max_seconds
        )
        start = time.perf_counter()
        with reader, contextlib.ExitStack() as stack:
            for sink in sinks:
                stack.enter_context(sink)
            frames, persons, stopped = 0, None, None
            if progress is not None:
                progress(0.0, f"0 of {total or '?'} frames: decoding")
            for batch in _batches(reader, batch_size):
                done = f"{frames} of {total or '?'} frames: "
                step = within(progress, *_span(frames, len(batch), total), done)
                images = [rgb for _, rgb in batch]
                given = None if follower is None else [follower.given() for _ in batch]
                try:
                    check_cancelled()
                    with hold():
                        results = runtime.run_batch(
                            task.name,
                            images,
                            size=job.size,
                            model=job.model,
                            progress=step,
                            given=given,
                            pictures=False,
                            **options,
                        )
                        pointmaps = [None] * len(batch)
                        if capture_motion is not None:
                            pointmaps = capture_motion.pointmaps(images)
                except DeviceTimeError as error:
                    if frames == 0:
                        raise
                    stopped = error
                    break
                for (index, rgb), result, pointmap in zip(batch, results, pointmaps, strict=True):
                    seen = result
                    if follower is not None:
                        result = follower.follow(rgb, result, 1.0 / fps)
                    if capture_motion is not None:  # the keypoints as seen (smoothed later, without lag)
                        capture_motion.add(rgb, seen, result, pointmap)
                    if sinks:  # drawn once, after the follower: only the pictures the videos show
                        pictures = dict(draw_result(result, titles).pictures)
                        for sink, title in zip(sinks, titles, strict=False):
                            sink.write(pictures[title])
                    if log is not None:
                        log.add(f"{index:06d}", result)
                    if result.persons is not None:
                        persons = (persons or 0) + result.persons
                frames += len(batch)
                if progress is not None:
                    progress(_span(frames, 0, total)[0], f"{frames} of {total or '?'} frames")
            if frames == 0:
                raise VideoError(f"'{bare_name(job.path)}': no frame of this video could be decoded.")
        seconds = time.perf_counter() - start
    finally:
        capture.release()
    cut_at = frames if reader.cut_short and stopped is None else None
    notes = _notes(info, job.max_seconds, cut_at) + _stop_note(stopped, frames)
    motion_paths, view_path = [], None
    if capture_motion is not None:  # before the log: it sets the persons' 3-D keypoints the log writes
        motion_paths = capture_motion.write(job.out_dir, stem)
        view_path = capture_motion.write_view(job.out_dir, stem) if job.write_view else None
        notes += capture_motion.notes
    return VideoResult(
        motion_paths=motion_paths,
        view_path=view_path,
        video_path=sinks[0].path if sinks else None,
        log_path=log.write(Path(job.out_dir), stem) if log is not None else None,
        picture_paths=[sink.path for sink in sinks[1:]],
        format_paths=log.write_formats(Path(job.out_dir), stem) if log is not None else [],
        frames=frames,
        fps=fps,
        seconds=seconds,
        persons=persons,
        notes=notes + (follower.notes if follower is not None else []),
    )


def _stop_note(stopped: DeviceTimeError | None, frames: int) -> list[str]:
    """Why the run ended before the video did, when it ran out of device time."""
    if stopped is None:
        return []
    return [f"{stopped} The first {frames} frames were processed: the video and its files hold them."]


def _span(done: int, batch: int, total: int | None) -> tuple[float, float]:
    """Where, as fractions of the video, a batch of `batch` frames after the first `done` starts and ends."""
    if not total:
        return 0.0, 0.0
    return min(done / total, 1.0), min((done + batch) / total, 1.0)


def _batches(reader: FrameReader, size: int) -> Iterator[list[tuple[int, np.ndarray]]]:
    batch: list[tuple[int, np.ndarray]] = []
    for item in reader:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _notes(info: VideoInfo, max_seconds: float | None, cut_at: int | None) -> list[str]:
    """What was left out: `cut_at` is the frames run when a limit (not the video's end) stopped them."""
    duration = info.duration
    if max_seconds is not None and duration is not None and duration > max_seconds:
        return [f"Only the first {max_seconds:g} s of this {duration:.1f} s video were processed."]
    if cut_at is not None:
        return [f"Only the first {cut_at} frames of this video were processed (the limit per video)."]
    return []
