"""One progress bar per request that only grows, with its stage's text: normals and depth with their
body-part helper, All tasks' overall bar beside its tiles."""

import pickle

import numpy as np
import pytest
from PIL import Image

from sapiens2.progress import within
from sapiens2.serving.requests import PageProgress, StagedProgress
from sapiens2.serving.streaming import Relay, streamed


class Bar:
    """Stands in for gr.Progress: what the page would be shown."""

    def __init__(self) -> None:
        self.shown: list[tuple[float | None, str]] = []

    def __call__(self, fraction, desc=None):
        self.shown.append((fraction, desc))


def grows(shown: list[tuple[float | None, str]]) -> bool:
    fractions = [fraction for fraction, _ in shown]
    return None not in fractions and fractions == sorted(fractions)


def test_a_second_model_after_the_first_never_takes_the_bar_back():
    bar = Bar()
    report = StagedProgress(bar)
    for fraction in (0.0, 1.0):
        report(fraction, "loading facebook/sapiens2-normal-0.4b")
    report(None, "running the model")
    for fraction in (0.0, 0.5, 1.0):
        report(fraction, "loading facebook/sapiens2-seg-0.4b")
    report(None, "running the body-part model")
    report(None, "a stage no table names")
    report(None, "drawing the pictures")
    assert grows(bar.shown), bar.shown
    shares = dict((text, fraction) for fraction, text in bar.shown)
    assert shares["running the body-part model"] > shares["running the model"]
    assert bar.shown[-1] == (0.8, "drawing the pictures")
    assert bar.shown[5][1] == "loading facebook/sapiens2-seg-0.4b", "the text is the new one"


def test_the_page_bar_keeps_its_place_for_a_text_without_a_fraction():
    bar = Bar()
    report = PageProgress(bar)
    report(0.7, "frame 7 of 10")
    report(None, "writing files")
    assert bar.shown == [(0.7, "frame 7 of 10"), (0.7, "writing files")]
    assert pickle.loads(pickle.dumps(report)).shown == 0.7


def test_all_tasks_overall_bar_agrees_with_its_tile():
    bar, tile = Bar(), []

    def work(report):
        report(None, "running the model")
        report(None, "drawing the pictures")
        return "done"

    page = PageProgress(bar)
    step = within(page, 1 / 5, 2 / 5, "Body parts: ")
    shown = list(streamed(work, lambda fraction, text: tile.append((fraction, text)), step))
    assert len(shown) >= 1 and tile[-1] == (0.8, "drawing the pictures")
    overall = [fraction for fraction, _ in bar.shown]
    assert overall == pytest.approx([1 / 5 + 0.5 / 5, 1 / 5 + 0.8 / 5]), "the tile's fraction, in its span"
    assert [text for _, text in bar.shown][0] == "Body parts: running the model"
    relay = pickle.loads(pickle.dumps(Relay(page, print)))
    assert relay.tell is None and relay.page.bar is not None


@pytest.mark.parametrize("task", ["normals", "depth"])
def test_normals_and_depth_with_the_body_part_model_report_one_growing_bar(task, tiny_mirror, monkeypatch):
    from sapiens2 import Runtime

    monkeypatch.setenv("SAPIENS2_CHECKPOINT_DIR", str(tiny_mirror))
    photo = np.asarray(Image.open(__import__("app").ASSETS / "astronaut.png").convert("RGB"))[:160, :120]
    bar = Bar()
    Runtime(device="cpu").run(task, photo, remove_background=True, progress=StagedProgress(bar))
    texts = [text for _, text in bar.shown]
    assert any("body-part" in text for text in texts), texts
    assert grows(bar.shown), bar.shown
