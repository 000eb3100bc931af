"""Training's tasks: each declared once as a recipe, found by the registry's name or its checkpoints', and no
code in training/ that branches on a task's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sapiens2.errors import TrainingError
from sapiens2.tasks.registry import TASKS as REGISTRY
from sapiens2.tasks.registry import other_names
from sapiens2.training.tasks import RECIPES, TASKS, get_training_task

TRAINING = Path(__file__).resolve().parents[1] / "sapiens2" / "training"
NAMES = set(REGISTRY) | {task.kind.name for task in REGISTRY.values()}


def test_the_checkpoints_names_map_to_the_tasks_in_one_place():
    assert other_names() == {
        "seg": "segment",
        "normal": "normals",
        "pointmap": "depth",
        "pretrain": "features",
    }
    for alias, name in other_names().items():
        assert REGISTRY[name].repo_id("0.4b" if name != "features" else "0.1b").split("-")[1] == alias


@pytest.mark.parametrize(
    "name", ["pose", "segment", "seg", "normals", "normal", "depth", "pointmap", "matting"]
)
def test_every_public_name_finds_its_task(name):
    assert get_training_task(name).name == other_names().get(name, name)


def test_every_trainable_task_is_a_registry_task_with_a_recipe():
    assert set(TASKS) == set(RECIPES) <= set(REGISTRY)
    assert [task.aliases for task in TASKS.values()] == [(), ("seg",), ("normal",), ("pointmap",), ()]
    with pytest.raises(
        TrainingError, match=r"No trainable task 'features'; choose one of pose, segment \(seg\)"
    ):
        get_training_task("features")


def test_only_pose_asks_the_dataset_for_its_labels():
    with pytest.raises(TrainingError, match="pose needs keypoints named by the dataset"):
        get_training_task("pose").default_labels()
    assert len(get_training_task("segment").default_labels().names) == 29
    assert get_training_task("depth").default_labels() == ("x", "y", "z")


def _named(node: ast.AST) -> bool:
    values = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return any(isinstance(value, ast.Constant) and value.value in NAMES for value in values)


def _compared_names(tree: ast.AST) -> list[int]:
    """Lines comparing something with a task's or a kind's name (== or != a name, in a tuple, list or set of
    names) or matching on one (a map's key, `"normals" in maps`, is no task name)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides, sides[1:], strict=False):
                equal = isinstance(op, (ast.Eq, ast.NotEq)) and (_named(left) or _named(right))
                if equal or (isinstance(op, (ast.In, ast.NotIn)) and _named(right)):
                    lines.append(node.lineno)
        elif isinstance(node, ast.Match):
            lines.append(node.lineno)
    return lines


def test_training_never_branches_on_a_task_name():
    found = {
        path.name: lines
        for path in sorted(TRAINING.glob("*.py"))
        if (lines := _compared_names(ast.parse(path.read_text())))
    }
    assert not found, f"declare the behaviour in the task's Recipe instead: {found}"
