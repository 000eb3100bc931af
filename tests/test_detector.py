"""Person detector: weights resolution, class filtering, order, cap and whole-image fallback."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sapiens2.vision.detector import (
    DEFAULT_MAX_PERSONS,
    DEFAULT_WEIGHTS,
    Detections,
    DetectorError,
    YoloPersonDetector,
    resolve_weights,
    select_persons,
)

ASSETS = Path(__file__).resolve().parents[1] / "assets"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.delenv("SAPIENS2_DETECTOR", raising=False)


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    return np.asarray(Image.open(ASSETS / "grace_hopper.jpg").convert("RGB"))


@pytest.fixture(scope="module")
def tiny_yolo(tmp_path_factory) -> str:
    """A yolo11n built from its yaml (no download) whose class scores favour person and car.

    Random weights score every class alike; raising the class biases makes the coarse levels vote
    "person" and the finest level "car", so real results hold both classes with scores near 0.88.
    """
    import torch
    from ultralytics import YOLO

    torch.manual_seed(0)
    model = YOLO("yolo11n.yaml")
    model.model.names = {i: f"class {i}" for i in range(80)} | {0: "person", 2: "car"}
    with torch.no_grad():
        for level, branch in enumerate(model.model.model[-1].cv3):
            branch[-1].bias[0] = 2.0 if level else -9.0
            branch[-1].bias[2] = 2.0 if level == 0 else -9.0
    path = tmp_path_factory.mktemp("yolo") / "tiny_yolo.pt"
    model.save(str(path))
    return str(path)


def test_select_persons_filters_sorts_converts_and_caps():
    boxes = np.array([[10, 20, 50, 80], [0, 0, 5, 5], [30, 40, 100, 90], [1, 2, 3, 4]], dtype=np.float32)
    scores = np.array([0.5, 0.99, 0.9, 0.7])
    classes = np.array([0, 2, 0, 0])
    found = select_persons(boxes, scores, classes, (120, 160), max_persons=2)
    assert found.boxes_xywh.dtype == np.float32 and found.boxes_xywh.shape == (2, 4)
    np.testing.assert_allclose(found.boxes_xywh, [[30, 40, 70, 50], [1, 2, 2, 2]])
    np.testing.assert_allclose(found.scores, [0.9, 0.7])
    assert found.found == 3 and found.capped and not found.fallback
    everyone = select_persons(boxes, scores, classes, (120, 160), max_persons=10)
    assert len(everyone) == 3 and not everyone.capped


def test_select_persons_falls_back_to_the_whole_image():
    nobody = select_persons(np.zeros((1, 4)), np.array([0.9]), np.array([5]), (120, 160))
    assert nobody.fallback and nobody.found == 0 and not nobody.capped
    np.testing.assert_array_equal(nobody.boxes_xywh, [[0, 0, 160, 120]])
    assert nobody.scores.shape == (1,)
    empty = select_persons(np.zeros((0, 4)), np.zeros(0), np.zeros(0), (10, 20))
    assert empty.fallback and empty.boxes_xywh.shape == (1, 4)


def test_weights_are_names_or_configured_files(tmp_path, monkeypatch):
    assert resolve_weights() == DEFAULT_WEIGHTS
    assert resolve_weights("yolov8s.pt") == "yolov8s.pt"
    assert resolve_weights("rtdetr-l.pt") == "rtdetr-l.pt"
    local = tmp_path / "people.pt"
    local.write_bytes(b"")
    assert resolve_weights(local) == str(local.resolve())
    monkeypatch.setenv("SAPIENS2_DETECTOR", str(local))
    assert resolve_weights() == str(local.resolve())
    assert resolve_weights("yolo11s.pt") == "yolo11s.pt", "an argument wins over the environment"
    (tmp_path / "notes.txt").write_text("x")
    for bad in ["https://example.com/yolo11m.pt", "../yolo11m.pt", str(tmp_path / "missing.pt"),
                str(tmp_path / "notes.txt"), str(tmp_path), "yolo11m-pose.pt; rm -rf /", "sam_b.pt"]:
        with pytest.raises(DetectorError):
            resolve_weights(bad)
    with pytest.raises(DetectorError):
        YoloPersonDetector(max_persons=0)


def test_offline_name_not_downloaded(tmp_path, monkeypatch, photo):
    from ultralytics.utils import SETTINGS

    name = "yolov5x6u.pt"
    if (Path(SETTINGS["weights_dir"]) / name).is_file():
        pytest.skip(f"{name} is already downloaded on this machine")
    monkeypatch.chdir(tmp_path)
    detector = YoloPersonDetector(name)
    with pytest.raises(DetectorError, match="YOLO_OFFLINE"):
        detector.detect(photo)
    assert list(tmp_path.iterdir()) == []


def test_a_model_without_a_person_class_is_refused(tmp_path, photo):
    from ultralytics import YOLO

    path = tmp_path / "unnamed.pt"
    YOLO("yolo11n.yaml").save(str(path))
    with pytest.raises(DetectorError, match="not 'person'"):
        YoloPersonDetector(path).detect(photo)


def test_real_model_keeps_only_persons_best_first(tiny_yolo, photo):
    import torch
    from ultralytics import YOLO

    threads = torch.get_num_threads()
    try:  # ultralytics' own first prediction lowers torch's threads for the whole process: put them back
        bgr = np.ascontiguousarray(photo[..., ::-1])
        raw = YOLO(tiny_yolo).predict(bgr, conf=0.3, iou=0.3, verbose=False)[0]
    finally:
        torch.set_num_threads(threads)
    raw_classes = raw.boxes.cls.numpy()
    assert set(raw_classes) == {0.0, 2.0}, "the test model must mix persons with another class"
    raw_persons = raw.boxes.xyxy.numpy()[raw_classes == 0]

    found = YoloPersonDetector(tiny_yolo, max_persons=1000).detect(photo)
    assert isinstance(found, Detections) and not found.fallback and not found.capped
    assert len(found) == found.found == len(raw_persons)
    assert found.boxes_xywh.dtype == np.float32 and found.boxes_xywh.shape == (len(raw_persons), 4)
    assert np.all(np.diff(found.scores) <= 0)
    height, width = photo.shape[:2]
    x, y, w, h = found.boxes_xywh.T
    assert np.all(w > 0) and np.all(h > 0)
    assert np.all(x >= 0) and np.all(y >= 0)
    assert np.all(x + w <= width + 1e-3) and np.all(y + h <= height + 1e-3)
    xyxy = np.concatenate([found.boxes_xywh[:, :2], found.boxes_xywh[:, :2] + found.boxes_xywh[:, 2:]], 1)
    assert sorted(map(tuple, np.round(xyxy, 2))) == sorted(map(tuple, np.round(raw_persons, 2)))


def test_real_model_cap_and_fallback(tiny_yolo, photo):
    capped = YoloPersonDetector(tiny_yolo).detect(photo)
    assert len(capped) == DEFAULT_MAX_PERSONS and capped.capped and capped.found > DEFAULT_MAX_PERSONS
    nobody = YoloPersonDetector(tiny_yolo, conf=0.95).detect(photo)
    assert nobody.fallback and len(nobody) == 1
    np.testing.assert_array_equal(nobody.boxes_xywh, [[0, 0, photo.shape[1], photo.shape[0]]])
    with pytest.raises(DetectorError):
        YoloPersonDetector(tiny_yolo).detect(photo[..., 0])


def test_detection_keeps_torch_thread_count(tiny_yolo, photo):
    """ultralytics lowers torch's thread count on its first prediction; the detector puts it back."""
    import torch

    before = torch.get_num_threads()
    YoloPersonDetector(tiny_yolo).detect(photo)
    assert torch.get_num_threads() == before
