"""The command line on folders of photos and on videos, with tiny checkpoints run at 256x192."""

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_video import read_video, write_clip

from sapiens2.cli import EXIT_NOTHING_SUCCEEDED, EXIT_OK, build_parser, main
from sapiens2.data.metadata import body_parts
from sapiens2.models.hub import CHECKPOINT_DIR_ENV
from sapiens2.pipelines.segment import chosen_class_ids
from sapiens2.runtime.runtime import Runtime
from sapiens2.tasks import export_result
from sapiens2.tasks.registry import ALL_TASKS, TASKS
from sapiens2.vision.part_masks import part_mask

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"
# Photo -> its output stem under the output folder: subfolders are kept.
PHOTOS = {"grace_hopper.jpg": "grace_hopper", "people/astronaut.png": "people/astronaut"}


def run_cli(*argv: str) -> tuple[int, str]:
    """main(argv) in this process: its exit status and printed text; the environment is restored after."""
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.delenv(CHECKPOINT_DIR_ENV, raising=False)
        status = main([str(arg) for arg in argv])
    return status, printed.getvalue()


def expected_files(task: str, stem: str) -> set[str]:
    """The files a photo gets from `task` with every export kind and picture and the default options, as
    main's layout names them."""
    exported = set(TASKS[task].exports_for({}))
    exports = {f"{stem}{suffix}" for suffix in exported}
    pictures = {f"{stem}{p.suffix}.png" for p in TASKS[task].pictures if p.same_as not in exported}
    return exports | pictures


def test_each_thing_has_one_file_name():
    names = set().union(*(expected_files(task, "photo") for task in TASKS))
    assert names == {
        "photo_pose.json", "photo_pose.png", "photo_controlnet.png",
        "photo_segmentation.png", "photo_segmentation.npy",
        "photo_segmentation_overlay.png", "photo_segmentation_legend.png",
        "photo_parts_mask.png", "photo_parts_cutout.png",
        "photo_normals.npy", "photo_normals.png", "photo_normals_16bit.png",
        "photo_depth.npy", "photo_depth.png", "photo_points.ply",
        "photo_depth_16bit.png", "photo_depth.json", "photo_mesh.glb",
        "photo_alpha.png", "photo_cutout.png", "photo_composite.png",
        "photo_cls.npy", "photo_patches.npy", "photo_features_pca.png",
    }  # fmt: skip


def files_under(folder: Path) -> set[str]:
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """The example photos (one in a subfolder), a truncated photo, a text file and a hidden file."""
    folder = tmp_path_factory.mktemp("photos")
    (folder / "people").mkdir()
    shutil.copy(ASSETS / "grace_hopper.jpg", folder / "grace_hopper.jpg")
    shutil.copy(ASSETS / "astronaut.png", folder / "people/astronaut.png")
    (folder / "broken.jpg").write_bytes((ASSETS / "grace_hopper.jpg").read_bytes()[:4000])
    (folder / "notes.txt").write_text("not a photo")
    shutil.copy(ASSETS / "astronaut.png", folder / ".hidden.png")
    return folder


@pytest.fixture(scope="module")
def setup_args(small_mirror, few_persons_yolo) -> list[str]:
    return ["--checkpoint-dir", small_mirror, "--detector", few_persons_yolo, "--device", "cpu"]


@pytest.fixture(scope="module")
def first_run(photos, setup_args, tmp_path_factory):
    """`sapiens2 all PHOTOS --out OUT` once for the module: (output folder, exit status, printed text)."""
    out = tmp_path_factory.mktemp("out")
    status, printed = run_cli("all", photos, "--out", out, "--batch-size", 2, *setup_args)
    return out, status, printed


def test_help_runs_as_a_program():
    done = subprocess.run(
        [sys.executable, "-m", "sapiens2", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: sapiens2") and "--no-flip-test" in done.stdout
    assert "sapiens2 train TASK --data DIR --model REPO_OR_PATH --out DIR" in " ".join(done.stdout.split())


def test_every_registry_option_has_a_flag():
    parser = build_parser()
    args = parser.parse_args(["pose", "x.jpg", "--out", "o"])
    for task in TASKS.values():
        for option in task.options:
            assert getattr(args, option.name) is None
    args = parser.parse_args(
        ["all", "x", "--out", "o", "--threshold", "0.5", "--no-flip-test", "--opacity", "1"]
        + ["--remove-background", "--background-color", "rgb(1, 2, 3)", "--exports", "json,npy"]
    )
    assert (args.threshold, args.flip_test, args.opacity, args.remove_background) == (0.5, False, 1.0, True)
    assert args.background_color == (1, 2, 3) and args.exports == {"json", "npy"}
    args = parser.parse_args(["pose", "x", "--out", "o", "--keypoint-format", "openpose,coco17"]
                             + ["--keypoint-format", "wholebody133"])  # fmt: skip
    assert TASKS["pose"].coerce_options({"keypoint_format": args.keypoint_format})["keypoint_format"] == (
        "sapiens308", "coco17", "wholebody133", "openpose")  # fmt: skip


def test_keypoint_formats_and_the_controlnet_picture_from_the_command_line(photos, setup_args, tmp_path):
    photo = photos / "grace_hopper.jpg"
    chosen = ["--keypoint-format", "coco17", "--keypoint-format", "openpose,sapiens308"]
    status, _ = run_cli("pose", photo, "--out", tmp_path, *chosen, *setup_args)
    assert status == EXIT_OK
    stems = ("_pose.json", "_coco17.json", "_openpose.json", "_controlnet.png", "_pose.png")
    assert files_under(tmp_path) == {f"grace_hopper{suffix}" for suffix in stems}
    (entry, *_) = json.loads((tmp_path / "grace_hopper_coco17.json").read_text())
    assert entry["image_id"] == "grace_hopper" and len(entry["keypoints"]) == 51
    native = json.loads((tmp_path / "grace_hopper_pose.json").read_text())["persons"][0]["keypoints"]
    assert entry["keypoints"][:2] == pytest.approx([native[0]["x"], native[0]["y"]], abs=0.01)
    people = json.loads((tmp_path / "grace_hopper_openpose.json").read_text())["people"]
    assert [len(people[0][key]) for key in ("pose_keypoints_2d", "face_keypoints_2d")] == [75, 210]

    only = tmp_path / "no_extras"
    status, _ = run_cli("pose", photo, "--out", only, "--keypoint-format", "", "--no-pictures", *setup_args)
    assert status == EXIT_OK
    assert files_under(only) == {"grace_hopper_pose.json", "grace_hopper_controlnet.png"}


@pytest.mark.parametrize("chosen", [["coco17"], ["wholebody133", "openpose"], ["openpose,coco17"]])
def test_keypoint_formats_are_added_beside_the_native_pose_json(photos, setup_args, tmp_path, chosen):
    flags = [part for name in chosen for part in ("--keypoint-format", name)]
    status, _ = run_cli("pose", photos / "grace_hopper.jpg", "--out", tmp_path, *flags, *setup_args)
    assert status == EXIT_OK
    native = json.loads((tmp_path / "grace_hopper_pose.json").read_text())
    assert len(native["persons"][0]["keypoints"]) == 308
    suffixes = {"coco17": "_coco17.json", "wholebody133": "_wholebody.json", "openpose": "_openpose.json"}
    extras = {suffixes[name] for part in chosen for name in part.split(",")}
    assert {f"grace_hopper{suffix}" for suffix in extras} <= files_under(tmp_path)


def test_the_keypoint_format_help_says_the_native_file_always_comes():
    (formats,) = [action for action in build_parser()._actions if action.dest == "keypoint_format"]
    assert "_pose.json" in formats.help and "always" in formats.help
    assert "default sapiens308 only" in formats.help


def test_body_part_masks_from_the_command_line(photos, setup_args, tmp_path):
    photo = photos / "grace_hopper.jpg"
    chosen = ["--parts", "face", "--parts", "Hair,Apparel", "--grow=-2", "--feather", "1.5"]
    status, _ = run_cli("segment", photo, "--out", tmp_path, *chosen, *setup_args)
    assert status == EXIT_OK
    labels = np.asarray(Image.open(tmp_path / "grace_hopper_segmentation.png"))
    ids = chosen_class_ids(["face", "Hair", "Apparel"], body_parts())
    expected = part_mask(labels, ids, grow=-2, feather=1.5)
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "grace_hopper_parts_mask.png")), expected)
    cutout = np.asarray(Image.open(tmp_path / "grace_hopper_parts_cutout.png"))
    assert cutout.shape == (*labels.shape, 4)
    np.testing.assert_array_equal(cutout[..., 3], expected)

    status, printed = run_cli("segment", photo, "--out", tmp_path / "paws", "--parts", "paws", *setup_args)
    assert status == EXIT_NOTHING_SUCCEEDED and "no class 'paws'" in printed


def test_device_dependent_default_is_stated_in_the_help():
    (flip,) = [action for action in build_parser()._actions if action.dest == "flip_test"]
    assert "(default on with a GPU, off on the CPU)" in flip.help
    (smooth,) = [action for action in build_parser()._actions if action.dest == "smooth"]
    assert "(default on) [depth]" in smooth.help


def test_fast_default_precision_and_the_library_one_are_stated_in_the_help():
    (dtype,) = [action for action in build_parser()._actions if action.dest == "dtype"]
    assert "else the fast one: bf16 on CUDA and on CPUs with native bf16" in dtype.help
    assert "fp32 gives transformers' outputs" in dtype.help and "sapiens2.from_pretrained" in dtype.help


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pose", "x", "--out", "o", "--threshold", "2"], "between 0 and 1"),
        (["pose", "x", "--out", "o", "--keypoint-format", "body25"], "any of coco17, wholebody133, openpose"),
        (["segment", "x", "--out", "o", "--background-color", "mauve-ish"], "must be a colour"),
        (["pose", "x", "--out", "o", "--opacity", "0.5"], "--opacity is an option of segment, not of pose"),
        (["all", "x", "--out", "o", "--model", "some/where"], "choose one task"),
        (["matting", "x", "--out", "o", "--size", "0.4b"], "no 0.4b model exists for matting"),
        (["pose", "x", "--out", "o", "--no-pictures", "--exports", "none"], "nothing to write"),
        (["pose", "x", "--out", "o", "--exports", "gif"], "export kinds are"),
        (["pose", "x", "--out", "o", "--batch-size", "0"], "at least 1"),
        (["pose", "x", "--out", "o", "--device", "quantum"], "not understood"),
    ],
)
def test_usage_errors_exit_with_status_2(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_export_suffixes_match_what_each_task_writes(small_mirror, few_persons_yolo, tmp_path, monkeypatch):
    monkeypatch.setenv("SAPIENS2_CHECKPOINT_DIR", str(small_mirror))
    runtime = Runtime(device="cpu", detector=few_persons_yolo)
    photo = np.zeros((64, 48, 3), dtype=np.uint8)
    for name in TASKS:
        written = export_result(runtime.run(name, photo), tmp_path, "x")
        assert sorted(path.name[1:] for path in written) == sorted(TASKS[name].exports_for({})), name


def test_a_folder_gets_every_output_and_the_broken_photo_is_reported(first_run):
    out, status, printed = first_run
    assert status == EXIT_OK
    expected = {name for task in ALL_TASKS for stem in PHOTOS.values() for name in expected_files(task, stem)}
    assert files_under(out) == expected
    # One name per thing: the matting alpha, cut-out and composite (and the parts' mask and cut-out) are
    # written once, as exports.
    assert {name.removeprefix("grace_hopper") for name in expected if name.startswith("grace")} == {
        *("_pose.json", "_pose.png", "_controlnet.png", "_segmentation.png", "_segmentation.npy"),
        *("_segmentation_overlay.png", "_parts_mask.png", "_parts_cutout.png"),
        *("_segmentation_legend.png", "_normals.npy", "_normals.png", "_depth.npy", "_points.ply"),
        *("_depth.png", "_alpha.png", "_cutout.png", "_composite.png"),
        *("_normals_16bit.png", "_depth_16bit.png", "_depth.json", "_mesh.glb"),
    }
    assert "Done in" in printed and f"{len(expected)} files written" in printed
    assert "broken.jpg: The image file is incomplete" in printed and "1 failure:" in printed
    assert "notes.txt" not in printed and "hidden" not in printed
    assert "pose: 2 images, " in printed and " persons found, " in printed and " s per image" in printed
    document = json.loads((out / "grace_hopper_pose.json").read_text())
    assert document["image"] == {"width": 512, "height": 600} and 1 <= len(document["persons"]) <= 4


def test_all_reads_each_photo_once_runs_the_body_part_model_once_and_writes_what_each_task_alone_does(
    photos, setup_args, tmp_path, monkeypatch
):
    """Every task on a batch of photos before the next batch: normals and depth take the body-part task's
    labels of the same photo; the files are those of each task run alone, byte for byte."""
    import sapiens2.batch.local as local
    from sapiens2.models.modeling import Sapiens2ForSemanticSegmentation

    alone = tmp_path / "alone"
    for task in ALL_TASKS:
        assert run_cli(task, photos, "--out", alone, "--batch-size", 2, *setup_args)[0] == EXIT_OK
    reads, body_part_images = [], []
    read, forward = local.load_image, Sapiens2ForSemanticSegmentation.forward

    def counted_read(path, *args, **kwargs):
        reads.append(Path(path).name)
        return read(path, *args, **kwargs)

    def counted_forward(self, pixel_values, *args, **kwargs):
        body_part_images.append(len(pixel_values))
        return forward(self, pixel_values, *args, **kwargs)

    monkeypatch.setattr(local, "load_image", counted_read)
    monkeypatch.setattr(Sapiens2ForSemanticSegmentation, "forward", counted_forward)
    together = tmp_path / "together"
    assert run_cli("all", photos, "--out", together, "--batch-size", 2, *setup_args)[0] == EXIT_OK
    assert sorted(reads) == ["astronaut.png", "broken.jpg", "grace_hopper.jpg"]  # the broken one fails once
    assert sum(body_part_images) == len(PHOTOS)
    assert files_under(together) == files_under(alone)
    different = [
        name for name in files_under(alone) if (alone / name).read_bytes() != (together / name).read_bytes()
    ]
    assert different == []


def test_a_rerun_skips_existing_outputs_and_overwrite_rewrites_them(first_run, photos, setup_args):
    out, _, _ = first_run
    before = {path: path.stat().st_mtime_ns for path in out.rglob("*") if path.is_file()}
    status, printed = run_cli("all", photos, "--out", out, *setup_args)
    assert status == EXIT_OK and "0 files written" in printed and f"{len(before)} already there" in printed
    assert "broken.jpg" in printed  # still reported: it has no outputs
    assert {path: path.stat().st_mtime_ns for path in before} == before

    status, printed = run_cli("segment", photos, "--out", out, "--overwrite", *setup_args)
    rewritten = {path for path in before if path.stat().st_mtime_ns != before[path]}
    segment = {out / name for stem in PHOTOS.values() for name in expected_files("segment", stem)}
    assert status == EXIT_OK and rewritten == segment and f"{len(segment)} files written" in printed


def test_chosen_exports_only_and_photos_that_differ_by_extension(photos, setup_args, tmp_path):
    folder = tmp_path / "twins"
    folder.mkdir()
    shutil.copy(photos / "grace_hopper.jpg", folder / "photo.jpg")
    shutil.copy(photos / "people/astronaut.png", folder / "photo.png")
    out = folder / "results"  # inside the input folder: never read back as input
    for _ in range(2):
        status, _ = run_cli("segment", folder, "--out", out, "--no-pictures", "--exports", "npy", *setup_args)
        assert status == EXIT_OK
    assert files_under(out) == {"photo.jpg_segmentation.npy", "photo.png_segmentation.npy"}
    first = np.load(out / "photo.jpg_segmentation.npy")
    assert first.shape == (600, 512) and np.load(out / "photo.png_segmentation.npy").shape == (512, 512)


def test_depth_writes_its_mesh_and_its_camera_when_glb_and_json_are_chosen(photos, setup_args, tmp_path):
    photo = photos / "grace_hopper.jpg"
    chosen = ("--no-pictures", "--exports", "glb,json")
    status, _ = run_cli("depth", photo, "--out", tmp_path, *chosen, *setup_args)
    assert status == EXIT_OK
    assert files_under(tmp_path) == {"grace_hopper_mesh.glb", "grace_hopper_depth.json"}
    assert (tmp_path / "grace_hopper_mesh.glb").read_bytes()[:4] == b"glTF"
    document = json.loads((tmp_path / "grace_hopper_depth.json").read_text())
    assert document["image"] == {"width": 512, "height": 600} and document["mesh"]["grid_step"] == 1


def test_model_option_takes_a_checkpoint_folder(photos, small_mirror, tmp_path):
    folder = small_mirror / "facebook/sapiens2-pretrain-0.1b"
    status, printed = run_cli("features", photos / "grace_hopper.jpg", "--out", tmp_path, "--model", folder)
    assert status == EXIT_OK
    assert files_under(tmp_path) == expected_files("features", "grace_hopper")


def test_videos_through_the_command_line(photos, setup_args, tmp_path):
    clips = tmp_path / "clips"
    clips.mkdir()
    write_clip(clips / "walk.mp4")
    (clips / "damaged.mov").write_bytes(b"\x00\x00\x00\x14ftypqt  " + bytes(300))
    out = tmp_path / "out"
    status, printed = run_cli("pose", clips, "--out", out, "--stride", 2, "--max-frames", 2, *setup_args)
    assert status == EXIT_OK
    assert files_under(out) == {"walk_pose.webm", "walk_controlnet.webm", "walk_predictions.json"}
    frames, fps = read_video(out / "walk_pose.webm")
    assert len(frames) == 2 and fps == 6.0
    assert len(json.loads((out / "walk_predictions.json").read_text())["frames"]) == 2
    assert "walk.mp4, pose: 2 frames in " in printed and " frames/s, " in printed
    assert "damaged.mov: " in printed and "cannot be opened as a video" in printed

    video = out / "walk_pose.webm"
    (out / "walk_predictions.json").unlink()
    written = video.stat().st_mtime_ns
    status, printed = run_cli("pose", clips, "--out", out, "--stride", 2, "--max-frames", 2, *setup_args)
    assert status == EXIT_OK and "1 file written" in printed and "2 already there" in printed
    assert video.stat().st_mtime_ns == written and (out / "walk_predictions.json").is_file()

    status, _ = run_cli(
        "segment", clips / "walk.mp4", "--out", out, "--max-frames", 1, "--video-format", "mp4", *setup_args
    )
    assert status == EXIT_OK and len(read_video(out / "walk_segment.mp4")[0]) == 1


def test_pose_video_options_from_the_command_line(setup_args, tmp_path):
    write_clip(tmp_path / "walk.mp4", count=4)
    out = tmp_path / "out"
    flags = ["--detect-every", 2, "--min-cutoff", 0.5, "--beta", 3, "--threshold", 0]
    status, printed = run_cli(
        "pose", tmp_path / "walk.mp4", "--out", out, "--exports", "json", *flags, *setup_args
    )
    assert status == EXIT_OK and "The person detector ran on 2 of 4 frames (every 2)." in printed
    frames = json.loads((out / "walk_predictions.json").read_text())["frames"]
    assert all("track_id" in instance for frame in frames for instance in frame["instances"])
    status, printed = run_cli(
        "pose",
        tmp_path / "walk.mp4",
        "--out",
        out,
        "--overwrite",
        "--no-track",
        "--detect-every",
        1,
        *setup_args,
    )
    assert status == EXIT_OK and "detector ran" not in printed
    frames = json.loads((out / "walk_predictions.json").read_text())["frames"]
    assert not any("track_id" in instance for frame in frames for instance in frame["instances"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pose", "--detect-every", "0"], "Option 'detect_every' must be a number between 1 and 30, not 0."),
        (["segment", "--no-smoothing"], "--smoothing is an option of pose, not of segment"),
    ],
)
def test_bad_video_options_are_usage_errors(argv, message, tmp_path, capsys):
    task, *flags = argv
    with pytest.raises(SystemExit) as stopped:
        main([task, str(tmp_path / "walk.mp4"), "--out", str(tmp_path / "out"), *flags])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_nothing_succeeded_exits_with_status_1(photos, setup_args, tmp_path, capsys):
    status, printed = run_cli(
        "segment", photos / "broken.jpg", tmp_path / "missing.png", "--out", tmp_path, *setup_args
    )
    assert status == EXIT_NOTHING_SUCCEEDED
    assert "broken.jpg: " in printed and "missing.png: No such file or folder." in printed
    assert "Nothing succeeded." in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    status, _ = run_cli("segment", tmp_path / "empty", "--out", tmp_path, *setup_args)
    assert status == EXIT_NOTHING_SUCCEEDED and "no image or video was found" in capsys.readouterr().err


def test_a_jpeg_with_thousands_of_scans_is_refused_with_its_sentence(setup_args, tmp_path: Path) -> None:
    from test_decode_budget import many_scans_jpeg

    photo = tmp_path / "scans.jpg"
    photo.write_bytes(many_scans_jpeg(3000))
    status, printed = run_cli("segment", photo, "--out", tmp_path / "out", *setup_args)
    assert status != 0
    assert "3000 scans (progressive passes), above this server's limit of 100" in printed
