"""The Gradio components the tabs are made of, each chosen from what the registry declares."""

from __future__ import annotations

from collections.abc import Sequence

import gradio as gr

from sapiens2.pipelines.options import Option
from sapiens2.tasks import TASKS, video_options

FIRST_TASK = next(iter(TASKS))
FEW_CHOICES = 8  # a "choices" option with more names is a dropdown of them, not a row of checkboxes
MATTES = ("Mask", "Alpha")  # pictures white where full: tinted on the page (app.CSS, .studio-matte)
RESULT = "studio-result"  # a tab's first result: scrolled into view on a phone when it arrives (app.PAGE_JS)


def task_choice() -> gr.Radio:
    return gr.Radio([(task.title, task.name) for task in TASKS.values()], value=FIRST_TASK, label="Task")


def size_choice(sizes: Sequence[str], default: str, info: str | None = None) -> gr.Dropdown:
    """A model-size list: `default` chosen when it is listed, else the first size."""
    value = default if default in sizes else sizes[0]
    return gr.Dropdown(list(sizes), value=value, label="Model size", info=info)


def video_controls(device) -> list[gr.components.Component]:
    """The controls of every task's video options (settled for `device`), under the tasks they are for."""
    offered = video_options()
    if not offered:
        return []
    owners = sorted({TASKS[name].title for _, tasks in offered.values() for name in tasks})
    with gr.Accordion(f"Video options ({', '.join(owners)})", open=False):
        return [control(option.on_device(device)) for option, _ in offered.values()]


def photo_input(elem_id: str) -> gr.Image:
    return gr.Image(
        label="Photo",
        type="filepath",
        sources=["upload", "clipboard", "webcam"],
        image_mode=None,
        height=360,
        elem_id=elem_id,
    )


def control(option: Option) -> gr.components.Component:
    """The input component of one task option, chosen by its kind."""
    info = option.help or None
    if option.kind == "slider":
        return gr.Slider(
            option.minimum,
            option.maximum,
            value=option.default,
            step=option.step,
            label=option.label,
            info=info,
        )
    if option.kind == "checkbox":
        return gr.Checkbox(value=option.default, label=option.label, info=info)
    if option.kind == "color":
        return gr.ColorPicker(value=option.default, label=option.label, info=info)
    if option.kind == "choices" and (len(option.choices) > FEW_CHOICES or option.model_choices):
        # A model's own names (a fine-tuned model's classes) may be typed in beside the choices listed.
        return gr.Dropdown(
            list(option.choices),
            value=list(option.default),
            multiselect=True,
            allow_custom_value=option.model_choices is not None,
            label=option.label,
            info=info,
            elem_id=f"option-{option.name}",
        )
    if option.kind == "choices":
        choices, chosen = list(option.choices), list(option.default)
        return gr.CheckboxGroup(choices, value=chosen, label=option.label, info=info)
    return gr.Image(label=option.label, type="filepath", sources=["upload", "clipboard"], height=160)


def picture_outputs(titles: Sequence[str], elem_id: str) -> list[gr.Image]:
    """The first picture large (with `elem_id`), the others side by side under it (`elem_id`-2, -3, ...)."""
    main = shown_picture(titles[0], 520, elem_id, result=True)
    if len(titles) == 1:
        return [main]
    with gr.Row():
        rest = [shown_picture(title, 300, f"{elem_id}-{n}") for n, title in enumerate(titles[1:], start=2)]
    return [main, *rest]


def shown_picture(
    title: str,
    height: int,
    elem_id: str | None = None,
    show_label: bool = True,
    result: bool = False,
    picture: str | None = None,
) -> gr.Image:
    """An output picture titled `title`; `result` marks a tab's first result, `picture` names what it shows
    when the title does not (an All tasks tile)."""
    classes = [*(["studio-matte"] if (picture or title) in MATTES else []), *([RESULT] if result else [])]
    return gr.Image(
        label=title,
        type="filepath",
        height=height,
        interactive=False,
        elem_id=elem_id,
        show_label=show_label,
        elem_classes=classes,
    )


def text_outputs() -> tuple[gr.Markdown, gr.Markdown]:
    """The summary and the timing line: plain text, one line per line."""
    summary = gr.Markdown(line_breaks=True)
    timing = gr.Markdown(line_breaks=True, elem_classes="studio-timing")
    return summary, timing


def downloads(elem_id: str) -> gr.File:
    """The list of files to download, as tall as it needs to be to show every file."""
    return gr.File(
        label="Downloads",
        file_count="multiple",
        interactive=False,
        height=None,
        elem_id=elem_id,
        elem_classes="studio-downloads",
    )
