"""Sapiens2 Studio: Meta's Sapiens2 human-centric vision models in a Gradio app.

Layout and wiring only: every tab is built from the task registry (`sapiens2.tasks`) and every request is
answered by `sapiens2.runtime.Runtime`, which holds the device, the model cache and the person detector.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import inspect
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.utils import get_upload_folder, is_in_or_equal
from starlette.middleware import Middleware

from sapiens2.errors import LimitError
from sapiens2.export import write_picture
from sapiens2.images import sanitize_filename
from sapiens2.jobs import Cancelled, DeviceSlot, Job, current_job, run_until_stopped
from sapiens2.limits import Limits
from sapiens2.local_models import Choices, local_choices
from sapiens2.messages import describe_error, is_expected
from sapiens2.progress import Progress
from sapiens2.results import TaskResult
from sapiens2.runtime import Runtime
from sapiens2.runtime_arguments import add_runtime_arguments, runtime_from_arguments
from sapiens2.scratch import ScratchSpace
from sapiens2.shutdown import exit_cleanly_on_signals
from sapiens2.tasks import ALL_TASKS, TASKS, Task, all_sizes, get_task
from sapiens2.uploads import UploadQuota
from sapiens2.video import VideoJob, VideoResult, process_video
from sapiens2.visualize import fit_for_display

try:  # On a Hugging Face ZeroGPU Space, this lends the function a GPU for the length of each call.
    import spaces

    gpu = spaces.GPU(duration=120)
except ImportError:

    def gpu(function: Callable) -> Callable:
        return function


log = logging.getLogger("sapiens2.app")

ASSETS = Path(__file__).resolve().parent / "assets"
EXAMPLES = [[str(ASSETS / "grace_hopper.jpg")], [str(ASSETS / "astronaut.png")]]
# Every model event shares one concurrency group of two: one request's model work holds the device
# (sapiens2.jobs.DeviceSlot, so the device never runs two forwards at once) while the one before writes its
# pictures and files. Requests beyond the queue's size get a "queue is full" answer instead of waiting.
MODEL_EVENTS = "models"
MODEL_WORKERS = 2
# Webcam streams have their own group: a stream holds its place there for its whole time, but takes the
# device only one frame at a time, between requests (sapiens2.jobs.DeviceSlot).
LIVE_EVENTS = "live"
LIVE_STREAMS = 4
VIDEO_BATCH = 4  # frames per model call for /video: bounds the frames and results held at once
MAX_QUEUE = 24
MAX_UPLOAD = "40mb"
# Gradio deletes its copies of uploads and answers older than CACHE_LIFE seconds, every CACHE_SWEEP seconds;
# what one client uploads is counted over the life of a file (sapiens2.uploads).
CACHE_SWEEP, CACHE_LIFE = 600, 1800
NOT_UPLOADED = "Only uploaded files are read, never a path on the server. Please upload the file itself."
CANCELLED = "The request was cancelled."
WAITING = "Waiting for the model: the work before this one is finishing"
SHOWN_MAX_SIDE = 4096  # pictures on the page at most this long (a 48 MP PNG takes seconds to encode)
LIVE_WINDOW = 10  # frames the live frame rate is measured over
FIRST_TASK = next(iter(TASKS))
# Marks the parameter Gradio fills with each request's own progress tracker.
PROGRESS = gr.Progress()

TITLE = "Sapiens2 Studio"
INTRO = (
    "Meta's **Sapiens2** models for images of people: 308 keypoints per person, 29 body parts, surface "
    "normals, depth and matting, from the official checkpoints. Drop in a photo, paste one, or take a "
    "webcam snapshot."
)
LICENCE = (
    "The Sapiens2 weights are under the [Sapiens2 licence](https://github.com/facebookresearch/sapiens2/"
    "blob/main/LICENSE.md): they may not be used for surveillance, for biometric processing or "
    "identification, or to track people without their consent."
)
CSS = """
.studio-header h1 { margin-bottom: 0.2em; }
.studio-note { border-left: 4px solid var(--color-accent); padding: 0.1em 0.8em;
               background: var(--background-fill-secondary); border-radius: 4px; }
.studio-timing { color: var(--body-text-color-subdued); font-size: 0.9em; }
"""
THEME = gr.themes.Soft(primary_hue="indigo", secondary_hue="sky")


def build_app(
    runtime: Runtime, scratch: ScratchSpace | None = None, local: Choices | None = None
) -> gr.Blocks:
    """The whole UI: one tab per task, an "All tasks" tab and a live webcam tab; `local` adds fine-tuned
    checkpoints to their tasks' model lists (see sapiens2.local_models)."""
    scratch = scratch or ScratchSpace()
    local = local or {}
    slot = DeviceSlot()
    with gr.Blocks(title=TITLE, delete_cache=(CACHE_SWEEP, CACHE_LIFE)) as demo:
        with gr.Column(elem_classes="studio-header"):
            gr.Markdown(f"# {TITLE}\n{INTRO}")
            gr.Markdown(_device_note(runtime), elem_classes="studio-note")
        with gr.Tabs():
            for task in TASKS.values():
                with gr.Tab(task.title, id=task.name):
                    _task_tab(task, runtime, scratch, slot, local.get(task.name, {}))
            with gr.Tab("All tasks", id="all"):
                _overview_tab(runtime, scratch, slot)
            with gr.Tab("Video", id="video"):
                _video_tab(runtime, scratch, slot)
            with gr.Tab("Live webcam", id="live"):
                _live_tab(runtime, slot)
        gr.Markdown(LICENCE, elem_classes="studio-note")
    demo.device_slot = slot
    return demo


def launch(
    demo: gr.Blocks,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    share: bool = False,
    prevent_thread_lock: bool = False,
):
    """Start the server with the app's queue limits, theme and upload cap."""
    demo.queue(max_size=MAX_QUEUE, default_concurrency_limit=1)
    quota = Middleware(UploadQuota, window=CACHE_SWEEP + CACHE_LIFE)
    return demo.launch(
        server_name=host,
        server_port=port,
        share=share,
        prevent_thread_lock=prevent_thread_lock,
        max_file_size=MAX_UPLOAD,
        app_kwargs={"middleware": [quota]},
        theme=THEME,
        css=CSS,
    )


# ---- tabs --------------------------------------------------------------------------------------------------


def _task_tab(
    task: Task, runtime: Runtime, scratch: ScratchSpace, slot: DeviceSlot, local: dict[str, str]
) -> None:
    """Input, model size (or a local fine-tuned model), the task's options and its outputs, wired to the
    endpoint /<task name>."""
    gr.Markdown(f"### {task.title}\n{task.description}")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2):
            image = _photo_input(f"{task.name}-photo")
            size = gr.Dropdown([*task.repos, *local], value=task.default_size, label="Model size")
            note = gr.Markdown(_download_note(runtime, task.name, task.default_size))
            controls = {}
            options = runtime.options(task.name)
            if options:
                with gr.Accordion("Options", open=True):
                    controls = {option.name: _control(option) for option in options}
            button = gr.Button(f"Run {task.title.lower()}", variant="primary", elem_id=f"{task.name}-run")
            gr.Examples(EXAMPLES, inputs=[image], label="Example photos", cache_examples=False)
        with gr.Column(scale=3):
            pictures = _picture_outputs(task.picture_titles, f"{task.name}-picture")
            summary, timing = _text_outputs()
            cloud = gr.Model3D(label=task.viewer_title, height=420) if task.viewer_title else None
            files = _downloads(f"{task.name}-downloads")
    outputs = [*pictures, summary, timing, files, *([cloud] if cloud else [])]
    event = button.click(
        _cancellable(_task_handler(task, runtime, scratch, slot, local)),
        inputs=[image, size, *controls.values()],
        outputs=outputs,
        api_name=task.name,
        api_description=task.description,
        preprocess=False,
        concurrency_id=MODEL_EVENTS,
        concurrency_limit=MODEL_WORKERS,
    )
    refresh = _note_handler(runtime, task.name, local)
    size.change(refresh, size, note, queue=False, api_visibility="private")
    event.then(refresh, size, note, queue=False, api_visibility="private")


def _overview_tab(runtime: Runtime, scratch: ScratchSpace, slot: DeviceSlot) -> None:
    """One photo through every picture task, shown side by side; endpoint /all."""
    *first, last = [TASKS[name].title.lower() for name in ALL_TASKS]
    titles = f"{', '.join(first)} and {last}"
    gr.Markdown(f"### All tasks\nOne photo through {titles}, reusing the models already loaded.")
    sizes = all_sizes(TASKS[name] for name in ALL_TASKS)
    with gr.Row(equal_height=False):
        with gr.Column(scale=1):
            image = _photo_input("all-photo")
            size = gr.Dropdown(
                sizes,
                value=sizes[0],
                label="Model size",
                info="Tasks without this size use their own default.",
            )
            button = gr.Button("Run all tasks", variant="primary", elem_id="all-run")
            gr.Examples(EXAMPLES, inputs=[image], label="Example photos", cache_examples=False)
        with gr.Column(scale=4):
            tiles = [TASKS[name] for name in ALL_TASKS]
            pictures = []
            for row in (tiles[:3], tiles[3:]):
                with gr.Row(equal_height=True):
                    for task in row:
                        with gr.Column(min_width=280):
                            gr.Markdown(f"#### {task.title}")
                            pictures.append(_shown_picture(task.picture_titles[0], 340, f"all-{task.name}"))
            summary, timing = _text_outputs()
            files = _downloads("all-downloads")

    def run_all(image: Any, size: str = sizes[0], progress: gr.Progress = PROGRESS) -> list:
        path, stem = _upload(image)
        report = _reporter(progress)
        with _user_errors():
            with _device(slot, report):
                results = _overview(runtime, path, size, report)
            _stage(report, "writing files")
            folder = scratch.new_folder()
            files_out = [p for r in results for p in r.export(folder / r.task, stem)]
            shown = [_picture_files(folder / r.task, stem, TASKS[r.task], r)[0] for r in results]
            _check_output(scratch, folder)
        lines = [f"{TASKS[r.task].title}: {_summary(r) or 'done.'}" for r in results]
        timings = [f"{TASKS[r.task].title}: {r.timing_line()}" for r in results]
        return [*shown, "\n\n".join(lines), "\n".join(timings), [str(p) for p in files_out]]

    button.click(
        _cancellable(run_all),
        inputs=[image, size],
        outputs=[*pictures, summary, timing, files],
        api_name="all",
        api_description="Every picture task on one photo, side by side.",
        preprocess=False,
        concurrency_id=MODEL_EVENTS,
        concurrency_limit=MODEL_WORKERS,
    )


def _video_tab(runtime: Runtime, scratch: ScratchSpace, slot: DeviceSlot) -> None:
    """A short clip through a chosen task, frame by frame; endpoint /video."""
    limits = Limits.from_env()
    gr.Markdown(
        f"### Video\nA short clip through one task; the first {limits.video_frames} frames are processed."
    )
    with gr.Row(equal_height=False):
        with gr.Column(scale=2):
            clip = gr.Video(label="Clip", sources=["upload"], elem_id="video-clip")
            gr.Markdown(
                "MP4, MOV, WebM, MKV or AVI. The preview above may not play some MP4 files (those written "
                "with the mp4v codec, OpenCV's default, for one): the clip still runs.",
                elem_classes="studio-timing",
            )
            choice = _task_choice()
            sizes = all_sizes(TASKS.values())
            size = gr.Dropdown(
                sizes, value=sizes[0], label="Model size", info="Tasks without it use their default."
            )
            button = gr.Button("Run on the video", variant="primary", elem_id="video-run")
        with gr.Column(scale=3):
            shown = gr.Video(label="Result", interactive=False, elem_id="video-result")
            summary = gr.Markdown()
            files = _downloads("video-downloads")

    def run_video(video: Any, task: str = FIRST_TASK, size: str = sizes[0], progress: gr.Progress = PROGRESS):
        path, _ = _upload(video)
        if not path:
            raise gr.Error("Please upload a video clip first.", print_exception=False)
        with _user_errors():
            limits = Limits.from_env()
            folder = scratch.new_folder()
            job = VideoJob(
                get_task(task).name,
                path,
                folder,
                size=get_task(task).size_or_default(size),
                # Frames are counted, not seconds (a container may claim any frame rate), and their size is
                # limited; a few frames per model call bound what is held at once.
                max_seconds=None,
                max_frames=limits.video_frames,
                batch_size=VIDEO_BATCH,
                # WebM (VP8): browsers play it as written, and OpenCV here cannot write H.264.
                video_format="webm",
                limits=limits,
            )
            report = _reporter(progress)
            with _device(slot, report):
                result = _process_video(runtime, job, report)
            _check_output(scratch, folder)
        line = f"{result.frames} frames at {result.frames_per_second:.1f} frames per second."
        summary_text = "\n".join([line, *(f"- {note}" for note in result.notes)])
        return str(result.video_path), summary_text, [str(p) for p in result.files]

    button.click(
        _cancellable(run_video),
        inputs=[clip, choice, size],
        outputs=[shown, summary, files],
        api_name="video",
        api_description="A short clip through one task; returns the processed video and its files.",
        preprocess=False,  # the upload reaches the handler untouched: nothing but sapiens2.media opens it
        concurrency_id=MODEL_EVENTS,
        concurrency_limit=MODEL_WORKERS,
    )


def _live_tab(runtime: Runtime, slot: DeviceSlot) -> None:
    """Webcam frames streamed through a chosen task with its smallest model, with the frame rate."""
    gr.Markdown(
        "### Live webcam\nEvery frame goes through the chosen task with its smallest model. " + LICENCE,
        elem_classes="studio-note",
        elem_id="live-note",
    )
    choice = _task_choice()
    with gr.Row():
        camera = gr.Image(sources=["webcam"], streaming=True, type="numpy", label="Webcam")
        shown = gr.Image(label="Result", format="jpeg", interactive=False)
    rate = gr.Markdown(elem_id="live-rate")
    recent = gr.State([])

    def on_frame(frame: Any, task: str, times: list[float]) -> tuple[Any, str, list[float]]:
        if frame is None:
            return gr.skip(), gr.skip(), times
        with slot.frame() as granted:
            if not granted:  # the device is busy: this frame is dropped, the next one may run
                return gr.skip(), gr.skip(), times
            with _user_errors():
                entry = get_task(task)
                result = _predict(runtime, entry.name, frame, next(iter(entry.repos)), {}, None)
        times = (times + [time.perf_counter()])[-LIVE_WINDOW:]
        fps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
        line = f"**{fps:.1f} frames per second** · {entry.title} {result.model_id} · {result.timing_line()}"
        return result.pictures[0][1], line, times

    camera.stream(
        on_frame,
        inputs=[camera, choice, recent],
        outputs=[shown, rate, recent],
        stream_every=0.1,
        time_limit=600,
        concurrency_id=LIVE_EVENTS,
        concurrency_limit=LIVE_STREAMS,
        show_progress="hidden",
        api_visibility="private",
    )


# ---- components --------------------------------------------------------------------------------------------


def _task_choice() -> gr.Radio:
    return gr.Radio([(task.title, task.name) for task in TASKS.values()], value=FIRST_TASK, label="Task")


def _photo_input(elem_id: str) -> gr.Image:
    return gr.Image(
        label="Photo",
        type="filepath",
        sources=["upload", "clipboard", "webcam"],
        image_mode=None,
        height=360,
        elem_id=elem_id,
    )


def _control(option) -> gr.components.Component:
    """The input component of one task option, chosen by its kind."""
    info = option.help or None
    if option.kind == "slider":
        return gr.Slider(
            option.minimum,
            option.maximum,
            value=option.default,
            step=option.step,
            label=option.label,
            info=info,
        )
    if option.kind == "checkbox":
        return gr.Checkbox(value=option.default, label=option.label, info=info)
    if option.kind == "color":
        return gr.ColorPicker(value=option.default, label=option.label, info=info)
    return gr.Image(label=option.label, type="filepath", sources=["upload", "clipboard"], height=160)


def _picture_outputs(titles: Sequence[str], elem_id: str) -> list[gr.Image]:
    """The first picture large (with `elem_id`), the others side by side under it."""
    main = _shown_picture(titles[0], 520, elem_id)
    if len(titles) == 1:
        return [main]
    with gr.Row():
        rest = [_shown_picture(title, 300) for title in titles[1:]]
    return [main, *rest]


def _shown_picture(title: str, height: int, elem_id: str | None = None) -> gr.Image:
    return gr.Image(label=title, type="filepath", height=height, interactive=False, elem_id=elem_id)


def _text_outputs() -> tuple[gr.Markdown, gr.Markdown]:
    """The summary and the timing line: plain text, one line per line."""
    summary = gr.Markdown(line_breaks=True)
    timing = gr.Markdown(line_breaks=True, elem_classes="studio-timing")
    return summary, timing


def _downloads(elem_id: str) -> gr.File:
    """The list of files to download, as tall as it needs to be to show every file."""
    return gr.File(label="Downloads", file_count="multiple", interactive=False, height=None, elem_id=elem_id)


# ---- handlers ----------------------------------------------------------------------------------------------


@gpu
def _predict(
    runtime: Runtime,
    task: str,
    image: Any,
    size: str | None,
    options: dict,
    progress,
    model: str | None = None,
) -> TaskResult:
    return runtime.run(task, image, size=size, model=model, progress=progress, **options)


@gpu
def _overview(runtime: Runtime, image: Any, size: str | None, progress) -> list[TaskResult]:
    return runtime.run_all(image, size=size, progress=progress)


@gpu
def _process_video(runtime: Runtime, job: VideoJob, progress) -> VideoResult:
    return process_video(runtime, job, progress)


def _task_handler(
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
        path, stem = _upload(image)
        options = {name: _option_value(value) for name, value in zip(names, values, strict=True)}
        report = _reporter(progress)
        with _user_errors():
            model = local.get(size) if isinstance(size, str) else None
            size = None if model else size
            with _device(slot, report):
                result = _predict(runtime, task.name, path, size, options, report, model)
            _stage(report, "writing files")
            folder = scratch.new_folder()
            files = result.export(folder, stem)
            view = result.viewer(folder, stem) if task.viewer_title and result.viewer else None
            outputs = _picture_files(folder, stem, task, result)
            _check_output(scratch, folder)
        outputs += [_summary(result), result.timing_line(), [str(path) for path in files]]
        if task.viewer_title:
            outputs.append(None if view is None else str(view))
        return outputs

    parameter = inspect.Parameter
    handler.__signature__ = inspect.Signature(
        [
            parameter("image", parameter.POSITIONAL_OR_KEYWORD),
            parameter("size", parameter.POSITIONAL_OR_KEYWORD, default=task.default_size),
            *(parameter(o.name, parameter.POSITIONAL_OR_KEYWORD, default=o.default) for o in task_options),
            parameter("progress", parameter.POSITIONAL_OR_KEYWORD, default=PROGRESS),
        ]
    )
    handler.__name__ = task.name
    return handler


def _picture_files(folder: Path, stem: str, task: Task, result: TaskResult) -> list[str]:
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


def _note_handler(runtime: Runtime, task: str, local: dict[str, str]) -> Callable[[str], str]:
    return lambda size: "A local fine-tuned model." if size in local else _download_note(runtime, task, size)


def _download_note(runtime: Runtime, task: str, size: str | None) -> str:
    try:
        return runtime.download_note(task, size) or ""
    except Exception:  # the note is a courtesy; the run itself reports any real problem
        log.debug("no download note for %s %s", task, size, exc_info=True)
        return ""


def _device_note(runtime: Runtime) -> str:
    """The device and precision the models run in, and why that precision."""
    line = f"Running on **{runtime.device_label}** in **{runtime.dtype_label}**: {runtime.dtype_reason}."
    if runtime.device.type == "cpu":
        if runtime.dtype_label == "bf16":
            line += " Outputs differ slightly from fp32 (start with `--dtype fp32` for full precision)."
        line += " On a CPU a 0.4b model takes seconds to tens of seconds per photo, larger ones minutes."
    if runtime.compiled:
        line += " Models are compiled (`--compile`): the first run of each input size waits for compilation."
    return line


def _upload(payload: Any) -> tuple[str | None, str]:
    """The uploaded file's path (None when nothing was sent) and a safe stem for the download names.

    Only files in Gradio's upload folder are read: Gradio checks file payloads marked as files, but passes a
    bare {"path": ...} through unchecked, and that path must never open a file of the server.
    """
    if not isinstance(payload, dict):
        return None, "photo"
    path = payload.get("path")
    if path is not None and not _in_upload_folder(str(path)):
        raise gr.Error(NOT_UPLOADED, print_exception=False)
    name = sanitize_filename(payload.get("orig_name") or "photo", default="photo")
    return path, Path(name).stem or "photo"


def _in_upload_folder(path: str) -> bool:
    try:
        return is_in_or_equal(path, get_upload_folder())
    except (ValueError, OSError):  # a NUL byte, a loop of links
        return False


def _option_value(value: Any) -> Any:
    """An option's raw value from the page; an uploaded image becomes its file path."""
    return _upload(value)[0] if isinstance(value, dict) else value


def _summary(result: TaskResult) -> str:
    return "\n".join([result.summary, *(f"- {note}" for note in result.notes)]).strip()


def _reporter(progress: gr.Progress | None) -> Progress | None:
    """The runtime's progress(fraction, text) callback drawn as the page's progress bar."""
    if progress is None:
        return None
    return lambda fraction, text: progress(fraction, desc=text)


def _stage(report: Progress | None, text: str) -> None:
    if report is not None:
        report(None, text)


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turns any failure into a gr.Error with a sentence saying what happened and what to do."""
    try:
        yield
    except (gr.Error, Cancelled):
        raise
    except Exception as error:
        if is_expected(error):
            log.info("request refused: %s", describe_error(error))  # the operator's sentence, with paths
        else:
            log.exception("request failed")
        raise gr.Error(describe_error(error, public=True), print_exception=False) from error


def _check_output(scratch: ScratchSpace, folder: Path) -> None:
    """Refuse (and delete) a request's files when they take more than the output limit."""
    try:
        Limits.from_env().check_output(scratch.folder_bytes(folder))
    except LimitError:
        scratch.discard(folder)
        raise


def _cancellable(handler: Callable) -> Callable:
    """The handler as Gradio runs it: on a thread, as a job that cancelling can stop.

    Cancelling the request (Job.cancel() in gradio_client, the page's stop button) or closing the page
    stops the work at its next check between batches, frames or tasks; Gradio's own slot is given back
    only once the work has stopped, so no cancelled work runs on beside the next request.
    """

    @functools.wraps(handler)
    async def cancellable(*args: Any) -> Any:
        job = Job(_client_connected())
        try:
            return await run_until_stopped(None, job, handler, *args)
        except Cancelled:
            raise gr.Error(CANCELLED, print_exception=False) from None

    return cancellable


@contextmanager
def _device(slot: DeviceSlot, report: Progress | None) -> Iterator[None]:
    """Hold the device for a request's model work, after the requests before it (the page is told while it
    waits); pictures and files are written after, off the device, while the next request runs."""
    with slot.request(current_job(), on_wait=lambda: _stage(report, WAITING)):
        yield


def _client_connected() -> Callable[[], bool] | None:
    """Whether the client of the request running in this context is still connected.

    Gradio marks a running event as no longer alive when its page is closed, but does not stop it: the
    work asks this between batches. Gradio has no public call for it; if its internals change, the work
    simply runs to its end as before.
    """
    from gradio.context import LocalContext

    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    if queue is None or event_id is None:
        return None

    def connected() -> bool:
        try:
            events = [event for job in queue.active_jobs if job for event in job if event._id == event_id]
            return all(event.alive for event in events)
        except Exception:  # Gradio's internals changed: never cancel on a guess
            return True

    return connected


# ---- command line ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=f"{TITLE}: the Sapiens2 models in a web page.")
    add_runtime_arguments(parser)
    parser.add_argument(
        "--host",
        default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for everyone)",
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    parser.add_argument("--share", action="store_true", help="also serve through a public gradio.live link")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="TASK=PATH",
        help="a fine-tuned checkpoint folder (sapiens2 train's OUT/final) as a choice of TASK's model list",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        runtime = runtime_from_arguments(args)
        local = local_choices(args.checkpoint_dir, args.model)
    except Exception as error:
        sys.exit(describe_error(error))
    scratch = ScratchSpace()
    atexit.register(scratch.remove)
    exit_cleanly_on_signals(scratch.remove)
    launch(build_app(runtime, scratch, local), host=args.host, port=args.port, share=args.share)


if __name__ == "__main__":
    main()
