"""Every awkward or hostile input sent to the running app over HTTP gets a sentence or a correct result.

The server runs tiny checkpoints at 256x192 (`small_mirror`), so one model run takes a fraction of a second.
Inputs that are refused are refused by input hygiene before any model runs; inputs that load go through
/features, the cheapest endpoint with a real model, and pose cases through /pose. After every refusal
the server must still answer a good request.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import re
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from app_server import PHOTOS, environment, free_port, running_app, tiny_detector
from bad_inputs import CASE_NAMES, TRAVERSAL_NAME, make_bad_inputs
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from PIL import Image

import app
from sapiens2.errors import CheckpointError, ConfigError
from sapiens2.models import hub
from sapiens2.runtime.runtime import Runtime
from sapiens2.serving import handlers, requests
from sapiens2.serving.scratch import ScratchSpace
from sapiens2.tasks.registry import TASKS
from sapiens2.vision.detector import MAX_PERSONS_ENV, max_persons_from_env
from sapiens2.vision.images import load_image

ROOT = Path(__file__).resolve().parents[1]
GOOD_PHOTO = PHOTOS[0]
CROWD_CAP = 8
# A person needs the words, not the internals: no traceback, no exception class, no server folder.
INTERNALS = re.compile(r"Traceback|File \"|Error\b|Exception")
SERVER_FOLDERS = (str(ROOT), tempfile.gettempdir(), str(Path.home()))
# Names an attacker may send with an upload: climbing folders, absolute, device names, control characters.
HOSTILE_NAMES = [
    TRAVERSAL_NAME,
    "..\\..\\Windows\\win.ini.png",
    "/etc/shadow.png",
    "CON.png",
    "...png",
    "$(rm -rf ~);`reboot`.png",
    "a" * 300 + ".png",
    "\u202eevil\u202dgnp.exe.png",
    "photo\u0000.png",
]


# ---- helpers --------------------------------------------------------------------------------------------


def check_sentence(message: str) -> None:
    """A message a person can read: whole sentences, no traceback, no internals, no server paths."""
    assert message.strip().endswith((".", "!", "?")), message
    assert not INTERNALS.search(message), message
    assert not any(folder in message for folder in SERVER_FOLDERS), message


def refusal(client, path: Path, api_name: str = "/features", **options: Any) -> str:
    with pytest.raises(AppError) as caught:
        client.predict(handle_file(str(path)), api_name=api_name, **options)
    message = str(caught.value)
    check_sentence(message)
    return message


def still_serving(client) -> None:
    picture, summary, _, files = client.predict(handle_file(str(GOOD_PHOTO)), api_name="/features")
    assert Path(picture).is_file() and "features" in summary and len(files) == 2


def upload(url: str, data: bytes, name: str) -> dict:
    """Upload `data` like the browser does, under any file name, and return the file payload it sends."""
    response = httpx.post(f"{url}gradio_api/upload", files=[("files", (name, data))], timeout=60)
    response.raise_for_status()
    return {"path": response.json()[0], "orig_name": name, "meta": {"_type": "gradio.FileData"}}


def call(url: str, api_name: str, data: list) -> tuple[str, Any]:
    """One call of an endpoint over plain HTTP: ("complete", outputs) or ("error", the error payload)."""
    response = httpx.post(f"{url}gradio_api/call/{api_name}", json={"data": data}, timeout=60)
    response.raise_for_status()
    event_id = response.json()["event_id"]
    stream = httpx.get(f"{url}gradio_api/call/{api_name}/{event_id}", timeout=120).text
    events = re.findall(r"^event: (\w+)\ndata: (.*)$", stream, flags=re.MULTILINE)
    event, data = events[-1]
    return event, json.loads(data)


POSE_SUMMARY, POSE_FILES = 2, 4  # /pose answers its two pictures, the summary, the timing, the files


def pose_document(outputs: list) -> dict:
    (path,) = [path for path in outputs[POSE_FILES] if path.endswith("_pose.json")]
    return json.loads(Path(path).read_text())


def picture_size(path: str) -> tuple[int, int]:
    with Image.open(path) as image:
        return image.size


@pytest.fixture(scope="module")
def server(small_mirror, tmp_path_factory):
    detector = tiny_detector(tmp_path_factory.mktemp("detector"))  # random weights: finds nobody
    with running_app(small_mirror, detector, tmp_path_factory.mktemp("scratch")) as running:
        # Load the detector the app's way now: importing ultralytics (above) replaced Pillow's Image.open,
        # and loading puts Pillow's own back, as in the app, where nothing imports ultralytics earlier.
        running.runtime.detect(load_image(GOOD_PHOTO))
        assert Image.open.__module__ == Image.__name__
        yield running


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def battery(tmp_path_factory):
    return make_bad_inputs(tmp_path_factory.mktemp("battery"))


@pytest.fixture(scope="module")
def crowd_detector(tmp_path_factory) -> str:
    """A real yolo11n .pt (built from its yaml, no download) that finds well over 50 persons in any photo:
    every level of its head scores 'person' high and every other class low."""
    from ultralytics import YOLO

    torch.manual_seed(0)
    model = YOLO("yolo11n.yaml")
    with torch.no_grad():
        for branch in model.model.model[-1].cv3:
            branch[-1].bias.fill_(-9.0)
            branch[-1].bias[0] = 2.0
    model.model.names = {0: "person", **{i: f"class{i}" for i in range(1, 80)}}
    path = tmp_path_factory.mktemp("crowd") / "crowd_yolo.pt"
    model.save(str(path))
    return str(path)


# ---- the battery of files -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASE_NAMES)
def test_every_bad_file_gets_a_sentence_or_a_correct_result(server, client, battery, name):
    case = battery[name]
    if case.error:
        assert case.error in refusal(client, case.path)
        still_serving(client)
    else:
        payload = (
            handle_file(str(case.path))
            if case.upload_name is None
            else upload(server.url, case.path.read_bytes(), case.sent_name)
        )
        picture, summary, _, files = client.predict(payload, api_name="/features")
        height, width = case.size
        shown = min(1.0, handlers.SHOWN_MAX_SIDE / max(height, width))  # the page gets at most 4096 px
        assert picture_size(picture) == (round(width * shown), round(height * shown))
        if case.note:
            assert case.note in summary
        assert len(files) == 2 and all(np.isfinite(np.load(path)).all() for path in files)


def test_pose_on_a_photo_downscaled_for_the_model_answers_in_the_photos_pixels(client):
    # The 8000x6000 case above runs /features (Gradio's PNG encoding of each 48-megapixel picture takes
    # seconds here); pose maps boxes and keypoints back the same way, shown on a smaller limit.
    with environment(SAPIENS2_MAX_SIDE="300"):
        outputs = client.predict(handle_file(str(GOOD_PHOTO)), api_name="/pose")
    assert picture_size(outputs[0]) == (512, 600)
    assert "Downscaled from 512x600 to 256x300" in outputs[POSE_SUMMARY]
    document = pose_document(outputs)
    assert document["image"] == {"width": 512, "height": 600}
    (person,) = document["persons"]
    assert person["box_xywh"] == [0, 0, 512, 600]  # nobody found: the whole photo, mapped back


# ---- pose: nobody, a crowd --------------------------------------------------------------------------------


def test_pose_with_nobody_uses_the_whole_photo_and_says_so(client):
    outputs = client.predict(handle_file(str(GOOD_PHOTO)), api_name="/pose")
    summary = outputs[POSE_SUMMARY]
    assert "No person detected." in summary and "whole photo was used as one person box" in summary
    document = pose_document(outputs)
    width, height = picture_size(str(GOOD_PHOTO))
    assert document["detector"] == {"fallback": True, "capped": False, "found": 0}
    assert len(document["persons"]) == 1 and document["persons"][0]["box_xywh"] == [0, 0, width, height]


def test_pose_on_a_crowd_keeps_the_capped_number_and_says_so(small_mirror, crowd_detector, tmp_path):
    with environment(**{MAX_PERSONS_ENV: str(CROWD_CAP)}):
        with running_app(small_mirror, crowd_detector, tmp_path / "scratch") as crowd:
            outputs = crowd.client().predict(handle_file(str(GOOD_PHOTO)), api_name="/pose")
    document = pose_document(outputs)
    found = document["detector"]["found"]
    assert found >= 50, "the detector must find a crowd for this test to mean anything"
    assert document["detector"]["capped"] and len(document["persons"]) == CROWD_CAP
    summary = outputs[POSE_SUMMARY]
    assert f"{CROWD_CAP} persons found." in summary
    assert f"{found} persons were found; the {CROWD_CAP} with the best scores were kept." in summary
    scores = [person["box_score"] for person in document["persons"]]
    assert scores == sorted(scores, reverse=True)


def test_the_person_cap_setting_is_checked(monkeypatch):
    monkeypatch.delenv(MAX_PERSONS_ENV, raising=False)
    assert max_persons_from_env() == 20
    monkeypatch.setenv(MAX_PERSONS_ENV, " 5 ")
    assert max_persons_from_env() == 5
    for bad in ["0", "-1", "2.5", "many", "\u00b2"]:
        monkeypatch.setenv(MAX_PERSONS_ENV, bad)
        with pytest.raises(ConfigError, match=MAX_PERSONS_ENV):
            max_persons_from_env()


# ---- options and types ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "api_name, options, expected",
    [
        ("/pose", {"threshold": 5}, "must be a number between 0 and 1, not 5."),
        ("/pose", {"threshold": -0.1}, "must be a number between 0 and 1, not -0.1."),
        ("/pose", {"threshold": "abc"}, "must be a number between 0 and 1, not 'abc'."),
        ("/pose", {"threshold": [1, 2]}, "must be a number between 0 and 1, not a list."),
        ("/features", {"size": "7b"}, "Features has no 7b model; choose one of 0.1b"),
        ("/segment", {"size": 5}, "Option 'size' must be one of 0.4b, 0.8b, 1b, 5b, not 5."),
        ("/segment", {"size": "../../etc"}, "has no ../../etc model"),
        ("/segment", {"parts": ["paws"]}, "Option 'parts': this model has no class 'paws'; choose among its"),
        ("/segment", {"parts": 7}, "Option 'parts' must be any of whole person, face, hands"),
        ("/segment", {"grow": "wide"}, "Option 'grow' must be a number between -100 and 100, not 'wide'."),
        ("/matting", {"background_color": "nope"}, "Option 'background_color' must be a colour"),
        ("/matting", {"background_color": 12}, "must be a colour: use '#rrggbb' or 'rgb(r, g, b)'"),
    ],
)
def test_options_out_of_range_or_of_the_wrong_type_get_a_sentence(client, api_name, options, expected):
    message = refusal(client, GOOD_PHOTO, api_name, **options)
    assert message.startswith("The request cannot be run:") and expected in message
    still_serving(client)


def test_an_image_of_the_wrong_type_is_refused_before_the_app_and_the_server_keeps_serving(server, client):
    for value in (123, "grace_hopper.jpg", ["a", "b"]):
        event, data = call(server.url, "features", [value, "0.1b"])
        assert event == "error" and data == {"error": None}  # Gradio's own check: no detail, no traceback
    with pytest.raises(AppError) as caught:
        client.predict(123, api_name="/features")
    assert "Traceback" not in str(caught.value)
    event, data = call(server.url, "features", [])
    assert event == "error"
    still_serving(client)


def test_nothing_sent_gets_a_sentence(client):
    with pytest.raises(AppError, match="No image was given. Please choose an image file."):
        client.predict(None, api_name="/segment")


# ---- names and paths --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_an_upload_name_never_builds_a_path(server, name, monkeypatch):
    seen: dict[str, list[str]] = {}
    release = server.scratch.release

    def recording_release(paths):  # the request's folder is deleted once Gradio has its copy: look first
        for folder in server.scratch.folders():
            seen[""] = sorted(path.name for path in folder.iterdir() if path.is_file())
            seen["shown"] = [path.name for path in (folder / "shown").iterdir()]
        release(paths)

    monkeypatch.setattr(server.scratch, "release", recording_release)
    event, outputs = call(server.url, "features", [upload(server.url, GOOD_PHOTO.read_bytes(), name), "0.1b"])
    assert event == "complete"
    written = seen[""]
    offered = sorted(Path(item["path"]).name for item in outputs[3])
    assert written == offered and len(written) == 2
    shown = seen["shown"]
    assert shown == [Path(outputs[0]["path"]).name]
    for file_name in written + shown:
        assert re.fullmatch(r"\w[\w.-]*_(cls\.npy|patches\.npy|features_pca\.png)", file_name), file_name
        assert len(file_name) <= 140
    if name == TRAVERSAL_NAME:
        assert written == ["passwd_cls.npy", "passwd_patches.npy"]


@pytest.mark.parametrize("api_name", ["features", "matting"])
def test_a_path_on_the_server_is_never_opened(server, client, api_name):
    secret = GOOD_PHOTO.resolve()  # an image the server can read but nobody uploaded
    bare = {"path": str(secret)}
    marked = {"path": str(secret), "meta": {"_type": "gradio.FileData"}}
    photo = upload(server.url, GOOD_PHOTO.read_bytes(), "photo.jpg")
    for payload in (bare, {"path": "/etc/passwd"}, {"path": "../../../../etc/passwd"}):
        data = [payload, "0.1b"] if api_name == "features" else [photo, "1b", "#00b140", payload]
        event, error = call(server.url, api_name, data)
        assert event == "error" and error["error"] == requests.NOT_UPLOADED
        check_sentence(error["error"])
    # Marked as a file, Gradio itself refuses a path it did not receive as an upload.
    data = [marked, "0.1b"] if api_name == "features" else [photo, "1b", "#00b140", marked]
    assert call(server.url, api_name, data) == ("error", {"error": None})
    still_serving(client)


def test_a_path_on_the_server_is_never_opened_as_a_video(server, client):
    # The video's data model is a file: Gradio refuses a path it did not receive as an upload, marked or
    # not (and the app would too: it reads only files in the upload folder).
    secret = str(GOOD_PHOTO.resolve())
    for payload in ({"path": secret}, {"path": secret, "meta": {"_type": "gradio.FileData"}}):
        assert call(server.url, "video", [payload, "segment", "0.4b"]) == ("error", {"error": None})
    still_serving(client)


@pytest.fixture
def local_web_server() -> Iterator[tuple[str, list[str]]]:
    """A web server on 127.0.0.1 serving a real photo, and the list of paths it was asked for."""
    asked: list[str] = []
    photo = GOOD_PHOTO.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.end_headers()
            self.wfile.write(photo)

        def log_message(self, *args):
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=web.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{web.server_address[1]}/photo.jpg", asked
    finally:
        web.shutdown()
        web.server_close()


def test_a_web_address_is_never_fetched(server, client, local_web_server, tmp_path):
    address, asked = local_web_server
    # As an upload's content: a text file, refused as not an image.
    for content in (address, "file:///etc/passwd", str(GOOD_PHOTO.resolve())):
        link = tmp_path / "link.jpg"
        link.write_text(content)
        assert "not an image in a supported format" in refusal(client, link)
    # As a file payload naming the address: neither the app nor Gradio fetches a local address.
    for payload in (
        {"path": address, "url": address, "meta": {"_type": "gradio.FileData"}},
        {"path": address},
        {"url": address, "meta": {"_type": "gradio.FileData"}},
    ):
        try:
            event, _ = call(server.url, "features", [payload, "0.1b"])
        except httpx.HTTPStatusError as refused:  # a `path` that is an address: refused before Gradio
            assert refused.response.status_code == 400 and "web address" in refused.response.text
            continue
        assert event == "error"
    assert asked == []
    still_serving(client)


def test_an_upload_over_the_size_cap_is_refused_by_the_server(server, client):
    data = GOOD_PHOTO.read_bytes()
    assert server.demo.max_file_size == 40 * 1024**2  # app.MAX_UPLOAD
    padded = data + bytes(server.demo.max_file_size + 1 - len(data))  # a valid JPEG followed by zeros
    files = [("files", ("big.jpg", padded))]
    response = httpx.post(f"{server.url}gradio_api/upload", files=files, timeout=60)
    assert response.status_code == 413
    assert "maximum allowed size" in response.text
    still_serving(client)


# ---- security ---------------------------------------------------------------------------------------------

# Calls that unpickle a file, which can run any code it carries.
UNPICKLING = re.compile(
    r"torch\.load\(|torch\.jit\.load\(|pickle\.loads?\(|import pickle|"
    r"weights_only\s*=\s*False|allow_pickle\s*=\s*True"
)


class Tripwire:
    """Unpickling this object creates the folder `path`: the proof that a file was unpickled."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (str(self.path),)


# Pickles this package makes in memory for its own processes, never read from a file: a --ray row between
# two of its stages (so Arrow does not merge the rows' keys).
IN_MEMORY_PICKLES = {"sapiens2/batch/cluster/tables.py"}


def test_no_code_of_the_package_or_the_app_unpickles_a_file():
    sources = [*sorted((ROOT / "sapiens2").rglob("*.py")), ROOT / "app.py"]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sources
        if str(path.relative_to(ROOT)) not in IN_MEMORY_PICKLES
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if UNPICKLING.search(line)
    ]
    assert found == []


PICKLED_NAMES = ["pytorch_model.bin", "model.pt", "model.pth", "model.ckpt", "model.safetensors"]


@pytest.mark.parametrize("name", PICKLED_NAMES)
def test_pickled_weights_are_refused_unread(tiny_mirror, tmp_path, name):
    marker = tmp_path / "unpickled"
    weights = tmp_path / "bare" / name
    weights.parent.mkdir()
    torch.save({"backbone.cls_token": Tripwire(marker)}, weights)
    # The tripwire works: unpickling the file would run its code.
    torch.load(io.BytesIO(weights.read_bytes()), weights_only=False)
    assert marker.is_dir()
    marker.rmdir()
    with pytest.raises((CheckpointError, ConfigError)):  # ConfigError: a bare file must be an official name
        hub.from_pretrained(weights, device="cpu")
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copy(tiny_mirror / "facebook/sapiens2-pretrain-0.1b/config.json", folder)
    shutil.copy(weights, folder / name)
    with pytest.raises(CheckpointError):
        hub.from_pretrained(folder, device="cpu")
    assert not marker.exists()


def test_no_endpoint_takes_a_model_and_an_uploaded_checkpoint_is_not_an_image(server, client, tmp_path):
    endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    parameters = {p["parameter_name"] for info in endpoints.values() for p in info["parameters"]}
    options = {option.name for task in TASKS.values() for option in task.all_options}  # video ones too
    expected = {"image", "video", "task", "size", *options}
    assert parameters == expected, "a request must never choose which model or detector file is loaded"
    marker = tmp_path / "unpickled"
    checkpoint = tmp_path / "yolo11n.pt"
    torch.save({"model": Tripwire(marker)}, checkpoint)
    for api_name in ("/pose", "/features"):
        assert "not an image in a supported format" in refusal(client, checkpoint, api_name)
    assert not marker.exists()


def machine_address() -> str | None:
    """This machine's own address on its network (no packet is sent), or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_the_app_listens_on_this_machine_only_unless_told_otherwise(tmp_path):
    address = machine_address()
    if address is None:
        pytest.skip("this machine has no network address other than loopback")
    demo = app.build_app(Runtime(device="cpu", dtype="fp32"), ScratchSpace(tmp_path))
    for host in (None, "0.0.0.0"):
        port = free_port()
        app.launch(demo, **({"host": host} if host else {}), port=port, prevent_thread_lock=True)
        try:
            assert httpx.get(f"http://127.0.0.1:{port}/config", timeout=10).status_code == 200
            if host is None:
                with pytest.raises(httpx.ConnectError):
                    httpx.get(f"http://{address}:{port}/config", timeout=10)
            else:
                assert httpx.get(f"http://{address}:{port}/config", timeout=10).status_code == 200
        finally:
            demo.close()
