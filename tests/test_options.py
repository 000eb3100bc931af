"""Each task's options are one typed class: the declared options derive from it, values are checked into it
once, and pipelines, pictures and exports read it by attribute."""

import dataclasses
import pickle

import pytest

from sapiens2.errors import RequestError
from sapiens2.outputs.results import TaskOptions
from sapiens2.pipelines.options import checked, declared
from sapiens2.pipelines.pose import PoseOptions
from sapiens2.pipelines.segment import BackgroundOptions
from sapiens2.tasks.registry import TASKS, get_task


@pytest.mark.parametrize("task", list(TASKS))
def test_a_tasks_options_are_its_classs_fields_in_order(task):
    entry = get_task(task)
    assert issubclass(entry.options_type, TaskOptions)
    fields = [field.name for field in dataclasses.fields(entry.options_type)]
    assert [option.name for option in entry.options] == fields
    options = entry.checked_options({})
    assert type(options) is entry.options_type
    assert options.by_name() == entry.coerce_options({})  # the names the app, CLI and API use, unchanged
    assert pickle.loads(pickle.dumps(options)) == options


def test_values_are_checked_once_into_attributes_and_a_misspelt_name_is_no_attribute():
    pose = get_task("pose")
    options = pose.checked_options({"threshold": "0.5", "keypoint_format": "coco17"}, "cpu")
    assert options.threshold == 0.5 and options.flip_test is False and options.show_boxes is True
    assert options.keypoint_format == ("sapiens308", "coco17")
    with pytest.raises(AttributeError):
        options.treshold  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.threshold = 0.9
    with pytest.raises(RequestError, match="no option 'treshold'"):
        pose.checked_options({"treshold": 0.5})
    assert pose.checked_options({}, "cuda").flip_test is True  # a default by device, settled once


def test_own_options_takes_the_tasks_options_as_they_are_or_by_name_among_others():
    depth = get_task("depth")
    given = depth.checked_options({"smooth": False})
    assert depth.own_options(given) is given
    assert depth.own_options({"smooth": False, "threshold": 0.1, "remove_background": None}) == given
    assert isinstance(given, BackgroundOptions) and given.remove_background is True
    # Another task's options count by name: only this task's are kept.
    assert get_task("normals").own_options(given).by_name() == {"remove_background": True}


def test_checked_and_declared_work_on_any_options_class():
    assert declared(TaskOptions) == () and checked(TaskOptions, "Features", {}) == TaskOptions()
    names = [option.name for option in declared(PoseOptions)]
    assert names == ["threshold", "flip_test", "show_boxes", "keypoint_format"]
    with pytest.raises(RequestError, match="Features has no option"):
        checked(TaskOptions, "Features", {"opacity": 1})
