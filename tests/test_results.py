"""Results are plain data: every task's typed prediction pickles, and its pictures and files come from
`sapiens2.tasks.draw` and `export` alone, without a model or a server."""

import pickle

import numpy as np
import pytest

from sapiens2.data.metadata import body_parts, keypoints308
from sapiens2.outputs.results import Export, TaskResult
from sapiens2.pipelines.depth import DepthPrediction
from sapiens2.pipelines.features import FeaturesPrediction
from sapiens2.pipelines.matting import MattingPrediction
from sapiens2.pipelines.normals import NormalsPrediction
from sapiens2.pipelines.pose import PosePrediction
from sapiens2.pipelines.segment import SegmentationPrediction
from sapiens2.tasks import TASKS, draw, draw_result, export, export_kinds, export_result, get_task
from sapiens2.tasks.outputs import write_exports
from sapiens2.vision.detector import Detections
from sapiens2.vision.intrinsics import Intrinsics
from sapiens2.vision.pose_decoding import Person

HEIGHT, WIDTH = 48, 40


def _photo(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)


def _pose(rng: np.random.Generator) -> PosePrediction:
    meta = keypoints308()
    count = len(meta.names)
    persons = [
        Person(
            [4 + 10 * i, 6, 20, 30],
            rng.uniform([0, 0], [WIDTH, HEIGHT], (count, 2)),
            rng.uniform(0, 1, count),
            0.9,
        )
        for i in range(2)
    ]
    boxes = np.array([person.box for person in persons], dtype=np.float32)
    detections = Detections(boxes, np.array([0.9, 0.8], dtype=np.float32), found=2)
    return PosePrediction(_photo(rng), "tiny/pose", persons, detections, meta.names, meta)


def _segment(rng: np.random.Generator) -> SegmentationPrediction:
    labels = rng.integers(0, 29, (HEIGHT, WIDTH), dtype=np.uint8)
    mask = np.where(labels > 0, 255, 0).astype(np.uint8)
    return SegmentationPrediction(_photo(rng), "tiny/seg", labels, mask, body_parts())


def _normals(rng: np.random.Generator) -> NormalsPrediction:
    normals = rng.normal(size=(HEIGHT, WIDTH, 3)).astype(np.float32)
    normals /= np.linalg.norm(normals, axis=2, keepdims=True)
    return NormalsPrediction(_photo(rng), "tiny/normal", normals, rng.uniform(size=(HEIGHT, WIDTH)) < 0.3)


def _depth(rng: np.random.Generator) -> DepthPrediction:
    rows, columns = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    z = 2.0 + rng.uniform(0, 0.1, (HEIGHT, WIDTH)).astype(np.float32)
    pointmap = np.dstack([(columns - WIDTH / 2) * z / 50, (rows - HEIGHT / 2) * z / 50, z])
    foreground = rng.uniform(size=(HEIGHT, WIDTH)) < 0.7
    camera = Intrinsics(50.0, 50.0, WIDTH / 2, HEIGHT / 2, 0.01, int(foreground.sum()))
    return DepthPrediction(_photo(rng), "tiny/pointmap", pointmap, foreground, camera, 2.2 / 65535, 2)


def _matting(rng: np.random.Generator) -> MattingPrediction:
    alpha = rng.uniform(size=(HEIGHT, WIDTH)).astype(np.float32)
    return MattingPrediction(_photo(rng), "tiny/matting", alpha, _photo(rng))


def _features(rng: np.random.Generator) -> FeaturesPrediction:
    features = rng.normal(size=(16, 4, 3)).astype(np.float32)
    return FeaturesPrediction(_photo(rng), "tiny/pretrain", features[:, 0, 0].copy(), features)


PREDICTIONS = {
    "pose": _pose,
    "segment": _segment,
    "normals": _normals,
    "depth": _depth,
    "matting": _matting,
    "features": _features,
}


def test_every_task_has_a_typed_prediction_here():
    assert set(PREDICTIONS) == set(TASKS)


def _contents(files) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in files}


@pytest.mark.parametrize("task", list(TASKS))
def test_a_result_pickles_and_its_copy_writes_the_same_files(task, tmp_path):
    prediction = PREDICTIONS[task](np.random.default_rng(0))
    options = get_task(task).coerce_options({})
    result = TaskResult(task, prediction.model_id, prediction, options, summary="s", notes=["n"])
    copy = pickle.loads(pickle.dumps(result))
    assert type(copy.prediction) is type(prediction) and copy.options == result.options
    original = _contents(export_result(result, tmp_path / "original", "photo"))
    copied = _contents(export_result(copy, tmp_path / "copy", "photo"))
    assert original and original == copied
    assert sorted(name.removeprefix("photo") for name in original) == sorted(get_task(task).exports_for({}))
    # Drawn, it still pickles, and its copy draws the same pictures.
    drawn = pickle.loads(pickle.dumps(draw_result(result)))
    for (title, picture), (copied_title, copied_picture) in zip(
        drawn.pictures, draw_result(copy).pictures, strict=True
    ):
        assert title == copied_title
        np.testing.assert_array_equal(picture, copied_picture)


@pytest.mark.parametrize("task", list(TASKS))
def test_draw_gives_the_declared_pictures_and_only_those_asked(task):
    prediction = PREDICTIONS[task](np.random.default_rng(1))
    entry = get_task(task)
    pictures = draw(task, prediction)
    assert [title for title, _ in pictures] == list(entry.picture_titles)
    for title, picture in pictures:  # every picture at the photo's size, but the legend of the parts
        assert picture.dtype == np.uint8 and picture.ndim == 3 and picture.shape[2] == 3
        assert title == "Legend" or picture.shape == (HEIGHT, WIDTH, 3)
    last = entry.picture_titles[-1]
    assert [title for title, _ in draw(task, prediction, titles=[last])] == [last]


def test_draw_result_draws_only_the_missing_pictures_in_order_and_counts_their_time():
    prediction = _segment(np.random.default_rng(2))
    result = TaskResult("segment", prediction.model_id, prediction, get_task("segment").coerce_options({}))
    assert result.pictures == [] and result.timings.pictures == 0
    draw_result(result, ["Mask"])
    assert [title for title, _ in result.pictures] == ["Mask"] and result.timings.pictures > 0
    mask = result.pictures[0][1]
    draw_result(result)
    assert [title for title, _ in result.pictures] == list(get_task("segment").picture_titles)
    assert dict(result.pictures)["Mask"] is mask


@pytest.mark.parametrize("task", list(TASKS))
def test_export_writes_only_the_kinds_asked(task, tmp_path):
    prediction = PREDICTIONS[task](np.random.default_rng(3))
    entry = get_task(task)
    for kind in entry.export_kinds:
        files = export(task, prediction, [kind], tmp_path / kind, "photo")
        assert files and all(path.suffix == f".{kind}" for path in files)
        assert sorted(path.name for path in (tmp_path / kind).iterdir()) == sorted(p.name for p in files)
    assert export(task, prediction, [], tmp_path / "none", "photo") == []


def test_pose_writes_the_keypoint_files_its_options_choose(tmp_path):
    prediction = _pose(np.random.default_rng(4))
    files = export("pose", prediction, None, tmp_path, "photo", {"keypoint_format": ["coco17", "openpose"]})
    names = sorted(path.name for path in files)
    # The formats chosen come beside the native _pose.json, never instead of it.
    assert names == ["photo_coco17.json", "photo_controlnet.png", "photo_openpose.json", "photo_pose.json"]


def test_the_file_names_and_kinds_come_from_the_exports():
    for task in TASKS.values():
        assert task.export_suffixes == tuple(export.suffix for export in task.exports)
        assert len(set(task.export_suffixes)) == len(task.export_suffixes)
    assert export_kinds() == ("json", "png", "npy", "ply", "glb")


def test_an_export_that_writes_another_name_is_refused_and_leaves_nothing(tmp_path):
    prediction = _features(np.random.default_rng(5))
    good = get_task("features").exports[0]
    wrong = Export("_other.npy", good.write)
    with pytest.raises(RuntimeError, match="_other.npy"):
        write_exports([good, wrong], prediction, {}, tmp_path, "photo")
    assert list(tmp_path.iterdir()) == []
