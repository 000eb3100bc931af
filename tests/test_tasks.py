"""Every registered task end to end on the example photos with tiny checkpoints: pictures and exports."""

import json
import pickle
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_models import balance_background, write_tiny_4k_checkpoint

from sapiens2.data.metadata import body_parts, keypoints308
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.kinds import POINTMAP, POSE
from sapiens2.pipelines import pose as pose_pipeline
from sapiens2.pipelines.segment import class_meta
from sapiens2.runtime.runtime import Runtime
from sapiens2.tasks import export_result
from sapiens2.tasks.registry import ALL_TASKS, TASKS, get_task
from sapiens2.vision.dense import pointmap_to_image, to_hwc
from sapiens2.vision.detector import YoloPersonDetector
from sapiens2.vision.images import load_image
from sapiens2.vision.pose_decoding import decode_keypoints
from sapiens2.vision.processing import crop_persons, preprocess

PHOTOS = ("assets/grace_hopper.jpg", "assets/astronaut.png")


@pytest.fixture(scope="module")
def runtime(tiny_mirror, person_yolo, monkeypatch_module):
    monkeypatch_module.setenv("SAPIENS2_CHECKPOINT_DIR", str(tiny_mirror))
    return Runtime(device="cpu", detector=YoloPersonDetector(person_yolo, max_persons=3))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def photo():
    return load_image(PHOTOS[0])


@pytest.fixture(scope="module")
def half_background(runtime, photo):
    seg = balance_background(runtime, photo)
    assert 0.2 < (seg == 0).mean() < 0.8
    return seg


def read_ply(path):
    data = path.read_bytes()
    header, _, body = data.partition(b"end_header\n")
    count = int(next(line for line in header.split(b"\n") if line.startswith(b"element vertex")).split()[-1])
    vertex = np.dtype(
        [("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")]
    )
    assert b"format binary_little_endian 1.0" in header
    return np.frombuffer(body, dtype=vertex, count=count), len(body) == count * vertex.itemsize


def test_registry_declares_each_task_once_with_its_sizes():
    assert list(TASKS) == ["pose", "segment", "normals", "depth", "matting", "features"]
    assert ALL_TASKS == ("pose", "segment", "normals", "depth", "matting")
    assert list(get_task("matting").repos) == ["1b"]
    assert list(get_task("features").repos) == ["0.1b", "0.4b", "0.8b", "1b", "1b-4k", "5b"]
    assert get_task("features").repo_id("1b-4k") == "facebook/sapiens2-pretrain-1b-4k"
    assert get_task("pose").repo_id("1b") == "facebook/sapiens2-pose-1b"
    with pytest.raises(ValueError, match="no 0.1b model"):
        get_task("pose").repo_id("0.1b")
    normals = get_task("normals")
    assert normals.helper_repo_id("facebook/sapiens2-normal-1b") == "facebook/sapiens2-seg-1b"
    assert normals.helper_repo_id("/models/my-normal-checkpoint") == "facebook/sapiens2-seg-0.4b"
    with pytest.raises(ValueError, match="no option"):
        get_task("segment").coerce_options({"colour": 1})
    with pytest.raises(ValueError, match="between 0 and 1"):
        get_task("pose").coerce_options({"threshold": 2})


@pytest.mark.parametrize("task", list(TASKS))
def test_task_pictures_and_exports(runtime, photo, task, tmp_path):
    result = runtime.run(task, photo)
    height, width = photo.original_size
    titles = [title for title, _ in result.pictures]
    assert titles == list(get_task(task).picture_titles)
    main = result.pictures[0][1]
    assert main.shape == (height, width, 3) and main.dtype == np.uint8
    assert result.timings.model > 0 and result.device == "cpu" and result.dtype == "fp32"
    assert result.timings.pictures > 0 and result.timings.decode >= 0
    assert "decoding" in result.timing_line() and "pictures" in result.timing_line()
    files = export_result(result, tmp_path, "photo")
    assert files and all(path.is_file() and path.stat().st_size > 0 for path in files)
    assert sorted(path.name.removeprefix("photo") for path in files) == sorted(get_task(task).exports_for({}))


@pytest.mark.parametrize("task", list(TASKS))
def test_a_result_crosses_a_process_as_plain_data(runtime, photo, task, tmp_path):
    """A result pickles (as across a ZeroGPU fork or a Ray stage) and its copy writes the same files; run
    without pictures, none is drawn."""
    result = runtime.run(task, photo, pictures=False)
    assert result.pictures == [] and result.timings.pictures == 0
    copy = pickle.loads(pickle.dumps(result))
    files = {path.name: path.read_bytes() for path in export_result(result, tmp_path / "a", "photo")}
    copied = {path.name: path.read_bytes() for path in export_result(copy, tmp_path / "b", "photo")}
    assert files and files == copied


def test_pose_writes_the_keypoint_formats_chosen_and_the_controlnet_picture(runtime, photo, tmp_path):
    assert get_task("pose").exports_for({}) == ("_pose.json", "_controlnet.png")
    formats = ["openpose", "coco17", "wholebody133"]
    result = runtime.run("pose", photo, keypoint_format=formats, threshold=0.0)
    names = sorted(path.name for path in export_result(result, tmp_path, "photo"))
    expected = ["photo_coco17.json", "photo_controlnet.png", "photo_openpose.json", "photo_pose.json"]
    expected.append("photo_wholebody.json")  # beside the native _pose.json, never instead of it
    assert names == expected
    persons = result.prediction.persons
    people = json.loads((tmp_path / "photo_openpose.json").read_text())["people"]
    assert len(people) == len(persons) and len(people[0]["pose_keypoints_2d"]) == 75
    coco = json.loads((tmp_path / "photo_coco17.json").read_text())
    assert coco[0]["keypoints"][:2] == pytest.approx(persons[0].keypoints[0].tolist(), abs=0.01)
    controlnet = dict(result.pictures)["ControlNet pose"]
    assert controlnet.shape == (*photo.original_size, 3) and controlnet.any()
    stored = np.asarray(Image.open(tmp_path / "photo_controlnet.png").convert("RGB"))
    np.testing.assert_array_equal(stored, controlnet)
    with pytest.raises(ValueError, match="keypoint_format' must be any of coco17, wholebody133, openpose"):
        runtime.run("pose", photo, keypoint_format="coco18")


def test_pose_json_has_every_person_and_keypoint(runtime, photo, tmp_path):
    result = runtime.run("pose", photo, threshold=0.0)
    document = json.loads(export_result(result, tmp_path, "photo")[0].read_text())
    persons = result.prediction.persons
    assert 1 <= len(persons) <= 3 and len(document["persons"]) == len(persons)
    for record, person in zip(document["persons"], persons, strict=True):
        assert len(record["keypoints"]) == 308
        np.testing.assert_allclose([k["x"] for k in record["keypoints"]], person.keypoints[:, 0], atol=0.01)
    assert document["image"] == {"width": photo.original_size[1], "height": photo.original_size[0]}


def _with_placeholder_labels(source, directory):
    """A copy of the checkpoint in `source` whose config.json names its outputs LABEL_0, LABEL_1, ... (what
    transformers writes for a bare num_labels)."""
    shutil.copytree(source, directory)
    config = json.loads((directory / "config.json").read_text())
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(len(config["id2label"]))}
    config["label2id"] = {name: int(i) for i, name in config["id2label"].items()}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_placeholder_labels_count_as_absent_and_the_official_names_are_used(
    runtime, photo, tiny_mirror, tmp_path
):
    pose = _with_placeholder_labels(tiny_mirror / get_task("pose").repo_id(None), tmp_path / "pose")
    result = runtime.run("pose", photo, model=str(pose), threshold=0.0)
    document = json.loads(export_result(result, tmp_path, "photo")[0].read_text())
    names = [keypoint["name"] for keypoint in document["persons"][0]["keypoints"]]
    assert names == list(keypoints308().names)
    placeholders = Sapiens2Config.from_dict({"num_labels": 29})
    assert placeholders.id2label[5] == "LABEL_5"
    assert class_meta(SimpleNamespace(config=lambda: placeholders)).names == body_parts().names
    # Only names that are exactly a placeholder of their own index are absent.
    mixed = Sapiens2Config.from_dict({"id2label": {"0": "LABEL_0", "1": "LABEL_0", "2": "head"}})
    assert mixed.label_names() == ("", "LABEL_0", "head")


def test_flip_test_changes_keypoints_but_not_their_count(runtime, photo):
    plain = runtime.run("pose", photo).prediction.persons
    flipped = runtime.run("pose", photo, flip_test=True).prediction.persons
    assert len(plain) == len(flipped)
    assert not np.allclose(plain[0].keypoints, flipped[0].keypoints)


def test_flip_test_is_the_model_run_on_each_crop_and_on_its_mirror_image(runtime, photo, monkeypatch):
    """The flip test runs the crops and their mirror images as one batch; the decoder gets the heatmaps of
    two separate forwards (the plain crops, and the mirrored ones with their heatmaps flipped back)."""
    decoded = []

    def recording_decode(heatmaps, boxes, size, flipped=None):
        decoded.append((heatmaps, boxes, flipped))
        return decode_keypoints(heatmaps, boxes, size, flipped)

    monkeypatch.setattr(pose_pipeline, "decode_keypoints", recording_decode)
    runtime.run("pose", photo, flip_test=True)
    ((heatmaps, boxes, flipped),) = decoded
    repo_id = get_task("pose").repo_id(None)
    model, settings = runtime.model(repo_id), runtime.settings(repo_id, POSE)
    crops = crop_persons(photo.model_rgb, boxes, settings)
    pairs = torch.tensor(model.config.flip_pairs or keypoints308().flip_pairs).reshape(-1, 2)
    plain = runtime.forward(model, crops).heatmaps
    mirrored = runtime.forward(model, crops.flip(-1), flip_pairs=pairs).heatmaps
    # A batch of 2n and two of n differ in float32 rounding only. (The random model's flat heatmaps make
    # the decoded keypoints of so small a difference jump between near-equal maxima: heatmaps are compared.)
    assert flipped is not None and len(heatmaps) == len(flipped) == len(boxes) >= 1
    torch.testing.assert_close(heatmaps, plain, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(flipped, mirrored, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(flipped, plain, rtol=1e-4, atol=1e-5)


def test_progress_says_each_stage_in_order(runtime, photo):
    # The models loaded first (a first use also says "loading weights of ..."), whatever ran before.
    persons = len(runtime.run("pose", photo).prediction.persons)
    runtime.run("depth", photo)
    pose, depth = [], []
    runtime.run("pose", photo, progress=lambda fraction, text: pose.append(text))
    runtime.run("depth", photo, progress=lambda fraction, text: depth.append(text))
    noun = "person" if persons == 1 else "persons"
    assert pose == ["detecting persons", f"running the model on {persons} {noun}", "drawing the pictures"]
    assert depth == ["running the model", "running the body-part model", "drawing the pictures"]


def test_flip_test_is_on_by_default_with_a_gpu_and_off_on_the_cpu(runtime):
    pose = get_task("pose")
    (flip,) = [option for option in pose.options if option.name == "flip_test"]
    assert "GPU" in flip.help and "CPU" in flip.help
    assert flip.default_text == "on with a GPU, off on the CPU"
    assert pose.coerce_options({}, "cuda:0")["flip_test"] is True
    assert pose.coerce_options({}, "cpu")["flip_test"] is False
    assert pose.coerce_options({"flip_test": True}, "cpu")["flip_test"] is True
    assert {o.name: o.default for o in runtime.options("pose")}["flip_test"] is False
    with pytest.raises(TypeError, match="on_device"):
        flip.coerce(None)


def test_depth_is_smoothed_by_default_in_pictures_and_exports(runtime, tmp_path):
    """On a photo larger than the model input the depth is smoothed before being enlarged, as the official
    demo does; `smooth=False` gives the plain resize. The .npy and .ply exports follow the option."""
    photo = load_image(np.asarray(Image.open(PHOTOS[1]).convert("RGB").resize((1200, 1600))))
    repo_id = get_task("depth").repo_id(None)
    settings = runtime.settings(repo_id, POINTMAP)
    outputs = runtime.forward(runtime.model(repo_id), preprocess([photo.model_rgb], settings))
    expected = {
        smooth: to_hwc(
            pointmap_to_image(
                outputs.pointmaps,
                outputs.scales,
                photo.model_size,
                settings,
                photo.original_size,
                smooth,
            )[0]
        )
        for smooth in (True, False)
    }
    for smooth in (True, False):
        result = runtime.run("depth", photo, remove_background=False, smooth=smooth)
        np.testing.assert_allclose(result.prediction.pointmap, expected[smooth], rtol=1e-5, atol=1e-5)
        files = {path.name: path for path in export_result(result, tmp_path / str(smooth), "photo")}
        np.testing.assert_array_equal(np.load(files["photo_depth.npy"]), result.prediction.pointmap[..., 2])
        vertices, _ = read_ply(files["photo_points.ply"])
        np.testing.assert_array_equal(vertices["z"], result.prediction.pointmap[..., 2].ravel())
    assert np.abs(expected[True] - expected[False]).max() > 1e-3


def test_features_run_the_4k_backbone_at_its_own_resolution(tmp_path, monkeypatch, photo):
    """The 4K entry of the Features task: a tiny 4K backbone whose config says 256x192 (4096x3072 for the
    real one) and that has no preprocessor_config.json runs at that size, on its 4x3 grid of window tokens."""
    write_tiny_4k_checkpoint(tmp_path / "facebook/sapiens2-pretrain-1b-4k", image_size=(256, 192))
    monkeypatch.setenv("SAPIENS2_CHECKPOINT_DIR", str(tmp_path))
    result = Runtime(device="cpu").run("features", photo, size="1b-4k")
    cls, patches = result.prediction.embedding, result.prediction.features
    assert cls.shape == (32,) and patches.shape == (32, 4, 3)
    assert result.pictures[0][1].shape == (*photo.original_size, 3)
    assert "4x3 patch grid" in result.summary


def test_segmentation_export_matches_prediction(runtime, photo, tmp_path):
    result = runtime.run("segment", photo, opacity=1.0)
    png, npy, *_ = export_result(result, tmp_path, "photo")
    seg = result.prediction.labels
    np.testing.assert_array_equal(np.asarray(Image.open(png)), seg)
    np.testing.assert_array_equal(np.load(npy), seg)
    palette = np.asarray(body_parts().palette, np.uint8)
    np.testing.assert_array_equal(result.pictures[0][1], palette[seg])


def test_normals_background_is_black_where_body_parts_say(runtime, photo, half_background):
    seg = half_background
    result = runtime.run("normals", photo)
    picture = result.pictures[0][1]
    assert (picture[seg == 0] == 0).all()
    unit = result.prediction.normals
    np.testing.assert_allclose(np.linalg.norm(unit, axis=2), 1.0, atol=1e-3)
    kept = runtime.run("normals", photo, remove_background=False).pictures[0][1]
    assert (kept[seg == 0] != 0).any()


def test_depth_point_cloud_holds_the_foreground(runtime, photo, tmp_path, half_background):
    seg = half_background
    result = runtime.run("depth", photo)
    files = {path.name: path for path in export_result(result, tmp_path, "photo")}
    vertices, exact = read_ply(files["photo_points.ply"])
    assert exact and len(vertices) == int((seg != 0).sum())
    np.testing.assert_allclose(np.load(files["photo_depth.npy"]), result.prediction.pointmap[..., 2])
    foreground = np.flatnonzero((seg != 0).ravel())
    np.testing.assert_array_equal(vertices["red"], photo.rgb.reshape(-1, 3)[foreground, 0])


def test_matting_composite_over_an_uploaded_background(runtime, photo):
    background = np.zeros((40, 40, 3), np.uint8)
    background[..., 2] = 255
    result = runtime.run("matting", photo, background_image=background)
    alpha = result.prediction.alpha
    composite = result.pictures[2][1].astype(int)
    assert composite.shape == photo.rgb.shape
    transparent = alpha < 0.02
    if transparent.any():
        assert composite[transparent][:, 2].min() >= 240


def test_all_tasks_share_the_body_part_model(runtime, photo):
    loads_before = runtime.cache.stats.loads
    results = runtime.run_all(photo)
    assert [r.task for r in results] == list(ALL_TASKS)
    assert runtime.cache.stats.loads - loads_before <= len(ALL_TASKS)
    assert "facebook/sapiens2-seg-0.4b" in runtime.cache


def test_twelve_megapixel_photo_through_every_task(runtime, tmp_path):
    big = np.asarray(Image.open(PHOTOS[1]).convert("RGB").resize((4000, 3000), Image.BILINEAR))
    image = load_image(big)
    for task in TASKS:
        result = runtime.run(task, image)
        assert result.pictures[0][1].shape == (3000, 4000, 3)


def test_the_depth_summary_counts_its_points_with_thousands_separators(runtime, photo):
    summary = runtime.run("depth", photo, remove_background=False).summary
    count, _, rest = summary.partition(" ")
    assert rest.startswith("foreground points. ") and re.fullmatch(r"\d{1,3}(,\d{3})+", count), summary
    assert int(count.replace(",", "")) == photo.model_size[0] * photo.model_size[1]


@pytest.mark.parametrize("task", ["normals", "matting"])
def test_every_picture_task_says_what_it_found(runtime, photo, task):
    summary = runtime.run(task, photo).summary
    assert summary.endswith(".") and re.search(r"\d", summary), summary
