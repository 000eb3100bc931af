"""Fine-tuned checkpoints offered beside a task's official sizes: folders named with `--model TASK=PATH`, and
the checkpoint folders under `--checkpoint-dir` that are not official repos (a `sapiens2 train` output such
as `runs/pose/final` copied there, say). Each becomes a choice named after its folder in its task's list:
never a path of the server, which every visitor of the page would see.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from sapiens2.errors import ConfigError
from sapiens2.models.hub import CONFIG_NAME
from sapiens2.models.kinds import KINDS
from sapiens2.tasks.registry import TASKS, get_task

Choices = dict[str, dict[str, str]]  # task name -> {choice label: checkpoint folder}


def _architecture(folder: Path) -> str | None:
    try:
        return (json.loads((folder / CONFIG_NAME).read_text()).get("architectures") or [None])[0]
    except (OSError, ValueError, AttributeError):
        return None


def _official(relative: Path) -> bool:
    return any(relative.as_posix() == kind.repo_id(size) for kind in KINDS.values() for size in kind.sizes)


def parse_model_flag(text: str) -> tuple[str, Path]:
    """`TASK=PATH` of a --model flag, checked: the task exists and PATH is a checkpoint folder of it."""
    task_name, separator, path = text.partition("=")
    if not separator or not path:
        raise ConfigError(f"--model {text!r}: expected TASK=PATH, such as pose=runs/pose/final")
    try:
        task = get_task(task_name)
    except ValueError as error:
        raise ConfigError(f"--model {text!r}: {error}") from None
    folder = Path(path).expanduser()
    architecture = _architecture(folder)
    if architecture is None:
        raise ConfigError(
            f"--model {text!r}: {folder} is not a checkpoint folder (no readable {CONFIG_NAME})"
        )
    if architecture != task.kind.architecture:
        raise ConfigError(
            f"--model {text!r}: {folder} holds a {architecture}, not a {task.kind.architecture}"
        )
    return task.name, folder


def short_names(folders: Sequence[Path]) -> list[str]:
    """A name for each folder: its last part, or more of its path where two would share a name. A
    `sapiens2 train` output, OUT/final, is named with its run folder (`pose_run/final`), not `final` alone."""

    def tail(folder: Path, parts: int) -> str:
        return "/".join(folder.parts[-parts:]).lstrip("/")

    least = [2 if folder.name == "final" and len(folder.parts) > 2 else 1 for folder in folders]
    names = [tail(folder, parts) for folder, parts in zip(folders, least, strict=True)]
    # Distinct folders differ somewhere, so taking one more part of each shared name ends.
    while len(set(names)) < len(names):
        repeated = {name for name in names if names.count(name) > 1}
        for index, folder in enumerate(folders):
            if names[index] in repeated:
                least[index] = min(least[index] + 1, len(folder.parts))
                names[index] = tail(folder, least[index])
    return names


def local_choices(checkpoint_dir: Path | None, model_flags: Sequence[str] = ()) -> Choices:
    """Each task's extra choices: `--model TASK=PATH` folders, then non-official checkpoints found up to
    two folders deep under `checkpoint_dir`, labelled by their folder (path under the directory)."""
    choices: Choices = {name: {} for name in TASKS}
    flagged: dict[str, list[Path]] = {name: [] for name in TASKS}
    for text in model_flags:
        task, folder = parse_model_flag(text)
        if folder.resolve() not in flagged[task]:
            flagged[task].append(folder.resolve())
    for task, folders in flagged.items():
        choices[task].update(zip(short_names(folders), map(str, folders), strict=True))
    if checkpoint_dir is not None and checkpoint_dir.is_dir():
        configs = sorted(
            [*checkpoint_dir.glob(f"*/{CONFIG_NAME}"), *checkpoint_dir.glob(f"*/*/{CONFIG_NAME}")]
        )
        for config in configs:
            folder = config.parent
            relative = folder.relative_to(checkpoint_dir)
            if _official(relative):
                continue
            for task in TASKS.values():
                if task.kind.architecture == _architecture(folder):
                    choices[task.name].setdefault(relative.as_posix(), str(folder.resolve()))
    for task, labels in choices.items():
        clashes = set(labels) & set(TASKS[task].repos)
        if clashes:
            raise ConfigError(f"checkpoint folders named like a model size: {', '.join(sorted(clashes))}")
    return {task: labels for task, labels in choices.items() if labels}
