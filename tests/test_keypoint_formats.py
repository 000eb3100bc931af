"""Keypoint conventions against their definitions: COCO-17, COCO-WholeBody-133 and OpenPose, and the files
other tools read (COCO results scored by pycocotools' COCOeval, OpenPose's JSON)."""

import contextlib
import io
import json

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from sapiens2.data.metadata import keypoint_formats_table, keypoints308
from sapiens2.errors import RequestError
from sapiens2.outputs.keypoint_files import coco_results, openpose_document, write_keypoint_formats
from sapiens2.vision.keypoint_formats import FORMAT_NAMES, keypoint_format
from sapiens2.vision.pose_decoding import Person

NAMES = keypoints308().names
# COCO's person keypoints, in the order of the COCO keypoint annotations.
COCO17 = ["nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
          "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee",
          "right_knee", "left_ankle", "right_ankle"]  # fmt: skip
# COCO-WholeBody's six foot points (17-22).
FEET = ["left_big_toe", "left_small_toe", "left_heel", "right_big_toe", "right_small_toe", "right_heel"]
# OpenPose's BODY_25 (doc/02_output.md), by the 308 name of the same point; None: not a 308 point.
BODY_25 = ["nose", None, "right_shoulder", "right_elbow", "right_wrist", "left_shoulder", "left_elbow",
           "left_wrist", None, "right_hip", "right_knee", "right_ankle", "left_hip", "left_knee",
           "left_ankle", "right_eye", "left_eye", "right_ear", "left_ear", "left_big_toe", "left_small_toe",
           "left_heel", "right_big_toe", "right_small_toe", "right_heel"]  # fmt: skip
# The 21 points of a hand in OpenPose and COCO-WholeBody: the wrist, then each finger from its base joint
# (the thumb's carpometacarpal, the others' knuckles) to its tip. Goliath names a finger's joints from
# the tip: 4 the tip, 3 and 2 the joints below it, third_joint the base.
FINGERS = ["thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger"]


def hand(side: str) -> list[str]:
    joints = ("_third_joint", "2", "3", "4")
    return [f"{side}_wrist"] + [f"{side}_{finger}{joint}" for finger in FINGERS for joint in joints]


def person(seed: int = 0) -> Person:
    rng = np.random.default_rng(seed)
    keypoints = rng.uniform([100, 50], [400, 450], size=(len(NAMES), 2))
    return Person(np.array([90, 40, 320, 420]), keypoints, rng.uniform(0.5, 1.0, len(NAMES)), 0.9)


def at(found, part: str, subject: Person):
    return found.convert(subject.keypoints, subject.scores)[part]


def expect_same_points(points, scores, subject: Person, names) -> None:
    for target, name in enumerate(names):
        if name is not None:
            np.testing.assert_array_equal(points[target], subject.keypoints[NAMES.index(name)])
            assert scores[target] == subject.scores[NAMES.index(name)]


def test_every_format_is_made_of_308_points_with_a_known_kind():
    table = keypoint_formats_table()
    assert FORMAT_NAMES == ("coco17", "wholebody133", "openpose")
    for entry in table["formats"].values():
        for points in entry["parts"].values():
            for point in points:
                assert point["kind"] in table["kinds"], point
                assert set(point["from"]) <= set(NAMES), point
                assert len(point["from"]) == {"midpoint": 2, "absent": 0}.get(point["kind"], 1), point


def test_coco17_is_the_308_points_of_the_same_names():
    subject = person()
    points, scores = at(keypoint_format("coco17", NAMES), "keypoints", subject)
    assert points.shape == (17, 2)
    expect_same_points(points, scores, subject, COCO17)


def test_wholebody_has_body_feet_face_and_both_hands_in_order():
    subject = person()
    found = keypoint_format("wholebody133", NAMES)
    points, scores = at(found, "keypoints", subject)
    assert points.shape == (133, 2)
    expect_same_points(points[:23], scores[:23], subject, COCO17 + FEET)
    expect_same_points(points[91:112], scores[91:112], subject, hand("left"))
    expect_same_points(points[112:], scores[112:], subject, hand("right"))
    face = found.parts[0].point_names[23:91]
    assert face == tuple(f"face-{i}" for i in range(68))
    # 300-W's points 30 (nose tip) and 33 (below the nose, between the nostrils) are Goliath points.
    expect_same_points(points[23 + 30 : 23 + 34 : 3], scores[23 + 30 : 23 + 34 : 3], subject,
                       ["tip_of_nose", "bottom_center_of_nose"])  # fmt: skip


def test_openpose_body_hands_and_face():
    subject = person()
    found = keypoint_format("openpose", NAMES)
    parts = found.convert(subject.keypoints, subject.scores)
    lengths = {name: len(points) for name, (points, _) in parts.items()}
    assert lengths == {"pose_keypoints_2d": 25, "face_keypoints_2d": 70, "hand_left_keypoints_2d": 21,
                       "hand_right_keypoints_2d": 21}  # fmt: skip
    expect_same_points(*parts["pose_keypoints_2d"], subject, BODY_25)
    expect_same_points(*parts["hand_left_keypoints_2d"], subject, hand("left"))
    expect_same_points(*parts["hand_right_keypoints_2d"], subject, hand("right"))
    points, scores = parts["pose_keypoints_2d"]
    hips = subject.keypoints[[NAMES.index("left_hip"), NAMES.index("right_hip")]]
    np.testing.assert_allclose(points[8], hips.mean(axis=0))  # MidHip
    assert scores[8] == min(subject.scores[NAMES.index("left_hip")], subject.scores[NAMES.index("right_hip")])
    np.testing.assert_array_equal(points[1], subject.keypoints[NAMES.index("neck")])
    face_points, _ = parts["face_keypoints_2d"]
    pupils = [NAMES.index("r_center_of_pupil"), NAMES.index("l_center_of_pupil")]
    np.testing.assert_array_equal(face_points[68:], subject.keypoints[pupils])  # OpenPose's 68, 69


def test_absent_points_are_zero_with_zero_confidence():
    subject = person()
    points, scores = at(keypoint_format("openpose", NAMES), "face_keypoints_2d", subject)
    # 300-W's jaw line between the ear and the chin has no Goliath point.
    assert (points[1:8] == 0).all() and (scores[1:8] == 0).all()
    assert (scores[[0, 8, 16]] > 0).all()


def test_a_model_without_the_308_points_is_refused_with_a_sentence():
    with pytest.raises(RequestError, match="made from the 308 Sapiens keypoints"):
        keypoint_format("coco17", [f"point_{i}" for i in range(17)])
    with pytest.raises(RequestError, match="one of coco17, wholebody133, openpose"):
        keypoint_format("body_99", NAMES)


def test_openpose_json_has_openposes_layout_and_lengths(tmp_path):
    subjects = [person(0), person(1)]
    (path,) = write_keypoint_formats(tmp_path, "photo", subjects, NAMES, ["openpose"])
    assert path.name == "photo_openpose.json"
    document = json.loads(path.read_text())
    assert document["version"] == 1.3 and len(document["people"]) == 2
    for entry, subject in zip(document["people"], subjects, strict=True):
        assert entry["person_id"] == [-1]
        lengths = {key: len(value) for key, value in entry.items() if key != "person_id"}
        assert lengths == {"pose_keypoints_2d": 75, "face_keypoints_2d": 210, "hand_left_keypoints_2d": 63,
                           "hand_right_keypoints_2d": 63}  # fmt: skip
        nose = subject.keypoints[0]
        assert entry["pose_keypoints_2d"][:3] == pytest.approx([*nose, subject.scores[0]], abs=0.01)


# ---- COCO results read and scored by pycocotools -----------------------------------------------------

COCO_SIGMAS = np.array([.26, .25, .25, .35, .35, .79, .79, .72, .72, .62, .62, 1.07, 1.07, .87, .87, .89,
                        .89]) / 10  # fmt: skip  COCO's per-keypoint OKS constants
THRESHOLDS = np.linspace(0.5, 0.95, 10)


def ground_truth(subject: Person, names: list, count: int) -> dict:
    """A COCO ground truth of one image and one person whose points are the 308 points `names` (None:
    not annotated)."""
    keypoints = []
    for name in names:
        x, y = subject.keypoints[NAMES.index(name)] if name else (0, 0)
        keypoints += [float(x), float(y), 2 if name else 0]
    x, y, w, h = subject.box.tolist()
    return {
        "images": [{"id": 7, "width": 640, "height": 480, "file_name": "000000000007.jpg"}],
        "annotations": [{"id": 1, "image_id": 7, "category_id": 1, "keypoints": keypoints, "iscrowd": 0,
                         "num_keypoints": sum(1 for n in names if n), "bbox": [x, y, w, h], "area": w * h}],
        "categories": [{"id": 1, "name": "person", "keypoints": [str(i) for i in range(count)],
                        "skeleton": []}],
    }  # fmt: skip


def average_precision(truth: dict, results: list[dict], sigmas: np.ndarray) -> float:
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO()
        coco.dataset = truth
        coco.createIndex()
        evaluation = COCOeval(coco, coco.loadRes(results), "keypoints")
        evaluation.params.kpt_oks_sigmas = sigmas
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return float(evaluation.stats[0])


def oks(moved_by: float, sigma: float, area: float, annotated: int) -> float:
    """COCO's object keypoint similarity when one of the `annotated` points is `moved_by` pixels off."""
    term = np.exp(-(moved_by**2) / (2 * area * (2 * sigma) ** 2))
    return (annotated - 1 + term) / annotated


def written_results(tmp_path, subject: Person, name: str) -> list[dict]:
    (path,) = write_keypoint_formats(tmp_path, "000000000007", [subject], NAMES, [name])
    return json.loads(path.read_text())


def test_coco17_results_file_scores_ap_1_and_a_moved_point_lowers_it_as_oks_says(tmp_path):
    subject = person()
    results = written_results(tmp_path, subject, "coco17")
    assert (tmp_path / "000000000007_coco17.json").exists()
    entry = results[0]
    assert entry["image_id"] == 7 and entry["category_id"] == 1 and len(entry["keypoints"]) == 51
    assert entry["bbox"] == pytest.approx(subject.box.tolist())
    truth = ground_truth(subject, COCO17, 17)
    assert average_precision(truth, results, COCO_SIGMAS) == pytest.approx(1.0)

    area = truth["annotations"][0]["area"]
    # Moved so that the person's OKS falls between 0.90 and 0.95: AP over thresholds 0.50:0.05:0.95 is 0.9.
    moved_by = 2 * COCO_SIGMAS[0] * np.sqrt(2 * area * -np.log(0.945 * 17 - 16))
    assert 0.90 < oks(moved_by, COCO_SIGMAS[0], area, 17) < 0.95
    results[0]["keypoints"][0] += moved_by
    expected = np.mean(THRESHOLDS <= oks(moved_by, COCO_SIGMAS[0], area, 17) + 1e-9)
    assert average_precision(truth, results, COCO_SIGMAS) == pytest.approx(expected) == pytest.approx(0.9)


def test_wholebody_results_file_scores_ap_1(tmp_path):
    subject = person()
    results = written_results(tmp_path, subject, "wholebody133")
    assert len(results[0]["keypoints"]) == 133 * 3
    assert (tmp_path / "000000000007_wholebody.json").exists()
    # The face is not annotated here: its points are chosen, not the same points (docs/keypoint-formats.md).
    names = COCO17 + FEET + [None] * 68 + hand("left") + hand("right")
    sigmas = np.full(133, 0.05)  # the test's own constants; any positive ones score identical points 1.0
    assert average_precision(ground_truth(subject, names, 133), results, sigmas) == pytest.approx(1.0)
    for point in range(112, 133):  # the right hand far away: 21 of the 65 annotated points lost
        results[0]["keypoints"][3 * point] += 1000.0
    expected = np.mean(THRESHOLDS <= 44 / 65)
    assert average_precision(ground_truth(subject, names, 133), results, sigmas) == pytest.approx(expected)
    assert expected == pytest.approx(0.4)


def test_coco_score_is_the_box_score_times_the_mean_point_score():
    subject = person()
    (entry,) = coco_results(keypoint_format("coco17", NAMES), [subject], "photo")
    indices = [NAMES.index(name) for name in COCO17]
    assert entry["image_id"] == "photo"
    assert entry["score"] == pytest.approx(0.9 * subject.scores[indices].mean(), abs=1e-4)
    assert entry["keypoints"][2::3] == pytest.approx(subject.scores[indices].tolist(), abs=1e-4)


def test_openpose_document_without_people():
    assert openpose_document(keypoint_format("openpose", NAMES), []) == {"version": 1.3, "people": []}
