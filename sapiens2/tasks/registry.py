"""The task registry: each task is declared once; the app, the command line and the tests all read it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from sapiens2.errors import RequestError
from sapiens2.models.kinds import MATTING, NORMAL, POINTMAP, POSE, PRETRAIN, SEG, ModelKind
from sapiens2.outputs.results import TaskOptions
from sapiens2.pipelines.options import Option, checked, coerced, declared, shown

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np

    from sapiens2.outputs.results import (
        Export,
        FrameFollower,
        FrameLog,
        Options,
        Prediction,
        TaskResult,
    )
    from sapiens2.pipelines.context import PipelineContext
    from sapiens2.pipelines.steps import Given, Pipeline
    from sapiens2.vision.images import LoadedImage


@dataclass(frozen=True)
class Picture:
    """A picture a task draws: its title, the file it is saved as (the photo's stem, `suffix`, ".png"),
    `draw(prediction, options)` giving it (uint8 RGB at the photo's size), and the export that already
    holds what it shows, if one does (then only that export is written); the video's first picture is the
    task's first picture."""

    title: str
    suffix: str
    draw: Callable[[Prediction, Options], np.ndarray]
    same_as: str | None = None
    # For videos: also written as a video of its own, `{stem}{suffix}.webm` (pose: the ControlNet drawing).
    in_videos: bool = False


@dataclass(frozen=True)
class Task:
    """One task: the kind of checkpoint it runs, its options, the pictures it draws and the files it may
    write (`exports`, each naming its own file)."""

    name: str
    title: str
    description: str
    kind: ModelKind
    default_size: str
    # Its options as one typed class (a field per option): what its pipeline, pictures and exports read.
    options_type: type[TaskOptions]
    pictures: tuple[Picture, ...]
    # The files it may write from a prediction: "_pose.json", "_points.ply", ..., each with its writer.
    exports: tuple[Export, ...]
    pipeline: Pipeline
    in_overview: bool = True
    # Another model some options use: the body-part model masking normals and depth.
    helper: ModelKind | None = None
    helper_option: str | None = None
    # For videos: a record of every frame written beside the video (pose: the official demo's JSON).
    frame_log: type[FrameLog] | None = None
    # For videos: options that only frames in order use, and what follows the frames (pose: tracking).
    video_options: tuple[Option, ...] = ()
    frame_follower: type[FrameFollower] | None = None
    # A 3-D view of each result: its title, and view(prediction, directory, stem) writing the file shown.
    viewer_title: str | None = None
    view: Callable[[Prediction, Path, str], Path] | None = None
    # For tables of results (one row per photo): the prediction as named numbers and arrays.
    columns: Callable[[TaskResult], Mapping[str, Any]] | None = None

    @property
    def options(self) -> tuple[Option, ...]:
        """The options its `options_type` declares, in order: the app's controls, the command line's flags."""
        return declared(self.options_type)

    @property
    def repos(self) -> dict[str, str]:
        """Official checkpoint repo id per model size, smallest first."""
        return {size: self.kind.repo_id(size) for size in self.kind.sizes}

    @property
    def picture_titles(self) -> tuple[str, ...]:
        return tuple(picture.title for picture in self.pictures)

    @property
    def export_suffixes(self) -> tuple[str, ...]:
        """The files its exports may write, after the photo's stem, as their writers name them."""
        return tuple(export.suffix for export in self.exports)

    @property
    def export_kinds(self) -> tuple[str, ...]:
        """File types of the exports: "json", "png", "npy", "ply", "glb"."""
        return tuple(dict.fromkeys(export.kind for export in self.exports))

    def chosen_exports(
        self, values: Mapping[str, Any] | TaskOptions, kinds: Iterable[str] | None = None
    ) -> tuple[Export, ...]:
        """The exports a run with the option `values` writes (its options, or given by name: options of other
        tasks are left out, the missing ones take their defaults), of the file types `kinds` (None: every
        type)."""
        options = self.own_options(values)
        kinds = None if kinds is None else set(kinds)
        return tuple(
            export
            for export in self.exports
            if export.wanted(options) and (kinds is None or export.kind in kinds)
        )

    def exports_for(
        self, values: Mapping[str, Any] | TaskOptions, kinds: Iterable[str] | None = None
    ) -> tuple[str, ...]:
        """The suffixes of `chosen_exports`."""
        return tuple(export.suffix for export in self.chosen_exports(values, kinds))

    def own_options(self, values: Mapping[str, Any] | TaskOptions) -> TaskOptions:
        """This task's options: `values` when they are already, else from `values` by name, which may name
        other tasks' options too (left out) and hold None for an option not given (its default)."""
        if type(values) is self.options_type:
            return values
        if isinstance(values, TaskOptions):
            values = values.by_name()
        names = {option.name for option in self.options}
        return self.checked_options({k: v for k, v in values.items() if k in names and v is not None})

    def repo_id(self, size: str | None) -> str:
        """The checkpoint for `size` (default: the task's default size); unknown sizes are refused."""
        size = size or self.default_size
        if not isinstance(size, str) or not size.isprintable() or len(size) > 16:
            raise RequestError(f"Option 'size' must be one of {', '.join(self.repos)}, not {shown(size)}.")
        if size not in self.repos:
            raise RequestError(f"{self.title} has no {size} model; choose one of {', '.join(self.repos)}.")
        return self.repos[size]

    def size_or_default(self, size: Any) -> str:
        """`size` when this task has a model of that size, else the task's default size."""
        if size is not None and not isinstance(size, str):
            raise RequestError(f"Option 'size' must be a model size such as 0.4b or 1b, not {shown(size)}.")
        return size if size in self.repos else self.default_size

    def options_on(self, device: torch.device | str) -> tuple[Option, ...]:
        """The task's options with the defaults that depend on the device settled for `device`."""
        return tuple(option.on_device(device) for option in self.options)

    def checked_options(self, values: Mapping[str, Any], device: torch.device | str = "cpu") -> TaskOptions:
        """The task's options (its `options_type`), from `values` by name where given, else each default for
        models running on `device` (the CPU unless given); unknown names refused."""
        return checked(self.options_type, self.title, values, device)

    def coerce_options(self, values: Mapping[str, Any], device: torch.device | str = "cpu") -> dict[str, Any]:
        """`checked_options` by name."""
        return self.checked_options(values, device).by_name()

    def coerce_video_options(
        self, values: Mapping[str, Any], device: torch.device | str = "cpu"
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The task's options and its video options, each from `values` (which may hold both) where given,
        else their defaults; unknown names refused."""
        videos = tuple(option.on_device(device) for option in self.video_options)
        every = coerced(self.title, (*self.options_on(device), *videos), values)
        # A task option offered for videos too (pose's keypoint files) stays a task option.
        plain_names = {option.name for option in self.options}
        plain = {name: value for name, value in every.items() if name in plain_names}
        return plain, {name: value for name, value in every.items() if name not in plain_names}

    @property
    def all_options(self) -> tuple[Option, ...]:
        """The task's options, then its video options."""
        names = {option.name for option in self.options}
        return (*self.options, *(option for option in self.video_options if option.name not in names))

    def run(
        self, context: PipelineContext, images: Sequence[LoadedImage], given: Given | None = None
    ) -> list[TaskResult]:
        """One result per photo, in order, every step run here; `given`: values each photo starts with."""
        return self.pipeline.run(context, images, given)

    def helper_repo_id(self, repo_id: str) -> str | None:
        """The helper model paired with `repo_id` (same size, else the helper's smallest, as for a checkpoint
        given by path), if the task uses one."""
        if self.helper is None:
            return None
        size = next((s for s, r in self.repos.items() if r == repo_id), None)
        return self.helper.repo_id(size if size in self.helper.sizes else self.helper.sizes[0])

    def repo_ids_needed(self, size: str | None) -> list[str]:
        """Checkpoints a run at `size` with default options may load."""
        repo_id = self.repo_id(size)
        helper = self.helper_repo_id(repo_id)
        return [repo_id] + ([helper] if helper else [])

    def approx_download_gb(self, repo_id: str) -> str:
        """A rough download size for messages when the Hub cannot be asked."""
        official = official_checkpoint(repo_id)
        if official is None:
            return "an unknown amount"
        return f"{parameter_count(*official) * 4 / 1e9:.1f} GB"


@functools.cache
def parameter_count(kind: ModelKind, size: str) -> int:
    """Parameters of an official checkpoint, counted on a meta-device build of its preset."""
    from sapiens2.models.config import Sapiens2Config
    from sapiens2.models.modeling import build_model
    from sapiens2.models.presets import preset_config

    with torch.device("meta"):
        model = build_model(Sapiens2Config.from_dict(preset_config(size, kind.name)))
    return sum(p.numel() for p in model.parameters())


def official_checkpoint(repo_id: str) -> tuple[ModelKind, str] | None:
    """(kind, size) of an official repo id that a task or its helper runs; None for any other checkpoint."""
    kinds = {kind for task in TASKS.values() for kind in (task.kind, task.helper) if kind is not None}
    return next(((k, s) for k in kinds for s in k.sizes if k.repo_id(s) == repo_id), None)


def model_bytes_estimate(repo_id: str, dtype: torch.dtype) -> int | None:
    """Memory an official checkpoint takes at `dtype`; None for checkpoints that are not official repos."""
    official = official_checkpoint(repo_id)
    return None if official is None else parameter_count(*official) * dtype.itemsize


def all_sizes(tasks: Iterable[Task]) -> list[str]:
    """Every model size of `tasks`, smallest first."""
    return smallest_first(size for task in tasks for size in task.repos)


def smallest_first(sizes: Iterable[str]) -> list[str]:
    """Model sizes ("0.4b", "1b", ...) once each, smallest first."""
    return sorted(set(sizes), key=lambda size: (float(size.split("b")[0]), size))


def _option(options: Sequence[Option], name: str) -> Option:
    return next(option for option in options if option.name == name)


def _build_registry() -> dict[str, Task]:
    from sapiens2.outputs.exports import ALPHA, CUTOUT
    from sapiens2.pipelines import (
        depth,
        features,
        matting,
        normals,
        pose,
        pose_motion,
        pose_tracking,
        segment,
    )

    tasks = [
        Task(
            "pose",
            "Pose",
            "308 keypoints per person: body, face and hands, on top of a person detector.",
            POSE,
            "0.4b",
            pose.PoseOptions,
            (
                Picture("Keypoints", "_pose", pose.draw_keypoints),
                Picture(
                    "ControlNet pose",
                    pose.CONTROLNET_SUFFIX,
                    pose.draw_controlnet,
                    same_as=f"{pose.CONTROLNET_SUFFIX}.png",
                    in_videos=True,
                ),
            ),
            pose.EXPORTS,
            pose.PIPELINE,
            frame_log=pose.FramePoses,
            # The keypoint files are written for every frame of a video too.
            video_options=(
                *pose_tracking.VIDEO_OPTIONS,
                pose_motion.MOTION,
                _option(declared(pose.PoseOptions), "keypoint_format"),
            ),
            frame_follower=pose_tracking.PoseTracker,
            columns=pose.columns,
        ),
        Task(
            "segment",
            "Body parts",
            "29 body-part classes for every pixel.",
            SEG,
            "0.4b",
            segment.SegmentOptions,
            (
                Picture("Body parts", "_segmentation_overlay", segment.draw_overlay),
                Picture("Legend", "_segmentation_legend", segment.draw_legend),
                Picture("Mask", segment.MASK_SUFFIX, segment.draw_mask, same_as=f"{segment.MASK_SUFFIX}.png"),
                Picture(
                    "Cut-out",
                    "_parts_cutout_on_checkerboard",
                    segment.draw_cutout,
                    same_as=f"{segment.CUTOUT_SUFFIX}.png",
                ),
            ),
            segment.EXPORTS,
            segment.PIPELINE,
            columns=segment.columns,
        ),
        Task(
            "normals",
            "Normals",
            "Surface normals of the people in the photo.",
            NORMAL,
            "0.4b",
            segment.BackgroundOptions,
            (Picture("Normals", "_normals", normals.draw),),
            normals.EXPORTS,
            normals.PIPELINE,
            helper=SEG,
            helper_option="remove_background",
        ),
        Task(
            "depth",
            "Depth",
            "Per-pixel 3D points (pointmap), shown as depth and as a mesh; the camera they imply.",
            POINTMAP,
            "0.4b",
            depth.DepthOptions,
            (Picture("Depth", "_depth", depth.draw),),
            depth.EXPORTS,
            depth.PIPELINE,
            helper=SEG,
            helper_option="remove_background",
            viewer_title="Mesh (a preview of at most 200,000 faces; the full mesh is in Downloads)",
            view=depth.view,
        ),
        Task(
            "matting",
            "Matting",
            "Alpha matte and foreground colours: cut people out of the photo.",
            MATTING,
            "1b",
            matting.MattingOptions,
            (
                Picture("Alpha", ALPHA, matting.draw_alpha, same_as=f"{ALPHA}.png"),
                Picture("Cut-out", "_cutout_on_checkerboard", matting.draw_cutout, same_as=f"{CUTOUT}.png"),
                Picture(
                    "Composite", matting.COMPOSITE, matting.draw_composite, same_as=f"{matting.COMPOSITE}.png"
                ),
            ),
            matting.EXPORTS,
            matting.PIPELINE,
        ),
        Task(
            "features",
            "Features",
            "Pretrained backbone: patch features (PCA colours) and the CLS embedding. 1b-4k is the 4K "
            "backbone at its native 4096x3072: about 4.5 GiB of GPU memory in bf16; on the CPU 8.5 GiB of "
            "RAM and minutes per photo.",
            PRETRAIN,
            "0.1b",
            TaskOptions,
            (Picture("Features (PCA)", "_features_pca", features.draw),),
            features.EXPORTS,
            features.PIPELINE,
            in_overview=False,
            columns=features.columns,
        ),
    ]
    return {task.name: task for task in tasks}


TASKS: dict[str, Task] = _build_registry()
ALL_TASKS: tuple[str, ...] = tuple(name for name, task in TASKS.items() if task.in_overview)


def options_by_name() -> dict[str, tuple[Option, list[str]]]:
    """Every task option (video options included) by name, with the tasks that take it (an option shared by
    tasks appears once)."""
    options: dict[str, tuple[Option, list[str]]] = {}
    for task in TASKS.values():
        for option in task.all_options:
            options.setdefault(option.name, (option, []))[1].append(task.name)
    return options


def video_options() -> dict[str, tuple[Option, list[str]]]:
    """Every task's video options by name, with the tasks that take them."""
    names = {option.name for task in TASKS.values() for option in task.video_options}
    return {name: entry for name, entry in options_by_name().items() if name in names}


def get_task(name: str) -> Task:
    """The registered task called `name`."""
    if isinstance(name, str) and name in TASKS:
        return TASKS[name]
    raise RequestError(f"Option 'task' must be one of {', '.join(TASKS)}, not {shown(name)}.")


def other_names() -> dict[str, str]:
    """The one mapping between the two vocabularies: each task's checkpoints' name (the kind in
    `facebook/sapiens2-<kind>-<size>`: seg, normal, pointmap, pretrain) to the task's name, where they differ.
    The package speaks of tasks; kind names appear only in repo ids and original file names."""
    return {task.kind.name: task.name for task in TASKS.values() if task.kind.name != task.name}
