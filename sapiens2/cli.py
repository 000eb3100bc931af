"""Command line: `sapiens2 TASK INPUT... --out DIR` runs registered tasks on photos, folders and videos.

This module parses and checks the arguments; the batch engine (`sapiens2.batch`) runs them. Outputs go to
DIR/<input's path under its folder, without extension>_<kind>.<ext>. A file that cannot be read is
reported and skipped; outputs already there are kept unless --overwrite.
"""

from __future__ import annotations

import argparse
import errno
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sapiens2.batch.inputs import printable
from sapiens2.batch.local import run_locally
from sapiens2.batch.plan import EXPORT_KINDS, Plan
from sapiens2.batch.report import EXIT_NOTHING_SUCCEEDED, EXIT_OK, reason
from sapiens2.batch.request import BatchRequest, ClusterSettings
from sapiens2.batch.video import VIDEO_FORMATS
from sapiens2.errors import ConfigError
from sapiens2.pipelines.options import Option
from sapiens2.runtime import DEFAULT_BATCH_SIZE
from sapiens2.runtime.arguments import add_runtime_arguments, runtime_from_arguments
from sapiens2.runtime.warm_heap import keep_freed_memory
from sapiens2.serving.shutdown import ending_on_signals
from sapiens2.settings import Settings, installed
from sapiens2.tasks import ALL_TASKS, TASKS, Task, all_sizes, get_task, options_by_name
from sapiens2.vision.images import ImageInputError, load_image

__all__ = ["EXIT_NOTHING_SUCCEEDED", "EXIT_OK", "build_parser", "main"]


# ---- arguments -------------------------------------------------------------------------------------------


def _checked(option: Option):
    """An argparse type that checks a value the way the option itself does."""

    def convert(text: str) -> Any:
        try:
            return option.coerce(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


def _add_task_option(group: argparse._ArgumentGroup, option: Option, tasks: list[str]) -> None:
    """One flag for a registry option: --name/--no-name for checkboxes, a checked value for the others."""
    where = f"[{', '.join(tasks)}]"
    default = option.default_text
    if option.kind == "checkbox":
        kind = {
            "action": argparse.BooleanOptionalAction,
            "help": f"{option.label} (default {default}) {where}",
        }
    elif option.kind == "slider":
        span = f"{option.minimum:g} to {option.maximum:g}, default {default}"
        kind = {"type": _checked(option), "metavar": "X", "help": f"{option.label}: {span} {where}"}
    elif option.kind == "color":
        text = f"{option.label}: #rrggbb or 'rgb(r, g, b)', default {default} {where}"
        kind = {"type": _checked(option), "metavar": "COLOUR", "help": text}
    elif option.kind == "choices":
        own = " (or a fine-tuned model's own names)" if option.model_choices else ""
        text = f"{option.label}: any of {', '.join(option.choices)}{own}, repeated or comma-separated"
        kind = {"type": _checked(option), "action": "extend", "metavar": "NAME",
                "help": f"{text}, default {default} {where}"}  # fmt: skip
    else:
        kind = {"metavar": "IMAGE", "help": f"{option.label} {where}"}
    group.add_argument("--" + option.name.replace("_", "-"), dest=option.name, default=None, **kind)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _kinds(text: str) -> frozenset[str]:
    words = {word.strip().lower() for word in text.split(",") if word.strip()}
    if words == {"all"}:
        return frozenset(EXPORT_KINDS)
    if words == {"none"}:
        return frozenset()
    unknown = sorted(words - set(EXPORT_KINDS))
    if unknown or not words:
        raise argparse.ArgumentTypeError(
            f"export kinds are {', '.join(EXPORT_KINDS)} (comma-separated), 'all' or 'none'; got {text!r}"
        )
    return frozenset(words)


def _frame_logs() -> str:
    """The frame logs that tasks write beside their videos, for the help text."""
    logs = [f"for {task.name}, <name>{task.frame_log.suffix}" for task in TASKS.values() if task.frame_log]
    return "".join(f" and, {log}" for log in logs)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; task options come from the registry."""
    parser = argparse.ArgumentParser(
        prog="sapiens2",
        description="Run Sapiens2 models on photos, folders of photos and videos. To fine-tune a task on "
        "your own data: sapiens2 train TASK --data DIR --model REPO_OR_PATH --out DIR (see sapiens2 train "
        "--help).",
        epilog=(
            "Outputs: OUT/<input path under its folder, without extension>_<kind>.<ext>; videos give "
            f"<name>_<task>.webm (or .mp4){_frame_logs()}. Exit status: 0 when at least one input succeeded "
            "(or its outputs were already there), 1 when nothing succeeded, 2 for a usage error."
        ),
    )
    parser.add_argument(
        "task", choices=[*TASKS, "all"], help="the task to run; 'all' runs " + ", ".join(ALL_TASKS)
    )
    parser.add_argument(
        "inputs", nargs="+", metavar="INPUT", help="image or video files, or folders (searched recursively)"
    )
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="output folder (with --ray, also a URI: s3://, gs://)"
    )

    model = parser.add_argument_group("model")
    sizes = all_sizes(TASKS.values())
    model.add_argument("--size", choices=sizes, help="model size (default: each task's default size)")
    model.add_argument(
        "--model",
        metavar="ID_OR_PATH",
        help="a Hub repo id, checkpoint folder or .safetensors file instead of --size (one task only)",
    )
    add_runtime_arguments(model)
    model.add_argument(
        "--batch-size",
        type=_positive,
        default=DEFAULT_BATCH_SIZE,
        help=f"photos or frames per model call (default {DEFAULT_BATCH_SIZE})",
    )

    options = parser.add_argument_group("task options")
    for option, tasks in options_by_name().values():
        _add_task_option(options, option, tasks)

    outputs = parser.add_argument_group("outputs")
    outputs.add_argument(
        "--pictures",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write the pictures (PNG) and the videos (default on)",
    )
    outputs.add_argument(
        "--exports",
        type=_kinds,
        default=frozenset(EXPORT_KINDS),
        metavar="KINDS",
        help=f"export kinds to write, comma-separated: {', '.join(EXPORT_KINDS)}, all or none (default all)",
    )
    outputs.add_argument(
        "--overwrite",
        action="store_true",
        help="rewrite outputs that already exist (default: keep them and skip their inputs)",
    )

    video = parser.add_argument_group("videos")
    video.add_argument("--max-frames", type=_positive, metavar="N", help="stop after N frames of each video")
    video.add_argument(
        "--stride",
        type=_positive,
        default=1,
        metavar="N",
        help="keep every N-th frame (the video's frame rate is divided by N)",
    )
    video.add_argument(
        "--video-format",
        choices=list(VIDEO_FORMATS),
        default="webm",
        help="webm (VP8: plays in web browsers and desktop players; default) or mp4 (mp4v: several times "
        "faster to write, for long videos on a GPU; desktop players only)",
    )

    cluster = parser.add_argument_group("at scale, on a Ray cluster (pip install -r requirements-scale.txt)")
    cluster.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run the photos on Ray Data, at ADDRESS (default: $RAY_ADDRESS, else a local cluster); "
        "inputs and --out may be URIs; adds OUT/predictions/<task>/ and OUT/failures/ (Parquet)",
    )
    cluster.add_argument(
        "--actors",
        type=_actor_range,
        metavar="MIN,MAX",
        help="model actors per model stage, scaled between MIN and MAX (default 1 to one per GPU, or one "
        "per node without GPUs)",
    )
    cluster.add_argument(
        "--actor-resources",
        type=_resource_amounts,
        default={},
        metavar="NAME=N,...",
        help="custom Ray resources each model actor reserves (split among a task's model stages)",
    )
    return parser


def _actor_range(text: str) -> tuple[int, int]:
    parts = [_positive(part) for part in text.split(",")]
    if len(parts) not in (1, 2) or parts[0] > parts[-1]:
        raise argparse.ArgumentTypeError(f"expected N or MIN,MAX with MIN <= MAX, got {text!r}")
    return parts[0], parts[-1]


def _resource_amounts(text: str) -> dict[str, float]:
    amounts = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, amount = item.partition("=")
        try:
            amounts[name.strip()] = float(amount)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected NAME=AMOUNT,..., got {text!r}") from None
        if not name.strip() or amounts[name.strip()] <= 0:
            raise argparse.ArgumentTypeError(f"expected NAME=AMOUNT with a positive amount, got {item!r}")
    return amounts


def _checked_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Task]:
    """The tasks to run; inconsistent arguments end the program with a usage error."""
    tasks = [get_task(name) for name in (ALL_TASKS if args.task == "all" else [args.task])]
    if args.model and len(tasks) > 1:
        parser.error("--model names one checkpoint: choose one task, not 'all'")
    if args.size and not args.model and not any(args.size in task.repos for task in tasks):
        names = ", ".join(task.name for task in tasks)
        parser.error(f"no {args.size} model exists for {names}")
    chosen = {task.name for task in tasks}
    for name, (_, owners) in options_by_name().items():
        if getattr(args, name) is not None and not chosen & set(owners):
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} is an option of {', '.join(owners)}, not of {', '.join(sorted(chosen))}")
    if not args.pictures and not args.exports:
        parser.error("nothing to write: --no-pictures with --exports none")
    if args.ray is not None and args.backend == "onnxruntime":
        parser.error("--backend onnxruntime runs the models in this process; the Ray model stages run torch")
    if args.ray is None and (args.actors or args.actor_resources):
        parser.error("--actors and --actor-resources size the model stages of --ray")
    if args.ray is None and "://" in args.out:
        parser.error("--out is a local folder; URIs are for --ray")
    if args.ray is None:
        args.out = Path(args.out)
        _check_out(parser, args.out)
    if getattr(args, "background_image", None) is not None:
        try:
            args.background_image = load_image(Path(args.background_image))
        except (ImageInputError, OSError) as error:
            parser.error(f"--background-image: {reason(error)}")
    return tasks


def _check_out(parser: argparse.ArgumentParser, out: Path) -> None:
    """The output folder, made now: a file in its place, a name too long or a folder that cannot be written
    is a usage error before any model runs."""
    shown = printable(str(out))
    try:
        if out.exists() and not out.is_dir():
            parser.error(f"--out {shown} is a file, not a folder; choose a folder for the results")
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".sapiens2-write-test-{secrets.token_hex(4)}"
        probe.mkdir()
        probe.rmdir()
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            parser.error(f"--out: the folder name is too long for this system ({len(str(out))} characters)")
        parser.error(f"--out {shown}: the folder cannot be written ({error.strerror or error})")


def request_from_arguments(args: argparse.Namespace, tasks: Sequence[Task]) -> BatchRequest:
    """The checked arguments as the batch engine's request."""
    cluster = None
    if args.ray is not None:
        cluster = ClusterSettings(args.ray, args.actors, dict(args.actor_resources))
    options = {name: getattr(args, name) for name in options_by_name()}
    return BatchRequest(
        tasks=tuple(tasks),
        inputs=tuple(args.inputs),
        out=args.out,
        plan=Plan(args.exports, args.pictures, args.overwrite, args.video_format, options),
        size=args.size,
        model=args.model,
        options=options,
        batch_size=args.batch_size,
        max_frames=args.max_frames,
        stride=args.stride,
        device=args.device,
        dtype=args.dtype,
        detector=args.detector,
        checkpoint_dir=args.checkpoint_dir,
        compile=args.compile,
        cluster=cluster,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 success, 1 nothing succeeded, 2 usage error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:  # `sapiens2 train TASK ...`: fine-tuning, its own command
        from sapiens2.training.cli import main as train

        return train(argv[1:])
    if argv[:1] == ["export"]:  # `sapiens2 export TASK --out FILE.onnx`: ONNX files, their own command
        from sapiens2.runtime.export_command import main as export

        return export(argv[1:])
    for stream in (sys.stdout, sys.stderr):  # file names that are not UTF-8 print as \xNN, never crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings.read()
    except ConfigError as error:
        parser.error(str(error))
    with installed(settings):
        return _run(parser, args, settings)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, settings: Settings) -> int:
    keep_freed_memory(settings)
    request = request_from_arguments(args, _checked_arguments(parser, args))
    if request.cluster is not None:
        from sapiens2.batch import cluster  # Ray is imported only there, and only when installed

        missing = cluster.missing_ray()
        if missing is not None:
            hint = cluster.INSTALL_HINT
            parser.error(f"--ray needs Ray Data, which is not installed ({missing}). Install it: {hint}")
        return cluster.run_on_ray(request)
    try:
        runtime = runtime_from_arguments(args, batch_size=args.batch_size)
    except ConfigError as error:
        parser.error(str(error))
    with ending_on_signals():  # a stop leaves no half-written file in --out (Ray's run stops its own way)
        return run_locally(request, runtime)
