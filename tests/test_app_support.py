"""Error sentences and the bounded scratch area that the app (and the command line) rely on."""

import pytest
import torch

from sapiens2.errors import CheckpointError, CheckpointNotFoundError, ConfigError
from sapiens2.runtime.messages import describe_error, is_expected
from sapiens2.serving.scratch import ScratchSpace
from sapiens2.vision.detector import DetectorError
from sapiens2.vision.images import ImageInputError


def test_each_kind_of_error_gets_its_own_sentence():
    assert describe_error(ImageInputError("The file is empty (0 bytes).")) == "The file is empty (0 bytes)."
    missing = describe_error(CheckpointNotFoundError("facebook/sapiens2-pose-1b: not in the cache"))
    assert missing.startswith("The model could not be found or downloaded: facebook/sapiens2-pose-1b")
    gated = describe_error(CheckpointError("facebook/x is gated: provide a token with HF_TOKEN"))
    assert "HF_TOKEN" in gated and "damaged" not in gated
    corrupt = describe_error(CheckpointError("model.safetensors: truncated or corrupt"))
    assert "truncated or corrupt." in corrupt and "fetched again" in corrupt
    assert "SAPIENS2_DETECTOR" in describe_error(DetectorError("cannot load detector weights x.pt"))
    assert "GPU ran out of memory" in describe_error(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert describe_error(ConfigError("bad device")).startswith("A setting is not valid: bad device.")
    assert describe_error(ValueError("Option 'threshold' must be between 0 and 1")).endswith("0 and 1.")


def test_unexpected_errors_hide_their_details():
    message = describe_error(KeyError("/secret/path"))
    assert "KeyError" in message and "/secret/path" not in message
    assert not is_expected(KeyError("x")) and not is_expected(RuntimeError("x"))
    assert is_expected(ImageInputError("x")) and is_expected(torch.cuda.OutOfMemoryError("x"))


def test_scratch_keeps_only_the_newest_folders(tmp_path):
    scratch = ScratchSpace(tmp_path / "root", keep=3)
    folders = []
    for index in range(5):
        folder = scratch.new_folder()
        (folder / "file.bin").write_bytes(b"x" * 10)
        folders.append(folder)
        assert folder.is_dir() and len(scratch.folders()) == min(index + 1, 3)
    assert scratch.folders() == folders[-3:]
    assert scratch.size_bytes() == 30
    scratch.remove()
    assert not (tmp_path / "root").exists()
    with pytest.raises(ValueError):
        ScratchSpace(tmp_path, keep=0)


def test_a_one_photo_requests_stage_texts_come_with_a_fraction_that_only_grows():
    import pickle

    from sapiens2.serving.requests import WAITING, StagedProgress

    shown: list[tuple[float, str]] = []

    class Bar:
        def __call__(self, fraction, desc=None):
            shown.append((fraction, desc))

    report = StagedProgress(Bar())
    report(None, WAITING)
    for fraction in (0.0, 0.5, 1.0):
        report(fraction, "loading facebook/sapiens2-pose-0.4b")
    for text in ("detecting persons", "running the model", "drawing the pictures", "writing files"):
        report(None, text)
    fractions = [fraction for fraction, _ in shown]
    assert all(fraction is not None for fraction in fractions)  # Gradio shows no text without one
    assert fractions == sorted(fractions) and fractions[-1] < 1.0
    assert [text for _, text in shown][-1] == "writing files"
    assert pickle.loads(pickle.dumps(StagedProgress(None))).bar is None  # it may cross the device boundary


def test_streamed_work_shows_its_stages_then_returns_or_raises_on_the_callers_side():
    import pickle
    import threading

    from sapiens2.serving.streaming import Relay, streamed

    page: list[str] = []
    asked = threading.Event()

    def work(report):
        report(None, "detecting persons")
        asked.wait(5)  # the caller reads the first stage before the next one comes
        report(None, "running the model")
        return "result"

    steps = streamed(work, lambda fraction, text: (fraction, text), lambda _, text: page.append(text))
    assert next(steps) == (0.35, "detecting persons")
    asked.set()
    assert drained(steps) == ([(0.5, "running the model")], "result")
    assert page == ["detecting persons", "running the model"]  # the page's bar gets every report as it is

    def failing(report):
        raise ValueError("no photo")

    with pytest.raises(ValueError, match="no photo"):
        list(streamed(failing, lambda *shown: shown))
    relay = pickle.loads(pickle.dumps(Relay(None, print)))
    assert relay.tell is None  # a device worker gets the page's side alone


def drained(steps) -> tuple[list, object]:
    """What a generator yields, and what it returns."""
    shown = []
    while True:
        try:
            shown.append(next(steps))
        except StopIteration as end:
            return shown, end.value


def test_gradio_analytics_are_off_unless_asked_for(monkeypatch):
    import app
    from sapiens2.runtime import Runtime

    runtime = Runtime(device="cpu")
    monkeypatch.delenv("GRADIO_ANALYTICS_ENABLED", raising=False)
    assert app.build_app(runtime).analytics_enabled is False
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "True")
    assert app.build_app(runtime).analytics_enabled is True
