"""The server starts on a busy machine: Gradio's launch gives up when the page's first answer takes more than
3 seconds; the app's launch waits for it (sapiens2/serving/startup.py)."""

from __future__ import annotations

import asyncio

import gradio as gr
import pytest
from app_server import free_port

from sapiens2.serving.startup import answers, patient_start

SLOW_SECONDS = 3.5  # the page's first answer, later than Gradio's 3-second limit


class SlowPage:
    """An ASGI middleware that answers the page's HEAD requests late, as a loaded machine does."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD" and scope["path"] == "/":
            await asyncio.sleep(SLOW_SECONDS)
        await self.app(scope, receive, send)


def _launch(demo: gr.Blocks) -> None:
    from starlette.middleware import Middleware

    demo.launch(
        server_name="127.0.0.1",
        server_port=free_port(),
        prevent_thread_lock=True,
        quiet=True,
        app_kwargs={"middleware": [Middleware(SlowPage)]},
    )


def test_a_slow_first_page_stops_gradio_but_not_a_patient_start():
    with gr.Blocks() as demo:
        gr.Markdown("slow")
    with pytest.raises(ValueError, match="localhost is not accessible"):
        _launch(demo)
    demo.close()
    with patient_start():
        _launch(demo)
    try:
        assert answers(demo.local_url, seconds=30)
    finally:
        demo.close()


def test_a_server_that_is_not_there_does_not_answer():
    assert not answers(f"http://127.0.0.1:{free_port()}/", seconds=0.5)
