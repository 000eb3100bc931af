"""Checkpoints in the official layout: config.json, model.safetensors and preprocessor_config.json, so that a
folder loads with `sapiens2.from_pretrained`, transformers' `from_pretrained`, the command line's --model and
the app; training checkpoints add the optimizer and schedule state to resume from.

Every folder is written under a temporary name and renamed into place, so a folder that exists is whole;
only the last `keep` checkpoint-N folders are kept.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from sapiens2.errors import TrainingError
from sapiens2.models.hub import CONFIG_NAME, PROCESSOR_CONFIG_NAME, WEIGHTS_NAME
from sapiens2.vision.processing import ProcessorSettings

STATE_NAME = "optimizer.safetensors"
SCHEDULE_NAME = "optimizer.json"
TRAINER_STATE_NAME = "trainer_state.json"
FINAL_NAME = "final"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def processor_config(settings: ProcessorSettings) -> dict[str, Any]:
    """The preprocessor_config.json of a model trained at `settings`."""
    return {
        "image_processor_type": "Sapiens2ImageProcessor",
        "do_resize": True,
        "size": {"height": settings.height, "width": settings.width},
        "do_pad": settings.do_pad,
        "do_rescale": settings.do_rescale,
        "rescale_factor": settings.rescale_factor,
        "do_normalize": settings.do_normalize,
        "image_mean": list(settings.image_mean),
        "image_std": list(settings.image_std),
    }


def write_model(
    directory: Path, model: nn.Module, config: dict[str, Any], settings: ProcessorSettings
) -> None:
    """config.json, model.safetensors (float32) and preprocessor_config.json of `model` into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        name: tensor.detach().to("cpu", torch.float32).contiguous()
        for name, tensor in model.state_dict().items()
    }
    save_file(state, directory / WEIGHTS_NAME, metadata={"format": "pt"})
    config = {**config, "dtype": "float32"}
    (directory / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (directory / PROCESSOR_CONFIG_NAME).write_text(json.dumps(processor_config(settings), indent=2) + "\n")


def write_atomically(target: Path, write) -> Path:
    """Call `write(folder)` on a temporary folder beside `target`, then move it to `target` (replacing it)."""
    temporary = target.parent / f".{target.name}.tmp-{secrets.token_hex(4)}"
    try:
        write(temporary)
        if target.exists():
            old = target.parent / f".{target.name}.old-{secrets.token_hex(4)}"
            os.replace(target, old)
            os.replace(temporary, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(temporary, target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return target


def save_checkpoint(
    out: Path,
    step: int,
    model: nn.Module,
    config: dict[str, Any],
    settings: ProcessorSettings,
    training_state: dict[str, Any],
    trainer_state: dict[str, Any],
    keep: int,
) -> Path:
    """out/checkpoint-<step>/: the model files plus the state to resume from; older ones beyond `keep` go."""

    def write(folder: Path) -> None:
        write_model(folder, model, config, settings)
        write_training_state(folder, training_state)
        (folder / TRAINER_STATE_NAME).write_text(json.dumps(trainer_state, indent=2) + "\n")

    path = write_atomically(out / f"checkpoint-{step}", write)
    for old in checkpoints(out)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def save_final(out: Path, model: nn.Module, config: dict[str, Any], settings: ProcessorSettings) -> Path:
    """out/final/: the trained model alone, the folder to give to --model or the app."""
    return write_atomically(out / FINAL_NAME, lambda folder: write_model(folder, model, config, settings))


def checkpoints(out: Path) -> list[Path]:
    """The complete checkpoint-N folders of a run, oldest first."""
    if not out.is_dir():
        return []
    found = [(int(m[1]), p) for p in out.iterdir() if (m := _CHECKPOINT.fullmatch(p.name)) and p.is_dir()]
    return [path for _, path in sorted(found) if (path / TRAINER_STATE_NAME).is_file()]


def resume_folder(path: Path) -> Path:
    """The checkpoint to resume from: `path` itself when it is one, else the latest of the run folder."""
    if (path / TRAINER_STATE_NAME).is_file():
        folder = path
    else:
        found = checkpoints(path)
        if not found:
            raise TrainingError(
                f"--resume {path}: no checkpoint there. Give the --out folder of an earlier `sapiens2 train` "
                "run (holding checkpoint-N folders) or one of its checkpoint-N folders."
            )
        folder = found[-1]
    names = (STATE_NAME, SCHEDULE_NAME, WEIGHTS_NAME, CONFIG_NAME)
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise TrainingError(f"--resume {folder}: incomplete checkpoint, {', '.join(missing)} missing")
    return folder


def read_trainer_state(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / TRAINER_STATE_NAME).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise TrainingError(f"--resume {folder}: cannot read {TRAINER_STATE_NAME} ({error})") from None


def write_training_state(folder: Path, state: dict[str, Any]) -> None:
    """The optimizer's and the schedule's state: tensors in optimizer.safetensors, the rest in JSON (no
    pickle, like every file this package reads)."""
    tensors, structure = {}, {"step": state["step"], "scheduler": state["scheduler"]}
    optimizer = state["optimizer"]
    structure["param_groups"] = optimizer["param_groups"]
    structure["state"] = {}
    for index, values in optimizer["state"].items():
        structure["state"][str(index)] = {}
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                structure["state"][str(index)][name] = value
    save_file(tensors, folder / STATE_NAME)
    (folder / SCHEDULE_NAME).write_text(json.dumps(structure) + "\n")


def read_training_state(folder: Path) -> dict[str, Any]:
    """What `write_training_state` wrote, as {"optimizer", "scheduler", "step"}."""
    try:
        structure = json.loads((folder / SCHEDULE_NAME).read_text())
        tensors = load_file(folder / STATE_NAME)
    except Exception as error:
        raise TrainingError(
            f"--resume {folder}: cannot read {STATE_NAME} / {SCHEDULE_NAME} ({error})"
        ) from None
    state = {int(index): dict(values) for index, values in structure["state"].items()}
    for key, tensor in tensors.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = tensor
    optimizer = {"state": state, "param_groups": structure["param_groups"]}
    return {"optimizer": optimizer, "scheduler": structure["scheduler"], "step": structure["step"]}
