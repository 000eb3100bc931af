"""Sapiens2 Studio: Meta's Sapiens2 human-centric vision models in a Gradio app.

Layout and wiring only: every tab is built from the task registry (`sapiens2.tasks`), its components come
from `sapiens2.serving.components` and its events are answered by `sapiens2.serving.handlers`, which run
the work through `sapiens2.runtime.Runtime` (the device, the model cache and the person detector).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from sapiens2.errors import ConfigError
from sapiens2.runtime import Runtime
from sapiens2.runtime.arguments import add_runtime_arguments, runtime_from_arguments
from sapiens2.runtime.messages import describe_error
from sapiens2.runtime.warm_heap import keep_freed_memory
from sapiens2.serving import components, handlers, zerogpu
from sapiens2.serving.bodies import BodyLimit
from sapiens2.serving.components import FIRST_TASK
from sapiens2.serving.connections import ConnectionGuard, check_guarded, guarded_connections
from sapiens2.serving.device_slot import DeviceSlot
from sapiens2.serving.device_time import DeviceBudget, request_seconds
from sapiens2.serving.freed_memory import release_after_answers
from sapiens2.serving.live_streams import StreamWatch
from sapiens2.serving.private_files import keep_files_private
from sapiens2.serving.queue_share import share_the_queue
from sapiens2.serving.requests import cancellable
from sapiens2.serving.scratch import ScratchSpace, drop_after_copy
from sapiens2.serving.shutdown import exit_cleanly_on_signals
from sapiens2.serving.startup import patient_start
from sapiens2.serving.uploads import UploadQuota
from sapiens2.serving.video_budget import FrameSpeeds, video_header
from sapiens2.settings import Settings, current, install
from sapiens2.tasks import ALL_TASKS, TASKS, Task
from sapiens2.tasks.local_models import Choices, local_choices
from sapiens2.tasks.registry import smallest_first
from sapiens2.vision.decode_workers import decoding_in_workers
from sapiens2.vision.limits import Limits

ASSETS = Path(__file__).resolve().parent / "assets"
EXAMPLES = [[str(ASSETS / "grace_hopper.jpg")], [str(ASSETS / "astronaut.png")]]
# Every model event shares one concurrency group of two: one request's model work holds the device
# (sapiens2.serving.device_slot.DeviceSlot, so the device never runs two forwards at once) while the one
# before writes its pictures and files. Requests beyond the queue's size get "queue is full" at once, and
# a client's beyond its share (sapiens2.serving.queue_share) are refused at once; each request, and each
# client, may hold the device for so long (sapiens2.serving.device_time).
MODEL_EVENTS = "models"
MODEL_WORKERS = 2
# Webcam streams have their own group: a stream holds its place there while its page sends frames
# (sapiens2.serving.live_streams), never waits in the queue, and takes the device only one frame at a time,
# between requests.
LIVE_EVENTS = "live"
# The defaults of SAPIENS2_LIVE_STREAMS, SAPIENS2_MAX_QUEUE and SAPIENS2_MAX_UPLOAD_MB (sapiens2.settings).
LIVE_STREAMS = Settings().live_streams
MAX_QUEUE = Settings().max_queue
MAX_UPLOAD_MB = Settings().max_upload_mb
# Gradio deletes its copies of uploads and answers older than CACHE_LIFE seconds, every CACHE_SWEEP seconds;
# what one client uploads is counted over the life of a file (sapiens2.serving.uploads).
CACHE_SWEEP, CACHE_LIFE = 600, 1800


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
/* Gradio draws a remove button beside each file of a list of several, even one nobody can edit. */
.studio-downloads .label-clear-button { display: none; }
/* Gradio's checkbox draws a 1px border whatever the theme says; the theme's width, below, is used here. */
.gradio-container input[type="checkbox"] { border-width: var(--checkbox-border-width); }
/* A mask or matte is white where it is full: a 100 % mask would be white on the white page. On the page
   it is tinted (white shows as light indigo, rgb(166, 181, 255); black stays black) and outlined; its file
   stays grey. */
/* File names at phone width: the whole name, wrapped, rather than "astronaut… .json". */
.studio-downloads tr.file, .studio-downloads td.filename { height: auto; }
.studio-downloads td.filename, .studio-downloads td.filename .stem {
  white-space: normal; overflow: visible; text-overflow: clip; overflow-wrap: anywhere; }
.studio-downloads td.filename .stem, .studio-downloads td.filename .ext { display: inline; }
/* A colour picker turned off (a background picture replaces the colour) looks off. */
.gradio-container button.dialog-button:disabled { opacity: 0.3; cursor: not-allowed; }
.studio-matte img { filter: brightness(0.6) sepia(1) hue-rotate(195deg) saturate(2.25);
                    outline: 1px solid var(--border-color-primary); }
"""
# The Soft theme's unchecked boxes are a faint outline on a grey panel: a darker, thicker border.
# Browsers cannot play some MP4s the app reads well (mp4v, OpenCV's default codec), and Gradio's preview of
# the clip then shows a red "Video not playable" error. That error of the preview alone is kept from Gradio:
# the clip still runs, as the note under it says.
# On a narrow screen a tab's result lies below its inputs, a screen or more under the Run button: when a
# tab's first result (class studio-result) arrives there, it is scrolled into view.
PAGE_JS = """() => {
  document.addEventListener("error", (event) => {
    if (event.target instanceof HTMLVideoElement && event.target.closest("#video-clip")) {
      event.stopPropagation();
    }
  }, true);
  const narrow = window.matchMedia("(max-width: 768px)");
  const shown = new WeakMap();
  const arrived = (node) => {
    const media = node.matches && node.matches("img, video") ? [node]
      : node.querySelectorAll ? [...node.querySelectorAll("img, video")] : [];
    for (const item of media) {
      const result = item.closest(".studio-result");
      const source = item.currentSrc || item.src;
      if (!result || !source || shown.get(result) === source) continue;
      shown.set(result, source);
      const box = result.getBoundingClientRect();
      if (narrow.matches && (box.top < 0 || box.top > window.innerHeight / 4)) {
        result.scrollIntoView({ block: "start", behavior: "instant" });
      }
    }
  };
  new MutationObserver((records) => {
    for (const record of records) {
      if (record.type === "attributes") arrived(record.target);
      else record.addedNodes.forEach(arrived);
    }
  }).observe(document.body, { subtree: true, childList: true, attributes: true, attributeFilter: ["src"] });
}"""
THEME = gr.themes.Soft(primary_hue="indigo", secondary_hue="sky").set(
    checkbox_border_color="*neutral_400",
    checkbox_border_color_dark="*neutral_500",
    checkbox_border_width="2px",
)


def build_app(
    runtime: Runtime,
    scratch: ScratchSpace | None = None,
    local: Choices | None = None,
    hosting: zerogpu.Hosting | None = None,
    settings: Settings | None = None,
) -> gr.Blocks:
    """The whole UI: one tab per task, an "All tasks" tab and a live webcam tab; `local` adds fine-tuned
    checkpoints to their tasks' model lists (see sapiens2.tasks.local_models); `hosting` says what the host
    allows (`sapiens2.serving.zerogpu.serve`); `settings`: the settings in force when None."""
    settings = settings or current()
    scratch = scratch or ScratchSpace()
    local = local or {}
    hosting = hosting or zerogpu.Hosting()
    slot = DeviceSlot()
    budget = DeviceBudget()
    streams = StreamWatch(LIVE_EVENTS, settings.live_streams)
    # Gradio's usage analytics go to its makers from every server that does not say no: only when asked.
    with gr.Blocks(
        title=TITLE, delete_cache=(CACHE_SWEEP, CACHE_LIFE), analytics_enabled=settings.analytics
    ) as demo:
        with gr.Column(elem_classes="studio-header"):
            gr.Markdown(f"# {TITLE}\n{INTRO}")
            gr.Markdown(handlers.device_note(runtime), elem_classes="studio-note")
        with gr.Tabs(overflow_behavior="wrap"):  # on a phone every tab stays in sight, on two rows
            for task in TASKS.values():
                with gr.Tab(task.title, id=task.name):
                    _task_tab(task, runtime, scratch, slot, budget, local.get(task.name, {}))
            with gr.Tab("All tasks", id="all"):
                _overview_tab(runtime, scratch, slot, budget)
            with gr.Tab("Video", id="video"):
                speeds = _video_tab(runtime, scratch, slot, budget, Limits.of(settings))
            with gr.Tab("Live webcam", id="live"):
                if hosting.live_unavailable:
                    gr.Markdown(f"### Live webcam\n{hosting.live_unavailable}", elem_id="live-note")
                else:
                    _live_tab(runtime, slot, streams, settings.live_streams)
        gr.Markdown(LICENCE, elem_classes="studio-note")
    drop_after_copy(demo, scratch)
    release_after_answers(demo, {MODEL_EVENTS})  # not after each webcam frame: a stream's memory is small
    demo.device_slot = slot
    demo.device_budget = budget
    demo.frame_speeds = speeds
    demo.stream_watch = streams
    return demo


def launch(
    demo: gr.Blocks,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    share: bool = False,
    prevent_thread_lock: bool = False,
    settings: Settings | None = None,
):
    """Start the server with the app's queue limits, theme and upload cap (`settings`: the settings in force
    when None)."""
    settings = settings or current()
    demo.queue(max_size=settings.max_queue, default_concurrency_limit=1)
    share_the_queue(demo, MODEL_EVENTS)
    keep_files_private(demo.GRADIO_CACHE)
    quota = Middleware(UploadQuota, window=CACHE_SWEEP + CACHE_LIFE)
    guards = [Middleware(BodyLimit), quota]
    with guarded_connections(ConnectionGuard.of(settings)) as protocol, patient_start():
        launched = demo.launch(
            server_name=host,
            server_port=port,
            share=share,
            prevent_thread_lock=True,  # the server is checked below, then waited for
            max_file_size=f"{settings.max_upload_mb}mb",
            app_kwargs={"middleware": guards, "lifespan": _while_serving(demo)},
            # Gradio's monitoring pages answer anyone who asks, without a key: only when asked for.
            enable_monitoring=settings.monitoring,
            theme=THEME,
            css=CSS,
            js=PAGE_JS,
        )
    check_guarded(demo.server, protocol)
    if not prevent_thread_lock:
        demo.block_thread()
    return launched


def _while_serving(demo: gr.Blocks) -> Callable:
    """What runs beside the server while it serves: image decoding in workers under a deadline, and the
    watch over webcam streams."""

    @contextlib.asynccontextmanager
    async def serving(web_app: Any) -> AsyncIterator[None]:
        with decoding_in_workers() as demo.decode_workers:
            async with demo.stream_watch.lifespan(demo)(web_app):
                yield

    return serving


# ---- tabs --------------------------------------------------------------------------------------------------

MODEL_EVENT = {"preprocess": False, "concurrency_id": MODEL_EVENTS, "concurrency_limit": MODEL_WORKERS}


def _task_tab(
    task: Task,
    runtime: Runtime,
    scratch: ScratchSpace,
    slot: DeviceSlot,
    budget: DeviceBudget,
    local: dict[str, str],
) -> None:
    """Input, model size (or a local fine-tuned model), the task's options and its outputs, wired to the
    endpoint /<task name>."""
    gr.Markdown(f"### {task.title}\n{task.description}")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2):
            image = components.photo_input(f"{task.name}-photo")
            size = components.size_choice([*runtime.offered_sizes(task.name), *local], task.default_size)
            note = gr.Markdown(handlers.size_note(runtime, task.name, size.value))
            controls = {}
            options = runtime.options(task.name)
            if options:
                with gr.Accordion("Options", open=True):
                    controls = {option.name: components.control(option) for option in options}
            button = gr.Button(f"Run {task.title.lower()}", variant="primary", elem_id=f"{task.name}-run")
            gr.Examples(EXAMPLES, inputs=[image], label="Example photos", cache_examples=False)
        with gr.Column(scale=3):
            pictures = components.picture_outputs(task.picture_titles, f"{task.name}-picture")
            summary, timing = components.text_outputs()
            cloud = (
                gr.Model3D(label=task.viewer_title, height=420, elem_id=f"{task.name}-viewer")
                if task.viewer_title
                else None
            )
            files = components.downloads(f"{task.name}-downloads")
    outputs = [*pictures, summary, timing, files, *([cloud] if cloud else [])]
    event = button.click(
        cancellable(handlers.task_handler(task, runtime, scratch, slot, local), budget),
        inputs=[image, size, *controls.values()],
        outputs=outputs,
        api_name=task.name,
        api_description=task.description,
        show_progress_on=[pictures[0]],  # one bar, over the first picture, not one per output
        **MODEL_EVENT,
    )
    for option in options:
        if option.overrides in controls:  # the option given wins over the other: that one is turned off
            controls[option.name].change(
                lambda value: gr.update(interactive=value in (None, "")),
                controls[option.name],
                controls[option.overrides],
                queue=False,
                api_visibility="private",
            )
    refresh = handlers.note_handler(runtime, task.name, local)
    size.change(refresh, size, note, queue=False, api_visibility="private")
    for option in options:
        if option.model_choices is not None:  # a fine-tuned model lists its own names
            refresh_choices = handlers.choices_handler(runtime, option, local)
            size.change(refresh_choices, size, controls[option.name], queue=False, api_visibility="private")
    event.then(refresh, size, note, queue=False, api_visibility="private")


def _overview_tab(runtime: Runtime, scratch: ScratchSpace, slot: DeviceSlot, budget: DeviceBudget) -> None:
    """One photo through every picture task, shown side by side; endpoint /all."""
    *first, last = [TASKS[name].title.lower() for name in ALL_TASKS]
    titles = f"{', '.join(first)} and {last}"
    gr.Markdown(f"### All tasks\nOne photo through {titles}, reusing the models already loaded.")
    sizes = smallest_first(size for name in ALL_TASKS for size in runtime.offered_sizes(name))
    with gr.Row(equal_height=False):
        with gr.Column(scale=1):
            image = components.photo_input("all-photo")
            size = components.size_choice(sizes, sizes[0], "Tasks without this size use their own default.")
            button = gr.Button("Run all tasks", variant="primary", elem_id="all-run")
            gr.Examples(EXAMPLES, inputs=[image], label="Example photos", cache_examples=False)
        with gr.Column(scale=4):
            tiles = [TASKS[name] for name in ALL_TASKS]
            pictures = []
            for row in (tiles[:3], tiles[3:]):
                with gr.Row(equal_height=True):
                    for task in row:
                        with gr.Column(min_width=280):
                            # One caption per tile, at reading size: the heading; the picture shows no label.
                            gr.Markdown(f"#### {task.title}")
                            pictures.append(
                                components.shown_picture(
                                    task.title,
                                    340,
                                    f"all-{task.name}",
                                    show_label=False,
                                    result=not pictures,
                                    picture=task.picture_titles[0],
                                )
                            )
            summary, timing = components.text_outputs()
            files = components.downloads("all-downloads")
    button.click(
        cancellable(handlers.overview_handler(runtime, scratch, slot, sizes[0]), budget),
        inputs=[image, size],
        outputs=[*pictures, summary, timing, files],
        api_name="all",
        api_description="Every picture task on one photo, side by side.",
        # The whole run's bar over the downloads; each tile shows its own task's stage, sent by the handler.
        show_progress_on=[files],
        **MODEL_EVENT,
    )


def _video_tab(
    runtime: Runtime, scratch: ScratchSpace, slot: DeviceSlot, budget: DeviceBudget, limits: Limits
) -> FrameSpeeds:
    """A short clip through a chosen task, frame by frame; endpoint /video. Returns the clips' measured
    speeds, which its note on a CPU reads."""
    on_cpu = runtime.device.type == "cpu"
    gr.Markdown(video_header(on_cpu, limits.video_frames, request_seconds()), elem_id="video-header")
    speeds = FrameSpeeds()
    budget_note = gr.Markdown(
        handlers.video_budget_note(runtime, speeds, FIRST_TASK, None),
        visible=on_cpu,
        elem_classes="studio-note",
        elem_id="video-budget",
    )
    with gr.Row(equal_height=False):
        with gr.Column(scale=2):
            clip = gr.Video(label="Clip", sources=["upload"], elem_id="video-clip")
            gr.Markdown(
                "MP4, MOV, WebM, MKV or AVI. The preview above may stay blank for some MP4 files (those "
                "written with the mp4v codec, OpenCV's default, for one): the clip still runs.",
                elem_classes="studio-timing",
            )
            choice = components.task_choice()
            size = components.size_choice(runtime.offered_sizes(FIRST_TASK), TASKS[FIRST_TASK].default_size)
            controls = components.video_controls(runtime.device)
            button = gr.Button("Run on the video", variant="primary", elem_id="video-run")
        with gr.Column(scale=3):
            # No label badge: it would cover the track ids drawn at the top-left corner of each box.
            shown = gr.Video(
                label="Result",
                show_label=False,
                interactive=False,
                elem_id="video-result",
                elem_classes=components.RESULT,
            )
            summary = gr.Markdown()
            with gr.Column(visible=False) as motion_box:
                motion = gr.Model3D(
                    label="Motion (each person's skeleton, animated, over the first frame)",
                    elem_id="video-motion",
                )
            files = components.downloads("video-downloads")
            motion_view = gr.State(None)  # the 3-D view's file; a state, so the API returns three values
    choice.change(
        lambda name: components.size_choice(runtime.offered_sizes(name), TASKS[name].default_size),
        choice,
        size,
        queue=False,
        api_visibility="private",
    )
    run = button.click(
        cancellable(handlers.video_handler(runtime, scratch, slot, speeds), budget),
        inputs=[clip, choice, size, *controls],
        outputs=[shown, summary, files, motion_view],
        api_name="video",
        api_description="A short clip through one task; returns the processed video and its files.",
        show_progress_on=[shown],  # one bar, over the clip, not one per output
        **MODEL_EVENT,  # the upload reaches the handler untouched: only sapiens2.vision.video_files opens it
    )
    # The viewer is shown, then given its file: one made visible with its file at once stays empty (Gradio 6).
    box = run.then(
        lambda path: gr.Column(visible=path is not None),
        motion_view,
        motion_box,
        queue=False,
        api_visibility="private",
    )
    box.then(
        handlers.motion_view_handler(scratch), motion_view, motion, queue=False, api_visibility="private"
    )
    if on_cpu:  # before a clip runs: how many of its frames fit the request's device time at the speed seen

        def refresh(name: str, chosen: str | None) -> str:
            return handlers.video_budget_note(runtime, speeds, name, chosen)

        note = {"fn": refresh, "inputs": [choice, size], "outputs": budget_note, "queue": False}
        gr.on([clip.upload, choice.change, size.change], **note, api_visibility="private")
        run.then(**note, api_visibility="private")
    return speeds


def _live_tab(runtime: Runtime, slot: DeviceSlot, streams: StreamWatch, places: int) -> None:
    """Webcam frames streamed through a chosen task with its smallest model, with the frame rate."""
    gr.Markdown(
        "### Live webcam\nEvery frame goes through the chosen task with its smallest model. The licence "
        "below applies to the live view as to photos: no tracking of people without their consent.",
        elem_classes="studio-note",
        elem_id="live-note",
    )
    choice = components.task_choice()
    with gr.Row():
        camera = gr.Image(sources=["webcam"], streaming=True, label="Webcam")
        # No label badge over the picture, where it would cover the track ids drawn at the boxes' corners.
        shown = gr.Image(
            label="Result", show_label=False, format="jpeg", interactive=False, elem_id="live-result"
        )
    rate = gr.Markdown(elem_id="live-rate")
    stream_state = gr.State(None)  # handlers.LiveStream, made at the stream's first frame
    camera.stream(
        handlers.live_handler(runtime, slot, streams),
        inputs=[camera, choice, stream_state],
        outputs=[shown, rate, stream_state],
        stream_every=0.1,
        time_limit=600,
        concurrency_id=LIVE_EVENTS,
        concurrency_limit=places,
        show_progress="hidden",
        api_visibility="private",
        preprocess=False,  # the frame's bytes are checked before it is decoded (sapiens2.serving.frames)
    )


# ---- command line ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None, settings: Settings | None = None) -> argparse.Namespace:
    settings = settings or current()
    parser = argparse.ArgumentParser(description=f"{TITLE}: the Sapiens2 models in a web page.")
    add_runtime_arguments(parser)
    parser.add_argument(
        "--host",
        default=settings.server_name,
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for everyone)",
    )
    parser.add_argument("--port", type=int, default=settings.server_port)
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
    try:
        install(Settings.read())  # the settings of this server, read once: here
    except ConfigError as error:
        sys.exit(describe_error(error))
    args = parse_args(argv, current())
    keep_freed_memory(current())
    try:
        runtime = runtime_from_arguments(args)
        local = local_choices(args.checkpoint_dir, args.model)
    except Exception as error:
        sys.exit(describe_error(error))
    try:
        hosting = zerogpu.serve(runtime)
    except Exception as error:
        sys.exit(describe_error(error))
    scratch = ScratchSpace()
    atexit.register(scratch.remove)
    exit_cleanly_on_signals(scratch.remove)
    demo = build_app(runtime, scratch, local, hosting, current())
    launch(demo, host=args.host, port=args.port, share=args.share, settings=current())


if __name__ == "__main__":
    main()
