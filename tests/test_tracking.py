"""Tracking and smoothing on synthetic clips: two persons crossing, one leaving and coming back, keypoints
with added noise, boxes from a fixed stand-in detector (the true boxes). No model runs here: the checks need
known paths, which a model with random weights cannot give (tests/test_video.py runs the real ones)."""

import dataclasses

import numpy as np
import pytest

from sapiens2.data.metadata import keypoints308
from sapiens2.outputs.results import TaskResult
from sapiens2.pipelines.pose import PosePrediction
from sapiens2.pipelines.pose_tracking import PoseTracker
from sapiens2.tasks import draw_result
from sapiens2.tasks.registry import get_task
from sapiens2.vision.detector import Detections
from sapiens2.vision.pose_decoding import Person
from sapiens2.vision.smoothing import KeypointFilter
from sapiens2.vision.tracking import PersonTracker, box_from_keypoints

META = keypoints308()
K = len(META.names)
FPS = 25.0
WIDTH, HEIGHT = 640, 360
BOX = np.array([80.0, 200.0])  # a person's width and height in pixels
NOISE = 2.0  # pixels of keypoint noise
_layout = np.random.default_rng(7).uniform(0.1, 0.9, (K, 2))


def person_at(x: float, y: float, rng: np.random.Generator, noise: float = NOISE) -> Person:
    """A person whose box's top-left corner is at (x, y): keypoints spread over the box, with noise."""
    box = np.array([x, y, *BOX])
    points = box[:2] + _layout * BOX + rng.normal(0, noise, (K, 2))
    return Person(box, points, np.full(K, 0.9), 0.95)


def crossing(frames: int = 60, seed: int = 0) -> list[list[Person]]:
    """Two persons walking towards each other along the same line, crossing halfway."""
    rng = np.random.default_rng(seed)
    clip = []
    for t in range(frames):
        step = t / (frames - 1)
        clip.append([person_at(20 + 500 * step, 80, rng), person_at(520 - 500 * step, 90, rng)])
    return clip


def apart(first: Person, second: Person) -> bool:
    return first.box[0] + first.box[2] < second.box[0] or second.box[0] + second.box[2] < first.box[0]


def test_two_persons_keep_their_ids_until_they_cross():
    tracker = PersonTracker()
    clip = crossing()
    ids = [tracker.update(persons) for persons in clip]
    assert ids[0] == [1, 2]
    # Until the boxes meet, every frame gives each person the id of the first frame: no switch.
    first_meeting = next(t for t, persons in enumerate(clip) if not apart(*persons))
    assert all(frame_ids == [1, 2] for frame_ids in ids[:first_meeting])
    assert first_meeting > 10  # the clip does have frames before the crossing
    # After they part, no new id appears: the two tracks go on (whichever way they were matched).
    last_meeting = max(t for t, persons in enumerate(clip) if not apart(*persons))
    assert all(sorted(frame_ids) == [1, 2] for frame_ids in ids[last_meeting + 1 :])
    assert len({frame_ids[0] for frame_ids in ids[last_meeting + 1 :]}) == 1


@pytest.mark.parametrize(("absence", "same_id"), [(5, True), (40, False)])
def test_a_person_who_leaves_and_comes_back(absence, same_id):
    rng = np.random.default_rng(1)
    tracker = PersonTracker(max_missing=30)
    for _ in range(10):
        assert tracker.update([person_at(100, 80, rng), person_at(400, 80, rng)]) == [1, 2]
    for _ in range(absence):  # the second person is out of the frame
        assert tracker.update([person_at(100, 80, rng)]) == [1]
    back = tracker.update([person_at(100, 80, rng), person_at(400, 80, rng)])
    assert back == [1, 2] if same_id else back == [1, 3]


def jitter(points: np.ndarray) -> float:
    """Mean frame-to-frame displacement of the keypoints of a clip (frames, K, 2)."""
    return float(np.linalg.norm(np.diff(points, axis=0), axis=2).mean())


def test_smoothing_cuts_the_jitter_of_a_still_person_by_at_least_three():
    rng = np.random.default_rng(2)
    smooth = KeypointFilter()
    raw = [person_at(200, 80, rng) for _ in range(100)]
    shown = [smooth(p.keypoints, p.scores >= 0.3, 1 / FPS, BOX.max()) for p in raw]
    raw_jitter, shown_jitter = jitter(np.array([p.keypoints for p in raw])[10:]), jitter(np.array(shown)[10:])
    assert raw_jitter > 2 and shown_jitter < raw_jitter / 3


def test_smoothing_lags_a_walking_person_by_less_than_one_frame_of_motion():
    rng = np.random.default_rng(3)
    smooth = KeypointFilter()
    speed = 8.0  # pixels per frame: one person height per second at 25 frames per second
    errors = []
    for t in range(100):
        person = person_at(20 + speed * t, 80, rng)
        shown = smooth(person.keypoints, person.scores >= 0.3, 1 / FPS, BOX.max())
        if t >= 20:
            truth = np.array([20 + speed * t, 80]) + _layout * BOX
            errors.append(np.linalg.norm(shown - truth, axis=1).mean())
    assert np.mean(errors) < speed


def test_a_keypoint_below_the_threshold_is_not_dragged_from_where_it_was():
    smooth = KeypointFilter()
    points, confident = np.zeros((3, 2)), np.ones(3, dtype=bool)
    for _ in range(10):
        smooth(points, confident, 1 / FPS, 100)
    hidden = confident.copy()
    hidden[1] = False
    smooth(points + [[0, 0], [500, 500], [0, 0]], hidden, 1 / FPS, 100)  # passed through as it is
    moved = points + [[0, 0], [300, 300], [0, 0]]
    shown = smooth(moved, confident, 1 / FPS, 100)
    assert shown[1].tolist() == [300, 300]  # seen again: starts there, not on its way from (0, 0)
    assert shown[0].tolist() == [0, 0]


def test_a_box_around_the_keypoints_needs_a_few_confident_ones_and_stays_in_the_image():
    person = person_at(100, 50, np.random.default_rng(4), noise=0)
    box = box_from_keypoints(person, 0.3, (HEIGHT, WIDTH))
    assert box[0] < 100 + 0.1 * BOX[0] and box[2] == pytest.approx(0.8 * BOX[0] * 1.2, rel=0.05)
    # Keypoints far outside the frame (a model's guesses for someone leaving) give a box inside it.
    person.keypoints[:2] = [[-5000, -5000], [9000, 9000]]
    assert box_from_keypoints(person, 0.3, (HEIGHT, WIDTH)).tolist() == [0, 0, WIDTH, HEIGHT]
    person.keypoints[:] = [WIDTH + 50, 10]  # all to the right of the frame
    assert box_from_keypoints(person, 0.3, (HEIGHT, WIDTH)) is None
    person.scores[:] = 0.1
    assert box_from_keypoints(person, 0.3, (HEIGHT, WIDTH)) is None


def frame_result(persons: list[Person], given: Detections | None):
    """What pose gives for a frame: the stand-in detector's boxes are the true ones; between detections the
    persons come in the given boxes' order, with the given boxes."""
    if given is not None:
        persons = [dataclasses.replace(p, box=box) for p, box in zip(persons, given.boxes_xywh, strict=True)]
    boxes = np.array([p.box for p in persons], dtype=np.float32)
    found = Detections(boxes, np.full(len(persons), 0.95, dtype=np.float32), found=len(persons))
    photo = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    prediction = PosePrediction(photo, "stand-in", persons, found, META.names, META)
    options = get_task("pose").coerce_options({})
    return draw_result(TaskResult("pose", "stand-in", prediction, options))


def tracker_for(**values) -> PoseTracker:
    options, video_options = get_task("pose").coerce_video_options(values)
    return PoseTracker({**options, **video_options})


def test_the_pose_tracker_detects_every_n_frames_and_writes_the_ids():
    tracker = tracker_for(detect_every=4)
    assert tracker.sequential
    detected = []
    for t, persons in enumerate(crossing()[:12]):
        given = tracker.given()
        detected.append(given is None)
        if given is not None:
            boxes = given["given_boxes"].boxes_xywh
            assert len(boxes) == 2 and np.all(boxes[:, 2:] > 0.5 * BOX)  # around each person
        result = tracker.follow(
            np.zeros((HEIGHT, WIDTH, 3), np.uint8),
            frame_result(persons, given and given["given_boxes"]),
            1 / FPS,
        )
        assert [p.track_id for p in result.prediction.persons] == [1, 2], t
    assert detected == [True, False, False, False] * 3
    assert tracker.notes == ["The person detector ran on 3 of 12 frames (every 4)."]
    # The ids are drawn: the picture differs from the one drawn without them.
    result = draw_result(result)
    assert not np.array_equal(result.pictures[0][1], frame_result(crossing()[11], None).pictures[0][1])


def test_without_tracking_the_ids_are_left_out_and_the_detector_runs_every_frame():
    tracker = tracker_for(track=False, smoothing=False, detect_every=1)
    assert not tracker.sequential
    for persons in crossing(5):
        assert tracker.given() is None
        result = tracker.follow(np.zeros((HEIGHT, WIDTH, 3), np.uint8), frame_result(persons, None), 1 / FPS)
        assert [p.track_id for p in result.prediction.persons] == [None, None]
        assert np.array_equal(result.prediction.persons[0].keypoints, persons[0].keypoints)
    assert tracker.notes == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"detect_every": 0}, "Option 'detect_every' must be a number between 1 and 30, not 0."),
        ({"beta": "fast"}, "Option 'beta' must be a number between 0 and 50, not 'fast'."),
        ({"tracking": True}, "Pose has no option 'tracking'"),
    ],
)
def test_bad_video_options_are_refused_by_name(values, message):
    from sapiens2.errors import RequestError

    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        get_task("pose").coerce_video_options(values)


def test_where_every_model_call_is_a_gpu_call_the_detector_runs_on_every_frame():
    options, video_options = get_task("pose").coerce_video_options({"detect_every": 5})
    tracker = PoseTracker({**options, **video_options}, batched=True)
    assert not tracker.sequential
    for persons in crossing(3):
        assert tracker.given() is None
        tracker.follow(np.zeros((HEIGHT, WIDTH, 3), np.uint8), frame_result(persons, None), 1 / FPS)
    assert (
        "The person detector ran on every frame: here each model call is a call to the GPU"
        in tracker.notes[0]
    )
