"""The task registry: each task is declared once; the app, the command line and the tests all read it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .options import Option

Runner = Callable[..., list]

SIZES = ("0.4b", "0.8b", "1b", "5b")


def _repos(kind: str, sizes: tuple[str, ...] = SIZES) -> dict[str, str]:
    return {size: f"facebook/sapiens2-{kind}-{size}" for size in sizes}


@dataclass(frozen=True)
class Task:
    """One task: its checkpoints per size, its options, what it draws and what it exports."""

    name: str
    title: str
    description: str
    repos: Mapping[str, str]
    default_size: str
    options: tuple[Option, ...]
    picture_titles: tuple[str, ...]
    # The files its exports write, after the photo's stem: "_pose.json", "_points.ply", ...
    export_suffixes: tuple[str, ...]
    runner: Runner
    in_overview: bool = True
    # Another model some options use: the body-part model masking normals and depth.
    helper_repos: Mapping[str, str] | None = None
    helper_option: str | None = None

    @property
    def export_kinds(self) -> tuple[str, ...]:
        """File types of the exports: "json", "png", "npy", "ply"."""
        return tuple(dict.fromkeys(suffix.rsplit(".", 1)[-1] for suffix in self.export_suffixes))

    def repo_id(self, size: str | None) -> str:
        """The checkpoint for `size` (default: the task's default size); unknown sizes are refused."""
        size = size or self.default_size
        if size not in self.repos:
            raise ValueError(f"{self.title} has no {size} model; choose one of {', '.join(self.repos)}.")
        return self.repos[size]

    def coerce_options(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Every option of the task, from `values` where given, else its default; unknown names refused."""
        known = {option.name: option for option in self.options}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"{self.title} has no option {', '.join(unknown)}; it takes {', '.join(known)}.")
        return {name: option.coerce(values.get(name)) for name, option in known.items()}

    def run(self, runtime, images, repo_id: str, options: dict[str, Any], progress=None) -> list:
        return self.runner(runtime, self, images, repo_id, options, progress)

    def helper_repo_id(self, repo_id: str) -> str | None:
        """The body-part model paired with `repo_id` (same size, else the smallest, as for a checkpoint given
        by path), if the task uses one."""
        if not self.helper_repos:
            return None
        size = next((s for s, r in self.repos.items() if r == repo_id), None)
        return self.helper_repos.get(size) or next(iter(self.helper_repos.values()))

    def repo_ids_needed(self, size: str | None) -> list[str]:
        """Checkpoints a run at `size` with default options may load."""
        repo_id = self.repo_id(size)
        helper = self.helper_repo_id(repo_id)
        return [repo_id] + ([helper] if helper else [])

    def approx_download_gb(self, repo_id: str) -> str:
        """A rough download size for messages when the Hub cannot be asked."""
        return f"{parameter_count(repo_id) * 4 / 1e9:.1f} GB"


@functools.cache
def parameter_count(repo_id: str) -> int:
    """Parameters of an official checkpoint, counted on a meta-device build of its preset."""
    from .config import Sapiens2Config
    from .models import build_model
    from .presets import preset_config

    kind, size = repo_id.rsplit("/", 1)[-1].removeprefix("sapiens2-").split("-")
    with torch.device("meta"):
        model = build_model(Sapiens2Config.from_dict(preset_config(size, kind)))
    return sum(p.numel() for p in model.parameters())


def model_bytes_estimate(repo_id: str, dtype: torch.dtype) -> int | None:
    """Memory an official checkpoint takes at `dtype`; None for checkpoints that are not official repos."""
    try:
        return parameter_count(repo_id) * dtype.itemsize
    except Exception:
        return None


def model_vram_gib(repo_id: str) -> float:
    """Rough GPU memory to run a checkpoint in bf16 at 1024x768, batch 1: weights plus activations."""
    return parameter_count(repo_id) * 2 / 1024**3 + 1.5


def _build_registry() -> dict[str, Task]:
    from .pipelines import depth, features, matting, normals, pose, segment

    background = Option("remove_background", "Remove background (body-part model)", "checkbox", True)
    seg_repos = _repos("seg")
    tasks = [
        Task(
            "pose",
            "Pose",
            "308 keypoints per person: body, face and hands, on top of a person detector.",
            _repos("pose"),
            "0.4b",
            pose.OPTIONS,
            ("Keypoints",),
            ("_pose.json",),
            pose.run,
        ),
        Task(
            "segment",
            "Body parts",
            "29 body-part classes for every pixel.",
            seg_repos,
            "0.4b",
            segment.OPTIONS,
            ("Body parts", "Legend"),
            ("_segmentation.png", "_segmentation.npy"),
            segment.run,
        ),
        Task(
            "normals",
            "Normals",
            "Surface normals of the people in the photo.",
            _repos("normal"),
            "0.4b",
            (background,),
            ("Normals",),
            ("_normals.npy",),
            normals.run,
            helper_repos=seg_repos,
            helper_option="remove_background",
        ),
        Task(
            "depth",
            "Depth",
            "Per-pixel 3D points (pointmap), shown as depth and as a point cloud.",
            _repos("pointmap"),
            "0.4b",
            (background,),
            ("Depth",),
            ("_depth.npy", "_points.ply"),
            depth.run,
            helper_repos=seg_repos,
            helper_option="remove_background",
        ),
        Task(
            "matting",
            "Matting",
            "Alpha matte and foreground colours: cut people out of the photo.",
            {"1b": "facebook/sapiens2-matting-1b"},
            "1b",
            matting.OPTIONS,
            ("Alpha", "Cut-out", "Composite"),
            ("_alpha.png", "_cutout.png", "_composite.png"),
            matting.run,
        ),
        Task(
            "features",
            "Features",
            "Pretrained backbone: patch features (PCA colours) and the CLS embedding.",
            _repos("pretrain", ("0.1b", *SIZES)),
            "0.1b",
            (),
            ("Features (PCA)",),
            ("_cls.npy", "_patches.npy"),
            features.run,
            in_overview=False,
        ),
    ]
    return {task.name: task for task in tasks}


TASKS: dict[str, Task] = _build_registry()
ALL_TASKS: tuple[str, ...] = tuple(name for name, task in TASKS.items() if task.in_overview)


def get_task(name: str) -> Task:
    """The registered task called `name`."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"Unknown task {name!r}; choose one of {', '.join(TASKS)}.") from None
