"""Command line: `sapiens2 TASK INPUT... --out DIR` runs registered tasks on photos, folders and videos.

Outputs go to DIR/<input's path under its folder, without extension>_<kind>.<ext>. A file that cannot be
read is reported and skipped; outputs already there are kept unless --overwrite.
"""

from __future__ import annotations

import argparse
import errno
import os
import secrets
import shutil
import stat
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from huggingface_hub.utils import tqdm  # the tqdm that huggingface_hub, a dependency, ships with

from .detector import DetectorError
from .errors import CheckpointError, ConfigError
from .export import write_picture
from .files import file_kind, file_problem
from .images import ImageInputError, LoadedImage, load_image, sanitize_filename
from .messages import describe_error, is_expected
from .options import Option
from .results import TaskResult
from .runtime import DEFAULT_BATCH_SIZE, Runtime
from .runtime_arguments import add_runtime_arguments, runtime_from_arguments
from .tasks import ALL_TASKS, TASKS, Task, all_sizes, get_task
from .video import (
    VIDEO_EXTENSIONS,
    VIDEO_FORMATS,
    VideoError,
    VideoJob,
    planned_frames,
    process_video,
    video_info,
    video_outputs,
)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
EXIT_OK, EXIT_NOTHING_SUCCEEDED = 0, 1  # argparse exits with 2 on usage errors
EXPORT_KINDS = ("json", "png", "npy", "ply")
NAME_MAX, PATH_MAX = 255, 4095  # bytes of one part of a path and of a whole path (Linux)
# Errors that concern the task's model or detector rather than one input: the task stops there.
TASK_ERRORS = (CheckpointError, DetectorError, ConfigError)


# ---- inputs and where their outputs go -----------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One input file and the folder and stem its outputs are named after."""

    path: Path
    label: str
    directory: Path
    stem: str

    @property
    def is_video(self) -> bool:
        return self.path.suffix.lower() in VIDEO_EXTENSIONS


def _walk(folder: Path, skip: Path) -> Iterator[Path]:
    """Image and video files under `folder`, sorted, leaving out hidden entries and the `skip` folder."""
    for root, folders, files in os.walk(folder):
        folders[:] = sorted(
            name for name in folders if not name.startswith(".") and _real(Path(root) / name) != skip
        )
        for name in sorted(files):
            if not name.startswith(".") and Path(name).suffix.lower() in IMAGE_EXTENSIONS | VIDEO_EXTENSIONS:
                yield Path(root) / name


def _real(path: Path) -> Path:
    """The path with every link followed as far as it goes; never raises, even on a loop of links."""
    return Path(os.path.realpath(path))


def printable(text: str) -> str:
    """`text` as any terminal can print it: bytes of a file name that are not UTF-8 shown as \\xNN."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _not_a_file(path: Path) -> str | None:
    """Why `path` cannot be read as an input file (a sentence), or None when it is a regular file."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "It is a link to a file that does not exist." if os.path.lexists(path) else "No such file."
    except OSError as error:
        return file_problem(error, printable(path.name), "an image or video file")
    if stat.S_ISREG(mode):
        return None
    return f"It is {file_kind(mode)}, not an image or video file."


def collect_sources(inputs: Sequence[str], out: Path) -> tuple[list[Source], list[tuple[str, str]]]:
    """The files named or found under the folders named, with their output places; and the inputs that
    cannot be read (missing, a FIFO or device, a loop of links), each with its sentence."""
    found: list[tuple[Path, str, Path]] = []  # (file, label, its path under the output folder)
    missing = []
    for text in inputs:
        path = Path(text).expanduser()
        if path.is_dir():
            walked = [
                (file, printable(str(file)), file.relative_to(path)) for file in _walk(path, _real(out))
            ]
        else:
            walked = [(path, printable(text), Path(path.name))]
        for file, label, relative in walked:
            problem = _not_a_file(file)
            if problem is None:
                found.append((file, label, relative))
            else:
                missing.append((label, "No such file or folder." if problem == "No such file." else problem))
    unique = {_real(file): (file, label, relative) for file, label, relative in reversed(found)}
    found = list(reversed(unique.values()))  # a file named twice (alone and in its folder) runs once
    places = output_places([relative.parts for _, _, relative in found])
    return [
        Source(file, label, out.joinpath(*folders), stem)
        for (file, label, _), (folders, stem) in zip(found, places, strict=True)
    ], missing


def output_places(relatives: Sequence[Sequence[str]]) -> list[tuple[tuple[str, ...], str]]:
    """For each input's path under its folder (as parts): the output subfolders and the stem its outputs are
    named after, both made safe; inputs that differ only by extension keep it in their stem."""
    places = []
    for parts in relatives:
        folders = tuple(sanitize_filename(part, "folder") for part in parts[:-1])
        places.append((folders, sanitize_filename(PurePath(parts[-1]).stem), parts[-1]))
    uses = Counter((folders, stem) for folders, stem, _ in places)
    # Inputs that differ only by extension (photo.jpg, photo.png) keep it in their stem, so both are kept.
    return [
        (folders, stem if uses[folders, stem] == 1 else sanitize_filename(name))
        for folders, stem, name in places
    ]


@dataclass(frozen=True)
class Plan:
    """What to write: export kinds (json, png, npy, ply), whether to write pictures, the videos' format."""

    exports: frozenset[str]
    pictures: bool
    overwrite: bool
    video_format: str = "webm"

    def export_suffixes(self, task: Task) -> list[str]:
        return [s for s in task.export_suffixes if s.rsplit(".", 1)[-1] in self.exports]

    def picture_suffixes(self, task: Task) -> dict[str, str]:
        """Picture title -> file suffix; a picture whose content an export writes is left to that export."""
        if not self.pictures:
            return {}
        exports = set(self.export_suffixes(task))
        return {picture.title: picture.suffix for picture in task.pictures if picture.same_as not in exports}

    def image_suffixes(self, task: Task) -> list[str]:
        """What follows a photo's stem in the names of the files it gets from `task`."""
        return self.export_suffixes(task) + [f"{s}.png" for s in self.picture_suffixes(task).values()]

    def image_outputs(self, task: Task, source: Source) -> list[Path]:
        return [source.directory / f"{source.stem}{suffix}" for suffix in self.image_suffixes(task)]

    def outputs(self, task: Task, source: Source) -> list[Path]:
        """Every file the source is to get from `task`."""
        if not source.is_video:
            return self.image_outputs(task, source)
        log_kind = task.frame_log.suffix.rsplit(".", 1)[-1] if task.frame_log else None
        writes = {"write_video": self.pictures, "write_log": log_kind in self.exports}
        return video_outputs(task, source.directory, source.stem, video_format=self.video_format, **writes)

    def pending(self, task: Task, source: Source) -> bool:
        """True when the source has outputs of `task` to write (all of them, with overwrite)."""
        paths = self.outputs(task, source)
        return bool(paths) and (self.overwrite or not all(path.exists() for path in paths))


def write_image_outputs(result: TaskResult, task: Task, source: Source, plan: Plan) -> tuple[list[Path], int]:
    """Write the planned exports and pictures of one photo; returns the files written and those kept.

    Exports are written to a hidden folder first, and only the chosen kinds are moved into place.
    """
    staging = source.directory / f".sapiens2-{secrets.token_hex(6)}"
    try:
        exported = {path.name.removeprefix(source.stem): path for path in result.export(staging, source.stem)}
        files = {f"{source.stem}{suffix}": exported[suffix] for suffix in plan.export_suffixes(task)}
        pictures = dict(result.pictures)
        for title, suffix in plan.picture_suffixes(task).items():
            for path in write_picture(staging, source.stem, suffix, pictures[title]):
                files[path.name] = path
        written, kept = [], 0
        for name, staged in files.items():
            target = source.directory / name
            if target.exists() and not plan.overwrite:
                kept += 1
                continue
            os.replace(staged, target)
            written.append(target)
        return written, kept
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ---- the run ---------------------------------------------------------------------------------------------


@dataclass
class TaskStats:
    """One task's share of the run."""

    images: int = 0
    persons: int | None = None  # for tasks that detect persons
    seconds: float = 0.0  # detection + model + post-processing, summed over photos


@dataclass
class Report:
    """What happened: files written and kept, successes, failures and per-task and per-video figures."""

    written: list[Path] = field(default_factory=list)
    kept: int = 0
    succeeded: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    stats: dict[str, TaskStats] = field(default_factory=dict)
    videos: list[str] = field(default_factory=list)

    def fail(self, what: str, error: BaseException | str) -> None:
        self.failures.append((what, error if isinstance(error, str) else reason(error)))


def reason(error: BaseException) -> str:
    """A sentence for a failure: the shared wording for known errors, else the error's type and text."""
    return describe_error(error) if is_expected(error) else f"{type(error).__name__}: {error}"


@dataclass
class Run:
    """Runs tasks over sources and fills a report."""

    runtime: Runtime
    plan: Plan
    batch_size: int
    size: str | None
    model: str | None
    options: dict[str, Any]
    max_frames: int | None
    stride: int
    report: Report = field(default_factory=Report)
    unreadable: set[Path] = field(default_factory=set)

    def task_options(self, task: Task) -> dict[str, Any]:
        names = {option.name for option in task.options}
        return {name: value for name, value in self.options.items() if name in names and value is not None}

    def task(self, task: Task, sources: Sequence[Source]) -> None:
        """Run one task on every source that still needs it; a model or detector failure stops the task."""
        readable = [source for source in sources if source.path not in self.unreadable]
        for source in readable:  # known up front: the model never runs for outputs that cannot be named
            if any(too_long(path) for path in self.plan.outputs(task, source)):
                self.unreadable.add(source.path)
                self.report.fail(source.label, "Its output file names would be too long for this system.")
        readable = [source for source in readable if source.path not in self.unreadable]
        todo = [source for source in readable if self.plan.pending(task, source)]
        for source in set(readable) - set(todo):
            outputs = self.plan.outputs(task, source)
            self.report.succeeded += bool(outputs)
            self.report.kept += len(outputs)
        try:
            self.images(task, [source for source in todo if not source.is_video])
            for source in todo:
                if source.is_video:
                    self.video(task, source)
        except TASK_ERRORS as error:
            self.report.fail(f"{task.name} (task stopped)", error)

    def images(self, task: Task, sources: Sequence[Source]) -> None:
        if not sources:
            return
        stats = self.report.stats.setdefault(task.name, TaskStats())
        with tqdm(total=len(sources), desc=task.name, unit="image", leave=False) as bar:
            for start in range(0, len(sources), self.batch_size):
                chunk = sources[start : start + self.batch_size]
                for source, result in self.results(task, self.loaded(chunk)):
                    stats.images += 1
                    stats.seconds += result.timings.total
                    if result.persons is not None:
                        stats.persons = (stats.persons or 0) + result.persons
                    self.save(result, task, source)
                bar.update(len(chunk))

    def loaded(self, sources: Sequence[Source]) -> list[tuple[Source, LoadedImage]]:
        """The photos that can be read; the others are reported once and left out of later tasks."""
        loaded = []
        for source in sources:
            try:
                loaded.append((source, load_image(source.path)))
            except (ImageInputError, OSError) as error:
                self.unreadable.add(source.path)
                self.report.fail(source.label, error)
        return loaded

    def results(self, task: Task, batch: list[tuple[Source, LoadedImage]]) -> list[tuple[Source, TaskResult]]:
        """(source, result) pairs of a batch; when the batch fails, each photo is tried alone."""
        if not batch:
            return []
        try:
            results = self.runtime.run_batch(
                task.name,
                [image for _, image in batch],
                size=task.size_or_default(self.size),
                model=self.model,
                **self.task_options(task),
            )
            return list(zip([source for source, _ in batch], results, strict=True))
        except TASK_ERRORS:
            raise
        except Exception as error:
            if len(batch) == 1:
                self.report.fail(batch[0][0].label, error)
                return []
        return [pair for item in batch for pair in self.results(task, [item])]

    def save(self, result: TaskResult, task: Task, source: Source) -> None:
        try:
            written, kept = write_image_outputs(result, task, source, self.plan)
        except Exception as error:
            self.report.fail(source.label, f"Its outputs could not be written: {reason(error)}")
            return
        self.report.written += written
        self.report.kept += kept
        self.report.succeeded += 1

    def video(self, task: Task, source: Source) -> None:
        missing = [
            path for path in self.plan.outputs(task, source) if self.plan.overwrite or not path.exists()
        ]
        is_video = [path.suffix[1:] in VIDEO_FORMATS for path in missing]
        job = VideoJob(
            task.name,
            source.path,
            source.directory,
            size=task.size_or_default(self.size),
            model=self.model,
            options=self.task_options(task),
            stem=source.stem,
            max_seconds=None,
            max_frames=self.max_frames,
            stride=self.stride,
            batch_size=self.batch_size,
            video_format=self.plan.video_format,
            write_video=any(is_video),
            write_log=not all(is_video),
        )
        try:
            total = planned_frames(video_info(source.path), stride=self.stride, max_frames=self.max_frames)
            with tqdm(total=total, desc=f"{task.name} {source.path.name}", unit="frame", leave=False) as bar:

                def progress(fraction: float, _: str) -> None:
                    bar.update(round(fraction * (total or 0)) - bar.n)

                result = process_video(self.runtime, job, progress)
        except TASK_ERRORS:
            raise
        except Exception as error:
            if isinstance(error, VideoError):
                self.unreadable.add(source.path)
            self.report.fail(source.label, error)
            return
        self.report.written += result.files
        self.report.kept += len(self.plan.outputs(task, source)) - len(missing)
        self.report.succeeded += 1
        persons = "" if result.persons is None else f", {_count(result.persons, 'person')}"
        self.report.videos.append(
            f"{source.label}, {task.name}: {result.frames} frames in {result.seconds:.1f} s, "
            f"{result.frames_per_second:.2f} frames/s{persons}"
        )


# ---- arguments -------------------------------------------------------------------------------------------


def registry_options() -> dict[str, tuple[Option, list[str]]]:
    """Every task option by name, with the tasks that take it (an option shared by tasks appears once)."""
    options: dict[str, tuple[Option, list[str]]] = {}
    for task in TASKS.values():
        for option in task.options:
            options.setdefault(option.name, (option, []))[1].append(task.name)
    return options


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
        description="Run Sapiens2 models on photos, folders of photos and videos.",
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
    for option, tasks in registry_options().values():
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
    for name, (_, owners) in registry_options().items():
        if getattr(args, name) is not None and not chosen & set(owners):
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} is an option of {', '.join(owners)}, not of {', '.join(sorted(chosen))}")
    if not args.pictures and not args.exports:
        parser.error("nothing to write: --no-pictures with --exports none")
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


def too_long(path: Path) -> bool:
    """True when the system cannot name `path`: a part above 255 bytes or the whole above 4095."""
    encoded = [len(os.fsencode(part)) for part in path.parts]
    return max(encoded, default=0) > NAME_MAX or len(os.fsencode(str(path))) > PATH_MAX


def _count(number: int, word: str) -> str:
    return f"{number} {word}{'s' * (number != 1)}"


def print_summary(report: Report, seconds: float, out: Path) -> None:
    """Files written, persons found, time per photo, frames per second and failures with their reasons."""
    kept = f", {report.kept} already there (kept)" if report.kept else ""
    print(f"\nDone in {seconds:.1f} s: {_count(len(report.written), 'file')} written to {out}{kept}.")
    for name, stats in report.stats.items():
        if stats.images:
            persons = "" if stats.persons is None else f", {_count(stats.persons, 'person')} found"
            time_per_image = f"{stats.seconds / stats.images:.2f} s per image"
            print(f"  {name}: {_count(stats.images, 'image')}{persons}, {time_per_image}")
    for line in report.videos:
        print(f"  {line}")
    if report.failures:
        print(f"{_count(len(report.failures), 'failure')}:")
        for what, why in report.failures:
            print(f"  {what}: {why}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 success, 1 nothing succeeded, 2 usage error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:  # `sapiens2 train TASK ...`: fine-tuning, its own command
        from .training.cli import main as train

        return train(argv[1:])
    for stream in (sys.stdout, sys.stderr):  # file names that are not UTF-8 print as \xNN, never crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    tasks = _checked_arguments(parser, args)
    if args.ray is not None:
        from .scale import run_on_ray  # Ray is imported only there, and only when installed

        return run_on_ray(parser, args, tasks)
    try:
        runtime = runtime_from_arguments(args, batch_size=args.batch_size)
    except ConfigError as error:
        parser.error(str(error))
    sources, missing = collect_sources(args.inputs, args.out)
    plan = Plan(args.exports, args.pictures, args.overwrite, args.video_format)
    options = {name: getattr(args, name) for name in registry_options()}
    run = Run(runtime, plan, args.batch_size, args.size, args.model, options, args.max_frames, args.stride)
    for what, why in missing:
        run.report.fail(what, why)
    start = time.perf_counter()
    names = ", ".join(task.name for task in tasks)
    where = f"{runtime.device_label}, {runtime.dtype_label}"
    print(f"{names} on {_count(len(sources), 'file')} ({where}) -> {args.out}")
    for task in tasks:
        run.task(task, sources)
    print_summary(run.report, time.perf_counter() - start, args.out)
    if run.report.succeeded:
        return EXIT_OK
    print("Nothing succeeded" + ("." if sources else ": no image or video was found."), file=sys.stderr)
    return EXIT_NOTHING_SUCCEEDED
