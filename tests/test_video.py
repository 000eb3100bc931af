"""Videos: a synthetic clip through pose and segmentation, frame selection, the decoding thread, failures."""

import json
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest

from sapiens2.batch.video import (
    FrameReader,
    VideoError,
    VideoFileWriter,
    VideoJob,
    planned_frames,
    process_video,
    video_info,
    video_outputs,
)
from sapiens2.runtime.runtime import Runtime
from sapiens2.tasks.registry import get_task

ASSETS = Path(__file__).resolve().parents[1] / "assets"
FRAMES, HEIGHT, WIDTH, FPS = 6, 256, 192, 12.0
KEYPOINTS = 308


def read_video(path: Path) -> tuple[list[np.ndarray], float]:
    """Every frame (RGB) of a video and its frame rate, read back with OpenCV."""
    capture = cv2.VideoCapture(str(path))
    assert capture.isOpened()
    frames = []
    while True:
        ok, bgr = capture.read()
        if not ok:
            break
        frames.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    fps = capture.get(cv2.CAP_PROP_FPS)
    capture.release()
    return frames, fps


def write_clip(path: Path, count: int = FRAMES) -> list[np.ndarray]:
    """An mp4v clip of the example photos at 256x192, each frame shifted a little; returns its RGB frames."""
    photos = [
        cv2.resize(cv2.imread(str(ASSETS / name)), (WIDTH, HEIGHT))
        for name in ("grace_hopper.jpg", "astronaut.png")
    ]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
    for index in range(count):
        writer.write(np.roll(photos[index % 2], 4 * index, axis=1))
    writer.release()
    return read_video(path)[0]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> tuple[Path, list[np.ndarray]]:
    path = tmp_path_factory.mktemp("clip") / "walk.mp4"
    return path, write_clip(path)


@pytest.fixture(scope="module")
def runtime(small_mirror, few_persons_yolo):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAPIENS2_CHECKPOINT_DIR", str(small_mirror))
        yield Runtime(device="cpu", dtype="fp32", detector=few_persons_yolo, batch_size=4)


def no_hidden_files(folder: Path) -> bool:
    return not any(path.name.startswith(".") for path in folder.iterdir())


def test_the_synthetic_clip_reads_back(clip):
    path, frames = clip
    assert len(frames) == FRAMES and frames[0].shape == (HEIGHT, WIDTH, 3)
    info = video_info(path)
    assert (info.fps, info.frame_count, info.width, info.height) == (FPS, FRAMES, WIDTH, HEIGHT)


def test_pose_video_and_its_frame_list(runtime, clip, tmp_path):
    path, _ = clip
    calls = []
    # Detecting in every frame, frames go through the model in batches (of 4 here).
    job = VideoJob("pose", path, tmp_path, options={"detect_every": 1})
    result = process_video(runtime, job, progress=lambda f, text: calls.append((f, text)))
    assert result.files == video_outputs(get_task("pose"), tmp_path, "walk")
    names = ("walk_pose.webm", "walk_controlnet.webm", "walk_predictions.json")
    assert result.files == [tmp_path / name for name in names]
    frames, fps = read_video(result.video_path)
    assert len(frames) == FRAMES and frames[0].shape == (HEIGHT, WIDTH, 3) and fps == FPS
    # The ControlNet drawing of every frame, at the frame's size: OpenPose's colours on black.
    drawings, _ = read_video(tmp_path / "walk_controlnet.webm")
    assert len(drawings) == FRAMES and drawings[0].shape == (HEIGHT, WIDTH, 3)
    assert all(np.median(drawing) < 10 for drawing in drawings)
    assert (result.frames, result.fps, result.notes) == (FRAMES, FPS, [])
    assert result.frames_per_second > 0
    # Before the first batch ends the page already says what is happening (after loading the model, if it
    # was not loaded yet); each batch ends with its count.
    frames = [call for call in calls if " frames" in call[1]]
    assert frames[0] == (0.0, f"0 of {FRAMES} frames: decoding")
    assert (0.0, f"0 of {FRAMES} frames: detecting persons") in frames
    ends = [call for call in frames if call[1].endswith(" frames")]
    assert ends == [(4 / FRAMES, f"4 of {FRAMES} frames"), (1.0, f"{FRAMES} of {FRAMES} frames")]
    assert [fraction for fraction, _ in frames] == sorted(fraction for fraction, _ in frames)

    document = json.loads(result.log_path.read_text())
    assert document["video"] == "walk" and document["image_size"] == [HEIGHT, WIDTH]
    assert document["num_keypoints"] == KEYPOINTS and document["kpt_thr_used"] == 0.3
    assert [frame["image_name"] for frame in document["frames"]] == [f"{i:06d}" for i in range(FRAMES)]
    instances = [instance for frame in document["frames"] for instance in frame["instances"]]
    assert len(instances) == result.persons and all(frame["instances"] for frame in document["frames"])
    for instance in instances:
        assert len(instance["bbox"]) == 4 and instance["bbox"][2] <= WIDTH and instance["bbox"][3] <= HEIGHT
        assert (
            np.shape(instance["keypoints"]) == (KEYPOINTS, 2)
            and len(instance["keypoint_scores"]) == KEYPOINTS
        )
    assert no_hidden_files(tmp_path)


def test_pose_video_writes_the_keypoint_formats_of_every_frame(runtime, clip, tmp_path):
    path, _ = clip
    options = {"keypoint_format": ["coco17", "openpose"]}
    job = VideoJob("pose", path, tmp_path, options=options, write_video=False)
    result = process_video(runtime, job)
    expected = [tmp_path / name for name in ("walk_predictions.json", "walk_coco17.json", "walk_openpose")]
    assert result.files == expected
    assert video_outputs(get_task("pose"), tmp_path, "walk", write_video=False, options=options) == expected
    log = json.loads(result.log_path.read_text())["frames"]
    coco = json.loads((tmp_path / "walk_coco17.json").read_text())
    assert sorted({entry["image_id"] for entry in coco}) == list(range(FRAMES))
    first = log[0]["instances"][0]["keypoints"]
    assert coco[0]["keypoints"][:2] == pytest.approx(first[0], abs=0.01)
    frames = sorted(path.name for path in (tmp_path / "walk_openpose").iterdir())
    assert frames == [f"walk_{index:012d}_keypoints.json" for index in range(FRAMES)]
    document = json.loads((tmp_path / "walk_openpose" / frames[0]).read_text())
    assert len(document["people"]) == len(log[0]["instances"])
    assert len(document["people"][0]["pose_keypoints_2d"]) == 75
    assert no_hidden_files(tmp_path)


class CountingDetector:
    """The real yolo11n detector of the tests, counting the frames it is asked about."""

    def __init__(self, weights: str):
        from sapiens2.vision.detector import YoloPersonDetector

        self.detector, self.calls = YoloPersonDetector(weights), 0

    def detect(self, image_rgb: np.ndarray):
        self.calls += 1
        return self.detector.detect(image_rgb)


def test_pose_video_tracks_its_persons_and_detects_every_n_frames(
    small_mirror, few_persons_yolo, clip, tmp_path
):
    path, _ = clip
    detector = CountingDetector(few_persons_yolo)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAPIENS2_CHECKPOINT_DIR", str(small_mirror))
        runtime = Runtime(device="cpu", dtype="fp32", detector=detector, batch_size=4)
        # Threshold 0: every keypoint of the random model counts, so each person gets a box between
        # detections.
        formats = ["sapiens308", "coco17", "openpose"]
        options = {"detect_every": 3, "threshold": 0.0, "keypoint_format": formats}
        result = process_video(runtime, VideoJob("pose", path, tmp_path, options=options))
    assert detector.calls == 2  # frames 0 and 3
    assert result.notes == [f"The person detector ran on 2 of {FRAMES} frames (every 3)."]
    frames = json.loads(result.log_path.read_text())["frames"]
    ids = [[instance["track_id"] for instance in frame["instances"]] for frame in frames]
    assert ids[0] == list(range(1, len(ids[0]) + 1))
    assert all(frame_ids == ids[0] for frame_ids in ids[1:3])  # the boxes of frames 1 and 2 follow 0's
    coco = json.loads((tmp_path / "walk_coco17.json").read_text())
    assert [entry["track_id"] for entry in coco if entry["image_id"] == 0] == ids[0]
    first = json.loads((tmp_path / "walk_openpose" / "walk_000000000000_keypoints.json").read_text())
    assert [person["person_id"] for person in first["people"]] == [[i] for i in ids[0]]


def test_pose_video_without_tracking_writes_no_ids(runtime, clip, tmp_path):
    path, _ = clip
    options = {"track": False, "smoothing": False, "detect_every": 1}
    result = process_video(runtime, VideoJob("pose", path, tmp_path, options=options, write_video=False))
    frames = json.loads(result.log_path.read_text())["frames"]
    assert frames[0]["instances"] and not any("track_id" in i for f in frames for i in f["instances"])
    assert result.notes == []


def test_segmentation_video_shows_each_frame_overlay_in_order(runtime, clip, tmp_path):
    path, source = clip
    result = process_video(runtime, VideoJob("segment", path, tmp_path, options={"opacity": 0.8}))
    assert result.log_path is None and result.persons is None
    assert result.files == [tmp_path / "walk_segment.webm"]
    frames, fps = read_video(result.video_path)
    assert len(frames) == FRAMES and frames[0].shape == (HEIGHT, WIDTH, 3) and fps == FPS
    overlays = [result.pictures[0][1] for result in runtime.run_batch("segment", source, opacity=0.8)]
    for index, (written, original) in enumerate(zip(frames, source, strict=True)):
        # mp4v blurs the noisy overlay of a random model, yet each frame stays nearest to its own overlay.
        distances = [np.abs(written.astype(int) - overlay).mean() for overlay in overlays]
        assert np.argmin(distances) == index
        assert distances[index] < np.abs(written.astype(int) - original).mean()


@pytest.mark.parametrize(
    ("options", "frames", "fps"),
    [
        ({"stride": 2}, 3, FPS / 2),
        ({"max_frames": 2}, 2, FPS),
        ({"stride": 4, "max_frames": 5}, 2, FPS / 4),
        ({"max_seconds": 0.25}, 3, FPS),
    ],
)
def test_stride_and_limits_choose_the_frames(runtime, clip, tmp_path, options, frames, fps):
    path, _ = clip
    expected = planned_frames(video_info(path), **options)
    result = process_video(runtime, VideoJob("segment", path, tmp_path, **options))
    assert result.frames == expected == frames and result.fps == fps
    written, rate = read_video(result.video_path)
    assert len(written) == frames and rate == pytest.approx(fps)
    notes = {
        "max_seconds": ["Only the first 0.25 s of this 0.5 s video were processed."],
        "max_frames": ["Only the first 2 frames of this video were processed (the limit per video)."],
    }
    cut = [
        name
        for name in ("max_seconds", "max_frames")
        if name in options and frames < FRAMES / options.get("stride", 1)
    ]
    assert result.notes == (notes[cut[0]] if cut else [])


def test_an_mp4_fast_to_write(runtime, clip, tmp_path):
    path, _ = clip
    result = process_video(runtime, VideoJob("segment", path, tmp_path, max_frames=3, video_format="mp4"))
    assert result.files == [tmp_path / "walk_segment.mp4"]
    frames, fps = read_video(result.video_path)
    assert len(frames) == 3 and frames[0].shape == (HEIGHT, WIDTH, 3) and fps == FPS
    with pytest.raises(ValueError, match="not one of mp4, webm"):
        VideoJob("segment", path, tmp_path, video_format="gif")


def test_writing_a_webm_prints_nothing_on_stderr(tmp_path, capfd):
    capfd.readouterr()
    with VideoFileWriter(tmp_path / "clip.webm", FPS) as sink:
        for value in range(3):
            sink.write(np.full((HEIGHT, WIDTH, 3), 60 * value, np.uint8))
    assert capfd.readouterr().err == ""
    assert len(read_video(tmp_path / "clip.webm")[0]) == 3


class FakeCapture:
    """Stands in for cv2.VideoCapture: numbered frames, recording which thread decodes and what is skipped."""

    def __init__(self, count: int):
        self.count, self.position = count, 0
        self.threads: set[str] = set()
        self.decoded: list[int] = []

    def grab(self) -> bool:
        self.position += 1
        return self.position <= self.count

    def read(self) -> tuple[bool, np.ndarray | None]:
        self.threads.add(threading.current_thread().name)
        if self.position >= self.count:
            return False, None
        self.decoded.append(self.position)
        self.position += 1
        return True, np.full((2, 2, 3), self.position - 1, dtype=np.uint8)


def test_frames_are_decoded_on_a_background_thread_through_a_bounded_queue():
    capture = FakeCapture(10)
    with FrameReader(capture, stride=3) as reader:
        items = list(reader)
    assert [index for index, _ in items] == [0, 3, 6, 9] and capture.decoded == [0, 3, 6, 9]
    assert [int(rgb[0, 0, 0]) for _, rgb in items] == [0, 3, 6, 9]
    assert capture.threads == {"sapiens2-video-decode"}

    capture = FakeCapture(1000)
    with FrameReader(capture, queue_size=2) as reader:
        first = next(iter(reader))
        threading.Event().wait(0.2)  # let the decoder fill the queue
        assert first[0] == 0 and len(capture.decoded) <= 4
    assert len(capture.decoded) <= 5  # leaving the block stopped the decoder


def test_a_damaged_video_is_refused_by_name(runtime, tmp_path):
    damaged = tmp_path / "damaged.mp4"
    damaged.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8)
    with pytest.raises(VideoError, match="damaged.mp4"):
        process_video(runtime, VideoJob("segment", damaged, tmp_path / "out"))
    with pytest.raises(VideoError, match="No file named .missing.mp4. was found"):
        video_info(tmp_path / "missing.mp4")
    assert not (tmp_path / "out").exists()


def test_a_failure_midway_leaves_no_partial_video(runtime, clip, tmp_path, monkeypatch):
    path, _ = clip
    calls = []

    def failing_second_batch(task, images, **options):
        calls.append(len(images))
        if len(calls) == 2:
            raise RuntimeError("out of patience")
        return Runtime.run_batch(runtime, task, images, **options)

    monkeypatch.setattr(runtime, "run_batch", failing_second_batch)
    with pytest.raises(RuntimeError, match="out of patience"):
        process_video(runtime, VideoJob("segment", path, tmp_path))
    assert calls == [4, 2] and list(tmp_path.iterdir()) == []
