"""All tasks on one photo (sapiens2.tasks.overview, Runtime.run_all): normals and depth mask their background
with the body-part task's labels instead of running the body-part model on the photo again, and mask exactly
as they do alone."""

import numpy as np
import pytest
from tiny_models import CentreBox, balance_background

from sapiens2.outputs.results import TaskResult
from sapiens2.runtime.runtime import Runtime
from sapiens2.tasks import get_task
from sapiens2.tasks.overview import values_from_earlier
from sapiens2.vision.images import load_image


@pytest.fixture(scope="module")
def runtime(tiny_mirror):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAPIENS2_CHECKPOINT_DIR", str(tiny_mirror))
        yield Runtime(device="cpu", detector=CentreBox())


@pytest.fixture(scope="module")
def photo():
    return load_image("assets/astronaut.png")


def forwards_of(model, calls: list) -> object:
    return model.register_forward_hook(lambda *_: calls.append(1))


def test_all_tasks_run_the_body_part_model_once_and_mask_as_each_task_does_alone(runtime, photo):
    balance_background(runtime, photo)
    body_parts = runtime.model(get_task("segment").repo_id(None))
    calls: list = []
    hook = forwards_of(body_parts, calls)
    try:
        results = {result.task: result for result in runtime.run_all(photo)}
    finally:
        hook.remove()
    assert len(calls) == 1
    labels = results["segment"].prediction.labels
    assert 0 < (labels == 0).sum() < labels.size
    alone = runtime.run("normals", photo).prediction.background
    np.testing.assert_array_equal(results["normals"].prediction.background, alone)
    np.testing.assert_array_equal(alone, labels == 0)
    np.testing.assert_array_equal(
        results["depth"].prediction.foreground, runtime.run("depth", photo).prediction.foreground
    )


def test_a_body_part_result_of_another_checkpoint_is_not_taken(runtime, photo):
    segment = runtime.run("segment", photo)
    normals = get_task("normals")
    assert values_from_earlier(normals, normals.repo_id(None), [segment]) is not None
    other = TaskResult(task="segment", model_id="facebook/sapiens2-seg-1b", prediction=segment.prediction)
    assert values_from_earlier(normals, normals.repo_id(None), [other]) is None
    assert values_from_earlier(get_task("matting"), get_task("matting").repo_id(None), [segment]) is None


def test_given_labels_of_another_size_are_refused(runtime, photo):
    with pytest.raises(ValueError, match="body-part labels of"):
        runtime.run("normals", photo, given={"given_body_parts": np.zeros((3, 4), np.uint8)})


def test_a_task_told_to_keep_the_background_ignores_given_labels(runtime, photo):
    given = {"given_body_parts": np.zeros(photo.original_size, np.uint8)}
    result = runtime.run("normals", photo, given=given, remove_background=False)
    assert result.prediction.background is None
