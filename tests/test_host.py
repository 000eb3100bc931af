"""The task runner holds one model host: the host's device, cache and forward are the runner's, and a
batch's model steps reach the host as plain, typed device work (the task's options and step values)."""

import numpy as np
import pytest

from sapiens2.pipelines.pose import PIPELINE as POSE
from sapiens2.pipelines.pose import PoseValues
from sapiens2.pipelines.segment import SegmentOptions, SegmentValues
from sapiens2.runtime import Host, Runtime
from sapiens2.runtime.boundary import DeviceWork
from sapiens2.vision.detector import Detections
from sapiens2.vision.images import load_image

PHOTO = np.random.default_rng(0).integers(0, 255, (120, 90, 3), dtype=np.uint8)


def test_the_runner_shows_its_hosts_device_cache_and_forward_as_its_own():
    runtime = Runtime(device="cpu", dtype="fp32", batch_size=3)
    host = runtime.host
    assert isinstance(host, Host) and not isinstance(host, Runtime)
    assert runtime.device is host.device and runtime.cache is host.cache and runtime.batch_size == 3
    assert (runtime.device_label, runtime.dtype_label) == ("cpu", "fp32")

    def counted(model, pixel_values, **kwargs):
        raise AssertionError("not called here")

    runtime.forward = counted  # swapped on the runner: the forward pipelines call through the host
    assert host.forward is counted and runtime.forward is counted
    shared = Runtime(host=host)
    assert shared.host is host and shared.cache is runtime.cache


def test_a_photo_starts_with_its_tasks_values_given_by_name():
    image = load_image(PHOTO)
    boxes = Detections(np.array([[1, 2, 30, 40]], dtype=np.float32), np.array([0.5], np.float32), found=1)
    photo = POSE.photo(image, {"given_boxes": boxes})
    assert isinstance(photo.values, PoseValues) and photo.values.given_boxes is boxes
    assert photo.values.detections is None
    with pytest.raises(TypeError):
        POSE.photo(image, {"given_box": boxes})  # a misspelt value is refused, not carried unread


@pytest.fixture()
def small_checkpoints(small_mirror, monkeypatch):
    monkeypatch.setenv("SAPIENS2_CHECKPOINT_DIR", str(small_mirror))


def test_the_model_steps_reach_the_host_as_plain_typed_work(small_checkpoints, monkeypatch):
    runtime = Runtime(device="cpu", dtype="fp32")
    seen: list[DeviceWork] = []
    run_work = runtime.host.run_work

    def recorded(work: DeviceWork, portable: bool = False):
        seen.append(work)
        return run_work(work, portable)

    monkeypatch.setattr(runtime.host, "run_work", recorded)
    result = runtime.run("segment", PHOTO, parts="hands", pictures=False)
    [work] = seen
    assert (work.task, work.first_step, work.count) == ("segment", 2, 1)
    assert isinstance(work.options, SegmentOptions) and work.options.parts == ("hands",)
    values = work.photos[0].values
    assert isinstance(values, SegmentValues) and values.input is None  # the forward took its input
    assert values.labels.shape == PHOTO.shape[:2] and values.part_ids
    assert result.options is work.options and result.pictures == []
