"""A task's model as an ONNX file, with a JSON file beside it holding what its pre- and post-processing need
(input size, normalization, labels): `sapiens2 export TASK`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sapiens2.errors import ConfigError
from sapiens2.models import hub
from sapiens2.models.kinds import KINDS, ModelKind
from sapiens2.models.onnx_export import BATCH, INPUT_NAME, OPSET, export_onnx
from sapiens2.runtime.host import Host
from sapiens2.tasks import TASKS, get_task
from sapiens2.vision.processing import ProcessorSettings


def export_kind(name: str) -> ModelKind:
    """The model kind of a task name (pose, segment, ...) or of a kind name (seg, pointmap, pretrain, ...)."""
    if name.lower() in KINDS:
        return KINDS[name.lower()]
    return get_task(name).kind


def export_names() -> list[str]:
    """Every name `export_kind` accepts: the tasks' and the model kinds'."""
    return sorted({*TASKS, *KINDS})


def default_repo(kind: ModelKind) -> str:
    """The official repo of the task that runs `kind`, at that task's default size."""
    task = next(task for task in TASKS.values() if task.kind is kind)
    return task.repos[task.default_size]


def export_task(name: str, out: str | os.PathLike[str], model: str | None = None) -> tuple[Path, Path]:
    """Write the model of task `name` (`model`: a repo id, folder or file; default the task's default one)
    to `out` (FILE.onnx) in float32 at its preprocessor's input size, and FILE.json beside it; returns the
    two paths."""
    kind = export_kind(name)
    repo_id = model or default_repo(kind)
    host = Host(device="cpu", dtype="fp32")
    torch_model = host.model(repo_id)
    config = torch_model.config
    if config.architecture != kind.architecture:
        raise ConfigError(
            f"{hub.display_name(repo_id)} is a {config.architecture}, not the {kind.architecture} of {name}"
        )
    settings = host.settings(repo_id, kind)
    out = Path(out)
    exported = export_onnx(torch_model, out, settings.size)
    description = {
        "model": hub.display_name(repo_id),
        "architecture": config.architecture,
        "task": kind.name,
        "opset": OPSET,
        "weights": out.name + ".data" if out.with_name(out.name + ".data").exists() else out.name,
        "input": {"name": INPUT_NAME, "shape": [BATCH, 3, *settings.size], "dtype": "float32"},
        "preprocessing": preprocessing(settings),
        "outputs": [{"name": key, "shape": [BATCH, *shape]} for key, shape in exported.shapes.items()],
        **labels(kind, config),
    }
    described = out.with_suffix(".json")
    described.write_text(json.dumps(description, indent=1) + "\n", encoding="utf-8")
    return out, described


def preprocessing(settings: ProcessorSettings) -> dict[str, Any]:
    """How an RGB photo becomes `pixel_values`, in transformers' Sapiens2ImageProcessor's terms."""
    return {
        "size": {"height": settings.height, "width": settings.width},
        "resize": "keep the aspect ratio, pad with black symmetrically" if settings.do_pad else "stretch",
        "do_pad": settings.do_pad,
        "do_rescale": settings.do_rescale,
        "rescale_factor": settings.rescale_factor,
        "do_normalize": settings.do_normalize,
        "image_mean": list(settings.image_mean),
        "image_std": list(settings.image_std),
        "channels": "RGB",
        "layout": "NCHW",
    }


def labels(kind: ModelKind, config: Any) -> dict[str, Any]:
    """The names of the output channels where they mean something (keypoints, body parts), and pose's flip
    pairs (for a flip test: swap them and mirror the heatmaps of the mirrored crop)."""
    if kind.name not in ("pose", "seg"):
        return {}
    found = {"id2label": {str(index): label for index, label in sorted(config.id2label.items())}}
    if kind.name == "pose" and config.flip_pairs:
        found["flip_pairs"] = [list(pair) for pair in config.flip_pairs]
    return found
