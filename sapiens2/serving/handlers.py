"""The functions that answer the app's events: one per task tab, All tasks, Video and the live webcam.

Each takes what its tab sends, runs the work through the runtime as a cancellable job holding the device
for the model work only, then writes the pictures and files off the device.
"""

from __future__ import annotations

import inspect
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from sapiens2.batch.video import VideoJob, process_video
from sapiens2.errors import LimitError, OutOfSpaceError
from sapiens2.outputs.bundle import write_zip
from sapiens2.outputs.exports import write_picture
from sapiens2.outputs.pictures import fit_for_display
from sapiens2.outputs.results import FrameFollower, TaskResult
from sapiens2.pipelines.options import Option
from sapiens2.progress import Progress, within
from sapiens2.runtime import Runtime
from sapiens2.serving.components import FIRST_TASK
from sapiens2.serving.device_slot import DeviceSlot
from sapiens2.serving.device_time import request_seconds
from sapiens2.serving.disk_room import check_room
from sapiens2.serving.frames import frame_image
from sapiens2.serving.live_streams import StreamWatch
from sapiens2.serving.motion_view import camera_orbit
from sapiens2.serving.requests import (
    StagedProgress,
    check_output,
    holding_device,
    option_value,
    reporter,
    stage,
    upload,
    user_errors,
)
from sapiens2.serving.scratch import ScratchSpace
from sapiens2.serving.streaming import streamed
from sapiens2.serving.video_budget import FrameSpeeds, HoldTimer, budget_note
from sapiens2.tasks import (
    ALL_TASKS,
    TASKS,
    Task,
    draw_result,
    export_result,
    get_task,
    video_options,
    view_result,
)
from sapiens2.vision.images import load_image
from sapiens2.vision.limits import Limits

log = logging.getLogger("sapiens2.app")

VIDEO_BATCH = 4  # frames per model call for /video: bounds the frames and results held at once
SHOWN_MAX_SIDE = 4096  # pictures on the page at most this long (a 48 MP PNG takes seconds to encode)
LIVE_WINDOW = 10  # frames the live frame rate is measured over
LIVE_FRAME_SECONDS = 0.1  # the page's time between webcam frames (app.py: stream_every)
LIVE_DETECT_EVERY = 5  # live frames per detector run, when the task follows its persons
# Marks the parameter Gradio fills with each request's own progress tracker.
PROGRESS = gr.Progress()


def task_handler(
    task: Task, runtime: Runtime, scratch: ScratchSpace, slot: DeviceSlot, local: dict[str, str]
) -> Callable:
    """The endpoint of one task: (image, size, *options) -> (*pictures, summary, timing, files[, cloud]);
    `size` may name one of the `local` fine-tuned models.

    Its signature names every parameter after the task's options, each with its default, so API clients
    can call `predict(handle_file(photo), api_name="/<task>")` and set any option by name.
    """
    task_options = runtime.options(task.name)
    names = [option.name for option in task_options]

    def handler(image: Any, size: str | None, *values: Any) -> list:
        *values, progress = values
        path, stem = upload(image)
        options = {name: option_value(value) for name, value in zip(names, values, strict=True)}
        report = StagedProgress(progress) if progress is not None else None
        with user_errors(), scratch.request_folder() as folder:
            model = local.get(size) if isinstance(size, str) else None
            name, size = (size, None) if model else (None, size)
            photo = load_image(path)  # decoded before the device is taken, so a slow file holds no one up
            with holding_device(slot, report):
                result = runtime.run(
                    task.name, photo, size=size, model=model, model_name=name, progress=report, **options
                )
            stage(report, "writing files")
            files = export_result(result, folder, stem)
            view = view_result(result, folder, stem) if task.viewer_title else None
            outputs = picture_files(folder, stem, task, result)
            check_output(scratch, folder)
        outputs += [summary(result), result.timing_line(), [str(path) for path in files]]
        if task.viewer_title:
            outputs.append(None if view is None else str(view))
        return outputs

    handler.__signature__ = _endpoint_signature("image", {"size": task.default_size}, task_options)
    handler.__name__ = task.name
    return handler


def overview_handler(
    runtime: Runtime, scratch: ScratchSpace, slot: DeviceSlot, default_size: str
) -> Callable:
    """The endpoint /all: (image, size) -> (the first picture of each task, summary, timing, files).

    It streams: each tile says it is waiting, then its own task's stage, then shows its picture as soon as
    its task is done; the last yield is the result. The device is held task by task."""

    def run_all(image: Any, size: str = default_size, progress: gr.Progress = PROGRESS) -> Iterator[list]:
        path, stem = upload(image)
        page = reporter(progress)
        count = len(ALL_TASKS)
        with user_errors(), scratch.request_folder() as folder:
            photo = load_image(path)  # decoded before the device is taken
            yield [*(tile_status(WAITING_TILE) for _ in ALL_TASKS), "", "", None]
            results, shown = [], []
            for index, task in enumerate(TASKS[name] for name in ALL_TASKS):

                def work(report: Progress, task: Task = task) -> tuple[TaskResult, str]:
                    with holding_device(slot, report):
                        result = runtime.run_after(task.name, photo, results, size=size, progress=report)
                    return result, picture_files(folder / task.name, stem, task, result)[0]

                def tile(update: Any, index: int = index) -> list:
                    """The event's outputs with only this task's tile changed."""
                    return [*[gr.skip()] * index, update, *[gr.skip()] * (count + 2 - index)]

                step = within(page, index / count, (index + 1) / count, f"{task.title}: ")
                result, picture = yield from streamed(
                    work, lambda fraction, text: tile(tile_status(f"{text} · {fraction:.0%}")), step
                )
                results.append(result)
                shown.append(picture)
                yield tile(gr.Image(picture, label=task.title, show_label=False))
            stage(page, "writing files")
            files_out = [p for r in results for p in export_result(r, folder / r.task, stem)]
            check_output(scratch, folder)
            files_out = [*bundle(scratch, folder, f"{stem}_all_tasks.zip", files_out), *files_out]
        lines = [f"{TASKS[r.task].title}: {summary(r) or 'done.'}" for r in results]
        timings = [f"{TASKS[r.task].title}: {r.timing_line()}" for r in results]
        yield [*shown, "\n\n".join(lines), "\n".join(timings), [str(p) for p in files_out]]

    return run_all


WAITING_TILE = "waiting its turn"


def bundle(scratch: ScratchSpace, folder: Path, name: str, files: Sequence[Path]) -> list[Path]:
    """[the zip of `files`, each in its task's folder], or [] when the zip, counted at their size, would
    take the request past its output limit or the disk's free room (the files stay offered one by one)."""
    size = scratch.folder_bytes(folder)
    try:
        Limits.of().check_output(2 * size)
        check_room(2 * size)
    except (LimitError, OutOfSpaceError):
        log.info("All tasks: %d bytes of files, too many to zip as well", size)
        return []
    return [write_zip(folder / name, files, folder)]


def tile_status(text: str) -> gr.Image:
    """An All tasks tile without its picture yet, its label saying what its task is doing."""
    return gr.Image(None, label=text[:1].upper() + text[1:], show_label=True)


def video_handler(
    runtime: Runtime, scratch: ScratchSpace, slot: DeviceSlot, speeds: FrameSpeeds | None = None
) -> Callable:
    """The endpoint /video: (video, task, size, *video options) -> (the processed clip, summary, files, and
    the motion's 3-D view or None, which the page keeps in a state that the API does not show); a task
    without the size runs its default one, and the summary names the model that ran. The device seconds
    per frame of each clip are recorded in `speeds` (the Video tab's note reads them).

    The video options (pose: track, smoothing, min_cutoff, beta, detect_every) are named parameters with
    their defaults for the runtime's device; a task takes those of its own and leaves the others.
    """
    offered = [option.on_device(runtime.device) for option, _ in video_options().values()]
    names = [option.name for option in offered]

    def run_video(video: Any, task: str, size: str, *values: Any):
        *values, progress = values
        path, _ = upload(video)
        if not path:
            raise gr.Error("Please upload a video clip first.", print_exception=False)
        with user_errors(), scratch.request_folder() as folder:
            entry = get_task(task)
            own = {option.name for option in entry.video_options}
            options = {name: value for name, value in zip(names, values, strict=True) if name in own}
            limits = Limits.of()
            job = VideoJob(
                entry.name,
                path,
                folder,
                size=entry.size_or_default(size),
                options=options,
                # Frames are counted, not seconds (a container may claim any frame rate), and their size is
                # limited; a few frames per model call bound what is held at once.
                max_seconds=None,
                max_frames=limits.video_frames,
                batch_size=VIDEO_BATCH,
                # WebM (VP8): browsers play it as written, and OpenCV here cannot write H.264.
                video_format="webm",
                limits=limits,
                write_view=True,  # with motion capture: the skeletons over the first frame, for the 3-D view
            )
            report = reporter(progress)
            repo_id = entry.repo_id(job.size)
            with holding_device(slot, report):  # loaded first, so that the frames' speed is timed alone
                runtime.prepare(repo_id, report)
            # The device is held batch by batch: other requests run between a clip's batches.
            timer = HoldTimer(lambda: holding_device(slot, report))
            result = process_video(runtime, job, report, hold=timer.hold)
            if speeds is not None:
                speeds.record(repo_id, timer.seconds, result.frames)
            view = None if result.view_path is None else set_aside(scratch, result.view_path)
            check_output(scratch, folder)
        line = f"{result.frames} frames at {speed_text(result.frames_per_second)}, with {repo_id}."
        summary_text = "\n".join([line, *(f"- {note}" for note in result.notes)])
        return str(result.video_path), summary_text, [str(p) for p in downloadable(result.files)], view

    run_video.__signature__ = _endpoint_signature(
        "video", {"task": FIRST_TASK, "size": TASKS[FIRST_TASK].default_size}, offered
    )
    return run_video


def set_aside(scratch: ScratchSpace, path: Path) -> str:
    """Move a file the page shows in a later event (the motion's 3-D view) into a scratch folder of its own:
    the request's folder goes as soon as Gradio has copied the answer, and the page's state, which holds
    this file's path, is not copied."""
    kept = scratch.new_folder() / path.name
    path.replace(kept)
    return str(kept)


def motion_view_handler(scratch: ScratchSpace) -> Callable:
    """The Video tab's event after a clip: its motion's 3-D view (set aside by /video) for the viewer, which
    starts at the filming camera, and whose folder goes once Gradio has copied it; None when the clip has
    none."""

    def show(path: str | None) -> gr.Model3D | None:
        if path is None:
            return None
        folder = Path(path).parent
        with user_errors():
            try:
                check_output(scratch, folder)
            except BaseException:
                scratch.discard(folder)
                raise
        return gr.Model3D(value=path, camera_position=camera_orbit(path) or (None, None, None))

    return show


def video_budget_note(runtime: Runtime, speeds: FrameSpeeds, task: str, size: str | None) -> str:
    """The Video tab's note on a CPU: how many of a clip's frames fit a request's device time with the
    chosen model at the speed measured here, and the command line for longer clips; empty elsewhere."""
    if runtime.device.type != "cpu":
        return ""
    entry = get_task(task)
    size = entry.size_or_default(size)
    command = f"python -m sapiens2 {entry.name} clip.mp4 --size {size} --out results/"
    most = Limits.of(runtime.setup).video_frames
    return budget_note(entry.title, entry.repo_id(size), speeds, request_seconds(), most, command)


def downloadable(paths: Sequence[Path]) -> list[Path]:
    """The files to offer for download: a folder (OpenPose's one file per frame) as one zip beside it."""
    return [Path(shutil.make_archive(str(path), "zip", path)) if path.is_dir() else path for path in paths]


def _endpoint_signature(first: str, settings: dict[str, Any], options: Sequence[Option]) -> inspect.Signature:
    """An endpoint's parameters as API clients see them: the required input, then `settings` and every
    option by name with its default, then the page's progress tracker."""
    parameter, kind = inspect.Parameter, inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature(
        [
            parameter(first, kind),
            *(parameter(name, kind, default=value) for name, value in settings.items()),
            *(parameter(option.name, kind, default=option.default) for option in options),
            parameter("progress", kind, default=PROGRESS),
        ]
    )


@dataclass
class LiveStream:
    """What one webcam stream keeps between its frames: when recent frames were shown (for the frame rate)
    and, for a task that follows persons from frame to frame (pose), its follower: ids, smoothing and the
    boxes that save the detector on most frames."""

    times: list[float] = field(default_factory=list)
    task: str | None = None
    follower: FrameFollower | None = None


def live_handler(runtime: Runtime, slot: DeviceSlot, streams: StreamWatch) -> Callable:
    """The live webcam's frame event: (Gradio's raw frame payload, task, the stream's LiveStream) ->
    (picture, rate line, LiveStream)."""

    def on_frame(payload: Any, task: str, state: Any) -> tuple[Any, str, LiveStream]:
        state = state if isinstance(state, LiveStream) else LiveStream()
        with streams.frame(), user_errors():
            frame = frame_image(payload)  # decoded here, off the device, from bytes checked first
            if frame is None:
                return gr.skip(), gr.skip(), state
            entry = get_task(task)
            if state.task != entry.name:  # a new stream, or another task chosen: its persons start afresh
                state = LiveStream(task=entry.name, follower=_live_follower(runtime, entry))
            with slot.frame() as granted:
                if not granted:  # the device is busy: this frame is dropped, the next one may run
                    return gr.skip(), gr.skip(), state
                given = state.follower.given() if state.follower is not None else None
                result = runtime.run(
                    entry.name, frame, size=next(iter(entry.repos)), given=given, pictures=False
                )
            now = time.perf_counter()
            if state.follower is not None:  # frames are dropped while the device is busy: the real gap
                gap = now - state.times[-1] if state.times else LIVE_FRAME_SECONDS
                result = state.follower.follow(frame.rgb, result, gap)
            draw_result(result, get_task(entry.name).picture_titles[:1])  # the one picture the page shows
        state.times = (state.times + [now])[-LIVE_WINDOW:]
        line = f"**{live_rate(state.times)}** · {entry.title} · {result.timing_line()}"
        return result.pictures[0][1], line, state

    return on_frame


def live_rate(times: Sequence[float]) -> str:
    """The live frame rate over the shown frames' times; the first frame has none yet (not "0.0")."""
    if len(times) < 2 or times[-1] <= times[0]:
        return "first frame, measuring the frame rate"
    return speed_text((len(times) - 1) / (times[-1] - times[0]))


def speed_text(frames_per_second: float) -> str:
    """A frame rate as people read it: "2.0 frames per second", or below one, the seconds each frame took
    too ("84.4 s per frame (0.012 frames per second)") rather than "0.0 frames per second"."""
    if frames_per_second >= 0.95 or frames_per_second <= 0:
        return f"{frames_per_second:.1f} frames per second"
    return f"{1 / frames_per_second:.1f} s per frame ({frames_per_second:.2g} frames per second)"


def _live_follower(runtime: Runtime, entry: Task) -> FrameFollower | None:
    """The task's follower for a stream: one frame at a time, so the detector runs every LIVE_DETECT_EVERY
    frames whatever the device (between them the boxes come from the frame before's keypoints)."""
    if entry.frame_follower is None:
        return None
    options, video_options = entry.coerce_video_options({"detect_every": LIVE_DETECT_EVERY}, runtime.device)
    return entry.frame_follower({**options, **video_options}, runtime.device_boundary is not None)


def picture_files(folder: Path, stem: str, task: Task, result: TaskResult) -> list[str]:
    """The result's pictures as PNG files named after the photo and the picture (photo_pose.png, ...),
    shrunk to SHOWN_MAX_SIDE for the page; the downloads keep the photo's full size."""
    pictures = dict(result.pictures)
    shown = folder / "shown"
    return [
        str(
            write_picture(
                shown, stem, picture.suffix, fit_for_display(pictures[picture.title], SHOWN_MAX_SIDE)
            )[0]
        )
        for picture in task.pictures
    ]


def summary(result: TaskResult) -> str:
    return "\n".join([result.summary, *(f"- {note}" for note in result.notes)]).strip()


def note_handler(runtime: Runtime, task: str, local: dict[str, str]) -> Callable[[str], str]:
    """The model-size note's event: what the chosen size will download, or that it is a local model."""
    return lambda size: "A local fine-tuned model." if size in local else size_note(runtime, task, size)


def size_note(runtime: Runtime, task: str, size: str | None) -> str:
    """What the chosen size will download, and, without the Hub, what to fetch for the sizes not listed."""
    lines = [download_note(runtime, task, size), runtime.missing_sizes_note(task)]
    return "\n\n".join(line for line in lines if line)


def choices_handler(runtime: Runtime, option: Option, local: dict[str, str]) -> Callable[[str], Any]:
    """The model-size event of an option whose names depend on the model: a local fine-tuned model's own
    names (read from its config.json alone), else the option's own."""

    def refresh(size: str) -> Any:
        choices = option.choices
        if size in local:
            try:
                choices = option.model_choices(runtime.config(local[size]))
            except Exception:  # the list is a courtesy; the run itself reports any real problem
                log.debug("no choices of %s for %s", option.name, size, exc_info=True)
        return gr.update(choices=list(choices))

    return refresh


def download_note(runtime: Runtime, task: str, size: str | None) -> str:
    try:
        return runtime.download_note(task, size) or ""
    except Exception:  # the note is a courtesy; the run itself reports any real problem
        log.debug("no download note for %s %s", task, size, exc_info=True)
        return ""


def device_note(runtime: Runtime) -> str:
    """The device and precision the models run in, and why that precision."""
    line = f"Running on **{runtime.device_label}** in **{runtime.dtype_label}**: {runtime.dtype_reason}."
    if runtime.device.type == "cpu":
        if runtime.dtype_label == "bf16":
            line += " Outputs differ slightly from fp32 (start with `--dtype fp32` for full precision)."
        line += " On a CPU a 0.4b model takes seconds to tens of seconds per photo, larger ones minutes."
    if runtime.compiled:
        line += " Models are compiled (`--compile`): the first run of each input size waits for compilation."
    return line
