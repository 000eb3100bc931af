"""Attacks on the live webcam stream, sent as raw HTTP the way the page sends its frames.

The stream event is private (no API page lists it), but anyone can join it with its fn_index. Its frames
must meet the same checks as uploads before they are decoded, and streams that stop sending must give
their place back and never fill the queue the photos wait in. Figures are printed and reported in
docs/reliability.md.
"""

from __future__ import annotations

import base64
import io
import struct
import uuid
import zlib

import httpx
import pytest
from app_server import environment, first_stream_answer, running_app, tiny_detector
from peak_memory import PeakMemory, report
from PIL import Image
from test_reliability_attacks import (
    GOOD_PHOTO,
    HOSTILE_BUDGET,
    slow_forward,
    still_serving,
    wait_for,
)
from test_reliability_battery import check_sentence

import app
from sapiens2.serving.live_streams import (
    IDLE_ENV,
    SHARE_ENV,
    live_share,
    places_taken_sentence,
    share_taken_sentence,
)
from sapiens2.serving.requests import NOT_UPLOADED


@pytest.fixture(scope="module")
def server(small_mirror, tmp_path_factory):
    detector = tiny_detector(tmp_path_factory.mktemp("detector"))
    with running_app(small_mirror, detector, tmp_path_factory.mktemp("scratch")) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def live_index(server) -> int:
    return next(index for index, fn in server.demo.fns.items() if any(t[1] == "stream" for t in fn.targets))


def frame_payload(data: bytes, mime: str = "image/jpeg") -> dict:
    """A frame as the page sends it: Gradio's image payload holding a base64 data: URL."""
    return {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}"}


def join(server, session: str, payload: dict, address: str = "127.0.0.1") -> httpx.Response:
    """A stream's join, as the page sends it, from the loopback `address`."""
    body = {"data": [payload, "pose", []], "fn_index": live_index(server), "session_hash": session}
    with httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30) as client:
        return client.post(f"{server.url}gradio_api/queue/join", json=body)


def first_answer(server, session: str) -> dict:
    """The stream's first answer (a frame's outputs, or its end with an error), then the page goes away."""
    return first_stream_answer(server.url, session)


def frame_refusal(server, payload: dict) -> str:
    session = uuid.uuid4().hex
    assert join(server, session, payload).status_code == 200
    message = first_answer(server, session)
    assert message["msg"] == "process_completed" and not message["success"], message
    text = message["output"]["error"]
    check_sentence(text)
    return text


def live_places_taken(server) -> int:
    group = server.demo._queue.event_queue_per_concurrency_id.get(app.LIVE_EVENTS)
    return 0 if group is None else group.current_concurrency + len(group.queue)


def black_png(width: int, height: int) -> bytes:
    """A real, valid black RGB PNG (a few hundred KB for 12000x12000), compressed row by row."""
    packer, row = zlib.compressobj(9), b"\x00" * (1 + 3 * width)
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


# ---- the frame: checked before it is decoded ---------------------------------------------------------------


def test_a_huge_frame_is_refused_from_its_header(server):
    payload = frame_payload(black_png(12000, 12000), "image/png")
    with PeakMemory() as memory:
        message = frame_refusal(server, payload)
    report(f"a {len(payload['url']) // 1000} KB webcam frame of 12000x12000 pixels (PNG)", memory)
    assert "12000x12000" in message and "too large" in message
    assert memory.growth < HOSTILE_BUDGET


def test_a_frame_is_held_to_a_video_frames_pixels(server):
    message = frame_refusal(server, frame_payload(black_png(6000, 4000), "image/png"))
    assert "6000x4000 pixels (24.0 megapixels) is above this server's limit of 8.3 megapixels" in message


@pytest.mark.parametrize("fmt", ["PCX", "TGA", "SGI", "ICO", "PPM"])
def test_a_frame_in_a_format_uploads_refuse_is_refused(server, fmt):
    picture = io.BytesIO()
    Image.open(GOOD_PHOTO).convert("RGB").resize((200, 160)).save(picture, format=fmt)
    message = frame_refusal(server, frame_payload(picture.getvalue(), "image/png"))
    assert "not an image in a supported format" in message or "files are not supported" in message


def test_a_frame_naming_a_server_file_is_never_read(server):
    assert frame_refusal(server, {"path": str(GOOD_PHOTO)}) == NOT_UPLOADED


def test_a_frame_that_is_not_base64_gets_a_sentence(server):
    message = frame_refusal(server, {"url": "data:image/jpeg;base64,@@not base64@@"})
    assert "webcam frame could not be read" in message


def test_a_webcam_frame_as_the_page_sends_it_runs(server):
    session = uuid.uuid4().hex
    assert join(server, session, frame_payload(GOOD_PHOTO.read_bytes())).status_code == 200
    message = first_answer(server, session)
    assert message["msg"] == "process_streaming" and message["success"], message
    picture, rate, _ = message["output"]["data"]
    assert picture and "first frame, measuring the frame rate" in rate  # no rate yet from one frame


# ---- streams: a place only while frames come, never in the photo queue ------------------------------------


@pytest.fixture
def free_places(server) -> None:
    """Every live place free: the streams of the tests before (a stream that ran and whose page left holds
    its place until the watch sees it idle, a few seconds) are gone first, so a test counts its own."""
    wait_for(lambda: live_places_taken(server) == 0, timeout=30)


def test_streams_that_stop_sending_give_their_place_back(server, client, free_places):
    frame = frame_payload(GOOD_PHOTO.read_bytes())
    with environment(**{IDLE_ENV: "2"}):
        sessions = [uuid.uuid4().hex for _ in range(app.LIVE_STREAMS)]
        for session in sessions:
            assert join(server, session, frame).status_code == 200
        first_answer(server, sessions[0])  # one reads its first frame and goes away; the others never read
        with PeakMemory() as memory:
            wait_for(lambda: live_places_taken(server) == 0, timeout=30)
        report(
            f"{app.LIVE_STREAMS} streams that sent one frame and went silent, until their places were free",
            memory,
        )
        assert server.demo.stream_watch.ended["idle"] + server.demo.stream_watch.ended["client gone"] >= 4
        session = uuid.uuid4().hex
        assert join(server, session, frame).status_code == 200
        assert first_answer(server, session)["msg"] == "process_streaming"
    still_serving(client)


def test_a_slow_frame_is_not_silence(server, free_places):
    session = uuid.uuid4().hex
    with environment(**{IDLE_ENV: "1"}), slow_forward(server, 3.0) as forward:
        assert join(server, session, frame_payload(GOOD_PHOTO.read_bytes())).status_code == 200
        message = first_answer(server, session)
    assert forward.calls >= 1
    assert message["msg"] == "process_streaming", "the stream was ended while its frame ran"
    wait_for(lambda: live_places_taken(server) == 0, timeout=30)


def test_streams_never_fill_the_photo_queue(server, client, free_places):
    frame = frame_payload(GOOD_PHOTO.read_bytes())
    with environment(**{IDLE_ENV: "120"}):
        held = [join(server, uuid.uuid4().hex, frame) for _ in range(app.LIVE_STREAMS)]
        assert all(answer.status_code == 200 for answer in held)
        wait_for(lambda: live_places_taken(server) == app.LIVE_STREAMS)
        with PeakMemory() as memory:
            refused = [join(server, uuid.uuid4().hex, frame) for _ in range(app.MAX_QUEUE)]
            still_serving(client)
        report(f"{app.MAX_QUEUE} stream joins beyond the live places, then a photo", memory)
        for answer in held:
            httpx.post(f"{server.url}gradio_api/stream/{answer.json()['event_id']}/close", timeout=30)
    for answer in refused:
        assert answer.status_code == 503
        assert answer.json()["detail"] == places_taken_sentence(app.LIVE_STREAMS)
    check_sentence(places_taken_sentence(app.LIVE_STREAMS))
    wait_for(lambda: live_places_taken(server) == 0, timeout=30)


def test_one_client_holds_at_most_its_share_of_the_live_places(server, client, free_places):
    # Before: one address held all four live places; everyone else got "All 4 live webcam places are taken".
    frame = frame_payload(GOOD_PHOTO.read_bytes())
    with environment(**{IDLE_ENV: "120", SHARE_ENV: ""}):  # the share's default: half the places
        share = live_share(app.LIVE_STREAMS)
        mine = [join(server, uuid.uuid4().hex, frame, "127.0.0.21") for _ in range(app.LIVE_STREAMS)]
        wait_for(lambda: live_places_taken(server) == share)
        session = uuid.uuid4().hex
        other = join(server, session, frame, "127.0.0.22")
        message = first_answer(server, session)
        for answer in [*mine[:share], other]:
            httpx.post(f"{server.url}gradio_api/stream/{answer.json()['event_id']}/close", timeout=30)
    assert share == 2
    assert [answer.status_code for answer in mine] == [200] * share + [429] * (app.LIVE_STREAMS - share)
    assert {answer.json()["detail"] for answer in mine[share:]} == {share_taken_sentence(share)}
    check_sentence(share_taken_sentence(share))
    assert other.status_code == 200 and message["msg"] == "process_streaming", message
    wait_for(lambda: live_places_taken(server) == 0, timeout=30)
    still_serving(client)


@pytest.mark.parametrize(("places", "setting", "share"), [(4, "", 2), (1, "", 1), (5, "", 2), (4, "3", 3)])
def test_the_live_share_is_half_the_places_unless_set(places, setting, share):
    with environment(**{SHARE_ENV: setting}):
        assert live_share(places) == share
