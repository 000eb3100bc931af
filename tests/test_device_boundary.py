"""The device boundary carries plain data: every task's work and outcome survive multiprocessing's pickler,
the results are those of the plain path, and cancelling reaches a forked process through shared memory."""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch

from sapiens2.runtime import Runtime
from sapiens2.runtime.boundary import CANCEL_FLAGS, DeviceOutcome, DeviceWork, run_device_work
from sapiens2.runtime.jobs import Job
from sapiens2.serving import zerogpu
from sapiens2.tasks import TASKS

PHOTO = np.random.default_rng(0).integers(0, 255, (120, 90, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def runtimes(small_mirror, few_persons_yolo, monkeypatch_module):
    monkeypatch_module.setenv("SAPIENS2_CHECKPOINT_DIR", str(small_mirror))
    plain = Runtime(device="cpu", dtype="fp32", detector=few_persons_yolo)
    crossing = Runtime(device="cpu", dtype="fp32", detector=few_persons_yolo)
    seen: list[tuple[DeviceWork, DeviceOutcome]] = []

    def through_pickles(work: DeviceWork) -> DeviceOutcome:
        arrived = ForkingPickler.loads(ForkingPickler.dumps(work))
        outcome = ForkingPickler.loads(ForkingPickler.dumps(run_device_work(crossing, arrived)))
        seen.append((arrived, outcome))
        return outcome

    crossing.device_boundary = through_pickles
    return plain, crossing, seen


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.parametrize("task", list(TASKS))
def test_every_tasks_work_and_outcome_pickle_and_give_the_plain_result(runtimes, task):
    plain, crossing, seen = runtimes
    before = len(seen)
    expected = plain.run(task, PHOTO)
    result = crossing.run(task, PHOTO)
    assert len(seen) == before + 1
    assert result.summary == expected.summary and result.notes == expected.notes
    for (title, picture), (_, reference) in zip(result.pictures, expected.pictures, strict=True):
        assert np.array_equal(picture, reference), title


def test_pose_boxes_given_to_a_frame_cross_the_boundary_and_replace_the_detector(runtimes):
    from sapiens2.vision.detector import Detections

    plain, crossing, seen = runtimes
    before = len(seen)
    boxes = Detections(np.array([[10, 20, 50, 80]], dtype=np.float32), np.array([0.9], np.float32), found=1)
    expected = plain.run("pose", PHOTO, given={"given_boxes": boxes})
    result = crossing.run("pose", PHOTO, given={"given_boxes": boxes})
    assert len(seen) == before + 1  # the boxes went with the photo, pickled, to the device side
    assert [person.box.tolist() for person in result.prediction.persons] == [[10, 20, 50, 80]]
    assert np.array_equal(result.pictures[0][1], expected.pictures[0][1])


def test_an_error_on_the_device_side_comes_back_and_is_raised_by_the_caller(runtimes):
    _, crossing, _ = runtimes
    with pytest.raises(Exception, match="sapiens2-pose-1b"):
        crossing.run("pose", PHOTO, size="1b")  # no such checkpoint in the mirror
    assert crossing.run("pose", PHOTO).persons  # and the next call is served


def _wait_for_flag(ticket: int, answers) -> None:
    job = CANCEL_FLAGS.job(ticket)
    deadline = time.monotonic() + 20
    while not job.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    answers.put(job.cancelled)


def test_a_cancel_reaches_a_forked_worker_through_the_shared_flag():
    context = multiprocessing.get_context("fork")
    answers = context.SimpleQueue()
    job = Job()
    with CANCEL_FLAGS.watching(job) as ticket:
        child = context.Process(target=_wait_for_flag, args=(ticket, answers))
        child.start()
        job.cancel()
        assert answers.get() is True
        child.join(10)
    assert child.exitcode == 0


def test_a_calls_duration_grows_with_its_work_and_stays_within_bounds(monkeypatch):
    runtime = Runtime(device="cpu", dtype="bf16")
    for repo_id in ("facebook/sapiens2-seg-0.4b", "facebook/sapiens2-normal-0.4b"):
        runtime.cache.keep(repo_id)
    monkeypatch.setattr(zerogpu, "_runtime", runtime)
    monkeypatch.setattr(zerogpu, "_measured", zerogpu._Measured())

    def work(task: str, repo_id: str, photos: int) -> DeviceWork:
        return DeviceWork(task, repo_id, {}, 0, [None] * photos)  # type: ignore[list-item]

    one = zerogpu.duration_for(work("normals", "facebook/sapiens2-normal-0.4b", 1))
    assert zerogpu.SHORTEST <= one <= zerogpu.LONGEST
    many = zerogpu.duration_for(work("normals", "facebook/sapiens2-normal-0.4b", 300))
    assert many > one
    # A model not kept loaded costs its reading time; a 5b one in bf16 (about 10 GB) at least 10 s more.
    loading = zerogpu.duration_for(work("normals", "facebook/sapiens2-normal-5b", 1))
    assert loading >= one + 2 * 10
    assert zerogpu.duration_for(work("normals", "facebook/sapiens2-normal-5b", 10_000)) == zerogpu.LONGEST
    # Once a call was measured on this Space, the measured per-photo time is used.
    zerogpu._measured.seconds["facebook/sapiens2-normal-0.4b"] = 2.0
    assert zerogpu.duration_for(work("normals", "facebook/sapiens2-normal-0.4b", 10)) == int(2 * (10 + 20))


def test_off_zerogpu_serving_changes_nothing():
    runtime = Runtime(device="cpu")
    hosting = zerogpu.serve(runtime)
    assert runtime.device_boundary is None and hosting.live_unavailable is None and not runtime.resident
    assert torch.device("cpu") == runtime.device
