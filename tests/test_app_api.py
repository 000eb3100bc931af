"""The app over HTTP: a real server with tiny checkpoints, called through gradio_client like any user."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from app_server import PHOTOS, environment, running_app, tiny_detector
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from PIL import Image

import app
from sapiens2.data.metadata import body_parts
from sapiens2.models import device, hub
from sapiens2.pipelines.segment import chosen_class_ids
from sapiens2.runtime.arguments import runtime_from_arguments
from sapiens2.runtime.cache import ModelCache, model_bytes
from sapiens2.runtime.runtime import COMPILE_ENV
from sapiens2.serving import handlers
from sapiens2.tasks.registry import TASKS
from sapiens2.vision.part_masks import part_mask

KEYPOINTS = 308
# Pictures that are not drawn over the photo, so need not have its size.
FREE_SIZE_PICTURES = {"Legend"}


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def photo_size(photo: Path) -> tuple[int, int]:
    with Image.open(photo) as image:
        return image.size


def read_ply_header(path: Path) -> list[str]:
    data = Path(path).read_bytes()
    end = data.index(b"end_header\n")
    return data[:end].decode("ascii").splitlines()


def check_export(path: str, stem: str, size: tuple[int, int]) -> None:
    """The file opens and has the shape the photo of `size` (width, height) calls for."""
    width, height = size
    suffix = Path(path).name.removeprefix(stem)
    if suffix == "_depth.json":
        document = json.loads(Path(path).read_text())
        assert document["image"] == {"width": width, "height": height}
        assert document["depth_png"]["metres_per_unit"] > 0 and "camera" in document
    elif suffix.endswith(".json"):
        document = json.loads(Path(path).read_text())
        assert document["image"] == {"width": width, "height": height}
        assert document["persons"], "the pose document lists no person"
        assert all(len(person["keypoints"]) == KEYPOINTS for person in document["persons"])
    elif suffix.endswith(".png"):
        with Image.open(path) as image:
            assert image.size == size
    elif suffix.endswith(".glb"):
        data = Path(path).read_bytes()
        assert data[:4] == b"glTF" and int.from_bytes(data[8:12], "little") == len(data)
    elif suffix.endswith(".ply"):
        header = read_ply_header(path)
        assert header[0] == "ply"
        vertices = next(int(line.split()[-1]) for line in header if line.startswith("element vertex"))
        assert 0 < vertices <= width * height
        properties = [line.split()[-1] for line in header if line.startswith("property")]
        assert properties[:6] == ["x", "y", "z", "red", "green", "blue"]
    else:
        array = np.load(path)
        shapes = {
            "_segmentation.npy": (height, width),
            "_depth.npy": (height, width),
            "_normals.npy": (height, width, 3),
        }
        if suffix in shapes:
            assert array.shape == shapes[suffix]
        elif suffix == "_cls.npy":
            assert array.ndim == 1 and array.size > 0
        else:
            assert suffix == "_patches.npy" and array.ndim == 3 and array.shape[1:] != (0, 0)
        assert np.isfinite(array).all()


@pytest.mark.parametrize("index, task", list(enumerate(TASKS)))
def test_every_task_endpoint_returns_full_size_pictures_and_its_files(client, index, task):
    photo = PHOTOS[index % len(PHOTOS)]
    entry = TASKS[task]
    outputs = client.predict(handle_file(str(photo)), api_name=f"/{task}")
    count = len(entry.picture_titles)
    pictures, (summary, timing, files) = outputs[:count], outputs[count : count + 3]
    for declared, picture in zip(entry.pictures, pictures, strict=True):
        title = declared.title
        assert Path(picture).name == f"{photo.stem}{declared.suffix}.png", "named after the photo and picture"
        with Image.open(picture) as image:
            assert image.format == "PNG" and image.mode == "RGB"
            if title not in FREE_SIZE_PICTURES:
                assert image.size == photo_size(photo), title
    assert isinstance(summary, str)
    assert timing.endswith(f"cpu · fp32 · {entry.repo_id(None)}") and "model" in timing.lower()
    stem = photo.stem
    assert sorted(Path(path).name.removeprefix(stem) for path in files) == sorted(TASKS[task].exports_for({}))
    for path in files:
        check_export(path, stem, photo_size(photo))
    if entry.viewer_title:
        assert Path(outputs[-1]).name == f"{stem}_mesh_preview.glb" and len(outputs) == count + 4
        assert outputs[-1] not in files, "the viewer's preview is not one of the downloads"
    else:
        assert len(outputs) == count + 3


def test_all_tasks_endpoint_returns_each_tasks_picture_and_plain_text(client):
    photo = PHOTOS[0]
    *pictures, summary, timing, files = client.predict(handle_file(str(photo)), api_name="/all")
    names = ("pose", "segment", "normals", "depth", "matting")
    assert [Path(picture).name for picture in pictures] == [
        f"{photo.stem}{TASKS[name].pictures[0].suffix}.png" for name in names
    ]
    for picture in pictures:
        with Image.open(picture) as image:
            assert image.format == "PNG" and image.size == photo_size(photo)
    assert summary.splitlines()[0].startswith("Pose: ") and len(summary.splitlines()) >= len(names)
    assert [line.split(":")[0] for line in timing.splitlines()] == [TASKS[name].title for name in names]
    assert not set(summary + timing) & set("*<>"), "plain text through the API: no Markdown or HTML"
    archive, *files = files
    assert Path(archive).name == f"{photo.stem}_all_tasks.zip", "one zip of everything, first"
    names = {Path(path).name for path in files}
    assert {
        f"{photo.stem}{suffix}"
        for name in TASKS
        if name != "features"
        for suffix in TASKS[name].exports_for({})
    } == names
    tasks = [next(name for name in TASKS if Path(path).name.removeprefix(photo.stem) in
                  TASKS[name].exports_for({})) for path in files]  # fmt: skip
    assert tasks == sorted(tasks, key=list(TASKS).index), "the list grouped by task, in the tabs' order"
    with zipfile.ZipFile(archive) as zipped:
        assert zipped.testzip() is None
        inside = {info.filename: zipped.read(info) for info in zipped.infolist()}
    pairs = zip(tasks, files, strict=True)
    assert inside == {f"{task}/{Path(path).name}": Path(path).read_bytes() for task, path in pairs}


def test_endpoints_have_stable_names_and_only_the_image_is_required(client):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert set(endpoints) == {f"/{name}" for name in TASKS} | {"/all", "/video"}
    for name, info in endpoints.items():
        first, *rest = info["parameters"]
        expected = "video" if name == "/video" else "image"
        assert first["parameter_name"] == expected and not first["parameter_has_default"], name
        assert rest and all(parameter["parameter_has_default"] for parameter in rest), name
    pose = [parameter["parameter_name"] for parameter in endpoints["/pose"]["parameters"]]
    assert pose == ["image", "size", *(option.name for option in TASKS["pose"].options)]


def test_option_defaults_are_settled_for_the_servers_device(client):
    """The test server runs on the CPU: the flip test starts off there (on with a GPU); depth is smoothed."""
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]

    def defaults(endpoint: str) -> dict:
        return {p["parameter_name"]: p.get("parameter_default") for p in endpoints[endpoint]["parameters"]}

    assert defaults("/pose")["flip_test"] is False
    assert defaults("/depth")["smooth"] is True


def test_options_are_taken_by_name(client):
    photo = handle_file(str(PHOTOS[1]))
    outputs = client.predict(photo, background_color="#ff0000", api_name="/matting")
    with Image.open(outputs[2]) as composite, Image.open(outputs[0]) as alpha:
        transparent = np.asarray(alpha.convert("L")) < 8
        pixels = np.asarray(composite.convert("RGB"))[transparent]
    if len(pixels):
        assert (pixels == [255, 0, 0]).all()
    with pytest.raises(AppError, match="threshold"):
        client.predict(photo, threshold=7.0, api_name="/pose")


def test_pose_takes_keypoint_formats_by_name_and_draws_the_controlnet_picture(client):
    photo = PHOTOS[0]
    chosen = ["openpose", "coco17"]
    outputs = client.predict(handle_file(str(photo)), keypoint_format=chosen, api_name="/pose")
    _, controlnet, _, _, files = outputs
    names = sorted(Path(path).name.removeprefix(photo.stem) for path in files)
    assert names == ["_coco17.json", "_controlnet.png", "_openpose.json", "_pose.json"], "added, not instead"
    assert Path(controlnet).name == f"{photo.stem}_controlnet.png"
    with Image.open(controlnet) as image:
        assert image.mode == "RGB" and image.size == photo_size(photo)
        drawn = np.asarray(image)
    assert drawn.any() and (drawn.max(axis=2) == 0).mean() > 0.5, "a drawing on black"
    (openpose,) = [path for path in files if path.endswith("_openpose.json")]
    document = json.loads(Path(openpose).read_text())
    assert document["version"] == 1.3 and len(document["people"][0]["hand_left_keypoints_2d"]) == 63
    with pytest.raises(AppError, match="keypoint_format"):
        client.predict(handle_file(str(photo)), keypoint_format=["body_25"], api_name="/pose")


def test_segment_takes_parts_grow_and_feather_by_name_and_returns_the_mask_and_the_cutout(client):
    photo = PHOTOS[1]
    outputs = client.predict(
        handle_file(str(photo)), parts=["hands", "Hair"], grow=2, feather=3, api_name="/segment"
    )
    _, _, mask_picture, cutout_picture, summary, _, files = outputs
    files = {Path(path).name.removeprefix(photo.stem): path for path in files}
    with Image.open(files["_segmentation.png"]) as labels, Image.open(files["_parts_mask.png"]) as mask:
        ids = chosen_class_ids(["hands", "Hair"], body_parts())
        expected = part_mask(np.asarray(labels), ids, grow=2, feather=3)
        np.testing.assert_array_equal(np.asarray(mask), expected)
    with Image.open(files["_parts_cutout.png"]) as cutout, Image.open(photo) as original:
        assert cutout.mode == "RGBA"
        np.testing.assert_array_equal(np.asarray(cutout)[..., 3], expected)
        np.testing.assert_array_equal(np.asarray(cutout)[..., :3], np.asarray(original.convert("RGB")))
    assert Path(mask_picture).name == f"{photo.stem}_parts_mask.png"
    assert Path(cutout_picture).name == f"{photo.stem}_parts_cutout_on_checkerboard.png"
    assert "Mask of hands, Hair: " in summary
    with pytest.raises(AppError, match="no class 'paws'; choose among its classes"):
        client.predict(handle_file(str(photo)), parts=["paws"], api_name="/segment")


def test_two_requests_load_a_model_once_and_tasks_share_the_body_part_model(server, client):
    cache = server.runtime.cache
    photo = handle_file(str(PHOTOS[0]))
    segment, normals = "facebook/sapiens2-seg-0.8b", "facebook/sapiens2-normal-0.8b"
    assert segment not in cache and normals not in cache
    loads = cache.stats.loads
    client.predict(photo, size="0.8b", api_name="/segment")
    assert cache.stats.loads == loads + 1 and segment in cache
    hits = cache.stats.hits
    client.predict(photo, size="0.8b", api_name="/segment")
    assert cache.stats.loads == loads + 1 and cache.stats.hits > hits
    hits = cache.stats.hits
    client.predict(photo, size="0.8b", api_name="/normals")  # masks the background with the same seg model
    assert cache.stats.loads == loads + 2 and normals in cache and cache.stats.hits > hits


def test_a_budget_of_one_model_evicts_the_older_one(tiny_mirror, tmp_path):
    pose, segment = "facebook/sapiens2-pose-0.4b", "facebook/sapiens2-seg-0.4b"
    sizes = [model_bytes(hub.from_pretrained(tiny_mirror / repo, device="cpu")) for repo in (pose, segment)]
    cache = ModelCache(
        hub.from_pretrained, device=torch.device("cpu"), dtype=torch.float32, budget_bytes=max(sizes)
    )
    detector = tiny_detector(tmp_path)
    with running_app(tiny_mirror, detector, tmp_path / "scratch", cache=cache) as server:
        client = server.client()
        client.predict(handle_file(str(PHOTOS[0])), api_name="/pose")
        assert cache.cached_ids() == [pose]
        client.predict(handle_file(str(PHOTOS[0])), api_name="/segment")
        assert cache.cached_ids() == [segment]
        assert cache.stats.evictions == [pose]


def test_offline_with_nothing_cached_names_the_repo_and_the_folder_then_serves_again(
    server, client, tmp_path
):
    photo = handle_file(str(PHOTOS[1]))
    repo = "facebook/sapiens2-pose-1b"
    with environment(SAPIENS2_CHECKPOINT_DIR=str(tmp_path / "empty"), HF_HUB_CACHE=str(tmp_path / "hub")):
        with pytest.raises(AppError) as caught:
            client.predict(photo, size="1b", api_name="/pose")
    message = str(caught.value)
    assert message.startswith(f"The model {repo} is not on this server, and the server cannot download it.")
    assert f"hf download {repo} --include config.json" in message, "what whoever runs it can do"
    assert str(tmp_path) not in message and "empty" not in message, "nothing about this server's folders"
    assert "Traceback" not in message
    assert repo not in server.runtime.cache
    outputs = client.predict(photo, size="1b", api_name="/pose")
    assert json.loads(Path(outputs[-1][0]).read_text())["model"] == repo


def test_bad_uploads_get_a_sentence_and_the_server_keeps_serving(client, tmp_path):
    fake = tmp_path / "holiday.jpg"
    fake.write_text("this is not a photo")
    with pytest.raises(AppError, match="not an image in a supported format"):
        client.predict(handle_file(str(fake)), api_name="/segment")
    tiny = tmp_path / "tiny.png"
    Image.new("RGB", (4, 4)).save(tiny)
    with pytest.raises(AppError, match="too small"):
        client.predict(handle_file(str(tiny)), api_name="/pose")
    with pytest.raises(AppError, match="No image was given"):
        client.predict(None, api_name="/depth")
    outputs = client.predict(handle_file(str(PHOTOS[0])), api_name="/segment")
    assert Path(outputs[0]).is_file()


def test_download_folders_stay_bounded(server, client):
    assert len(server.scratch.folders()) <= server.scratch.keep
    before = server.scratch.folders()
    picture, *_ = client.predict(handle_file(str(PHOTOS[0])), api_name="/features")
    # The request's folder went as soon as Gradio had copied its files: only the copies are left.
    assert server.scratch.folders() == before and Path(picture).is_file()


def test_command_line_defaults_to_this_machine_only(monkeypatch):
    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    monkeypatch.delenv("GRADIO_SERVER_PORT", raising=False)
    args = app.parse_args([])
    assert (args.host, args.port, args.share) == ("127.0.0.1", 7860, False)
    assert args.device is args.dtype is args.checkpoint_dir is args.detector is None
    args = app.parse_args(
        ["--device", "cpu", "--dtype", "fp32", "--host", "0.0.0.0", "--port", "8000", "--share"]
    )
    assert (args.device, args.dtype, args.host, args.port, args.share) == (
        "cpu",
        "fp32",
        "0.0.0.0",
        8000,
        True,
    )


def test_device_note_states_the_precision_and_why(monkeypatch):
    monkeypatch.delenv("SAPIENS2_DTYPE", raising=False)
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: True)
    runtime = runtime_from_arguments(app.parse_args(["--device", "cpu"]))
    note = handlers.device_note(runtime)
    assert "**bf16**: this CPU computes bf16 natively" in note and "--dtype fp32" in note
    assert not runtime.compiled and "compiled" not in note
    runtime = runtime_from_arguments(app.parse_args(["--device", "cpu", "--dtype", "fp32", "--compile"]))
    note = handlers.device_note(runtime)
    assert "**fp32**: as asked" in note and "--dtype fp32" not in note
    assert runtime.compiled and "first run of each input size" in note
    monkeypatch.setenv(COMPILE_ENV, "1")
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: False)
    runtime = runtime_from_arguments(app.parse_args(["--device", "cpu"]))
    assert runtime.compiled and "no native bf16" in handlers.device_note(runtime)


def test_video_tab_returns_the_processed_clip(client, tmp_path):
    from test_video import HEIGHT, WIDTH, read_video, write_clip

    clip = tmp_path / "walk.mp4"
    write_clip(clip, count=3)
    video, summary, files = client.predict(handle_file(str(clip)), task="segment", api_name="/video")
    frames, _ = read_video(Path(video["video"] if isinstance(video, dict) else video))
    assert len(frames) == 3 and frames[0].shape == (HEIGHT, WIDTH, 3)
    assert summary.startswith("3 frames at")
    assert f"with {TASKS['segment'].repo_id(None)}." in summary.splitlines()[0]
    assert any(Path(path).suffix == ".webm" for path in files)


def test_the_video_tab_names_the_model_that_ran_and_offers_the_tasks_own_sizes(client, tmp_path):
    """Pose has no 0.1b: a video asked for at 0.1b runs Pose's default size and says so."""
    from test_video import write_clip

    clip = tmp_path / "walk.mp4"
    write_clip(clip, count=2)
    assert "0.1b" not in TASKS["pose"].repos
    _, summary, _ = client.predict(handle_file(str(clip)), task="pose", size="0.1b", api_name="/video")
    assert f"with {TASKS['pose'].repo_id(None)}." in summary.splitlines()[0]
    config = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/video"]
    [size] = [parameter for parameter in config["parameters"] if parameter["parameter_name"] == "size"]
    assert size["parameter_default"] == TASKS[next(iter(TASKS))].default_size


def test_video_endpoint_takes_the_pose_video_options_by_name(client, tmp_path):
    from test_video import write_clip

    from sapiens2.tasks import video_options

    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    parameters = {p["parameter_name"]: p.get("parameter_default") for p in endpoints["/video"]["parameters"]}
    assert list(parameters)[:3] == ["video", "task", "size"]
    assert list(parameters)[3:] == list(video_options())
    # The test server runs on the CPU: the detector every 5 frames there (every frame with a GPU).
    assert (parameters["track"], parameters["smoothing"], parameters["detect_every"]) == (True, True, 5)
    clip = tmp_path / "walk.mp4"
    write_clip(clip, count=3)
    _, summary, files = client.predict(
        handle_file(str(clip)), task="pose", detect_every=2, beta=1.5, api_name="/video"
    )
    assert re.search(r"The person detector ran on [23] of 3 frames \(every 2\)\.", summary)
    names = {Path(path).name for path in files}
    assert {"walk_pose.webm", "walk_controlnet.webm", "walk_predictions.json"} <= names
    frames = json.loads(next(Path(p) for p in files if p.endswith("_predictions.json")).read_text())["frames"]
    assert all("track_id" in instance for frame in frames for instance in frame["instances"])
    # Another task leaves pose's video options; a bad value is refused by name.
    _, summary, _ = client.predict(handle_file(str(clip)), task="segment", detect_every=2, api_name="/video")
    assert "detector" not in summary
    with pytest.raises(AppError, match="Option 'detect_every' must be a number between 1 and 30, not 99"):
        client.predict(handle_file(str(clip)), task="pose", detect_every=99, api_name="/video")


def test_the_video_endpoint_writes_the_chosen_keypoint_files_of_every_frame(client, tmp_path):
    import zipfile

    from test_video import write_clip

    clip = tmp_path / "walk.mp4"
    write_clip(clip, count=3)
    _, _, files = client.predict(
        handle_file(str(clip)), task="pose", keypoint_format=["coco17", "openpose"], api_name="/video"
    )
    names = {Path(path).name: Path(path) for path in files}
    assert {"walk_predictions.json", "walk_coco17.json", "walk_openpose.zip"} <= set(names)
    # A COCO results file: one entry per person found (this server's tiny detector may find nobody).
    coco = json.loads(names["walk_coco17.json"].read_text())
    assert isinstance(coco, list) and {entry["image_id"] for entry in coco} <= {0, 1, 2}
    with zipfile.ZipFile(names["walk_openpose.zip"]) as archive:
        frames = sorted(archive.namelist())
    assert frames == [f"walk_{index:012d}_keypoints.json" for index in range(3)]
