"""Every setting an operator gives through environment variables: its default and meaning, in one place.

An entry point (the app, the command line, the Ray driver, or a library call made without one) builds one
`Settings` from the environment with `Settings.read`, lays its flags over it, and passes it down as
data; Ray workers receive it pickled. One parser reads every value and refuses a bad one with a sentence
naming the variable and what it accepts. This module and `_mps_fallback` are the package's only readers
and writers of the process environment; `export` writes the variables other libraries read themselves.
docs/settings.md is `markdown_table()`, checked by a test.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any

from sapiens2.errors import ConfigError


@dataclass(frozen=True)
class Accepts:
    """What a setting accepts: in words (`says`), and the value of a text that fits (`value`: None when it
    does not)."""

    says: str
    value: Callable[[str], Any]


def _number(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def _switch(on: set[str], off: set[str]) -> Callable[[str], bool | None]:
    return lambda text: True if text.lower() in on else False if text.lower() in off else None


POSITIVE = Accepts("a number above 0", _number)
FLAG = Accepts(
    "1, true, yes or on (0, false, no or off: off)",
    _switch({"1", "true", "yes", "on"}, {"0", "false", "no", "off"}),
)
ONE = Accepts("1 to turn it on (0: off)", _switch({"1"}, {"0"}))  # the server's opt-ins, documented as =1
TEXT = Accepts("any text", str)


def whole(minimum: int) -> Accepts:
    """A whole number of at least `minimum`."""
    return Accepts(
        f"a whole number of at least {minimum}",
        lambda text: int(text) if text.isdecimal() and int(text) >= minimum else None,
    )


def _setting(variable: str, default: Any, accepts: Accepts, meaning: str, *, shown: str | None = None) -> Any:
    """A field of `Settings` read from `variable`; `shown` is the default as the table says it."""
    metadata = {"variable": variable, "accepts": accepts, "meaning": meaning, "shown": shown}
    return field(default=default, metadata=metadata)


def parse(variable: str, raw: str, accepts: Accepts) -> Any:
    """The value of `raw` (None for empty text: unset, the default holds); ConfigError naming `variable` and
    what it accepts when `raw` does not fit."""
    text = raw.strip()
    if not text:
        return None
    value = accepts.value(text)
    if value is None:
        raise ConfigError(f"{variable} must be {accepts.says}, not {raw!r}.")
    return value


@dataclass(frozen=True)
class Settings:
    """The settings in force: each field's variable, what it accepts and its meaning are in its metadata
    (see `table`); None means the default described there."""

    # What one request may cost (sapiens2.vision.limits). 24 MP takes every phone and most camera photos as
    # they are; a 10:1 strip is wider than any panorama a phone takes in one sweep at 24 MP; 8.3 MP is 4K UHD;
    # 300 frames are 10 s at 30 frames per second; a 24 MP photo through All tasks writes about 1.1 GB; a
    # progressive JPEG has about 10 scans, each a pass over the whole image (23,000 scans of a 24 MP photo
    # took 55 s to decode); FFmpeg keeps tens of bytes of index per sample: a million is nine hours at 30
    # frames per second, about 40 MB.
    max_megapixels: float = _setting(
        "SAPIENS2_MAX_MEGAPIXELS", 24.0, POSITIVE, "megapixels of a photo (every phone and most cameras)"
    )
    max_aspect: float = _setting(
        "SAPIENS2_MAX_ASPECT", 10.0, POSITIVE, "ratio of a photo's or frame's long side to its short one"
    )
    max_frame_megapixels: float = _setting(
        "SAPIENS2_MAX_FRAME_MEGAPIXELS", 8.3, POSITIVE, "megapixels of a video or webcam frame (4K UHD)"
    )
    max_video_frames: int = _setting(
        "SAPIENS2_MAX_VIDEO_FRAMES", 300, whole(1), "frames of a video the app processes per request"
    )
    max_output_mb: float = _setting(
        "SAPIENS2_MAX_OUTPUT_MB", 1536.0, POSITIVE, "megabytes of files one app request may write"
    )
    max_jpeg_scans: int = _setting(
        "SAPIENS2_MAX_JPEG_SCANS",
        100,
        whole(1),
        "scans (progressive passes) of a JPEG, counted before decoding",
    )
    max_video_samples: int = _setting(
        "SAPIENS2_MAX_VIDEO_SAMPLES", 1_000_000, whole(1), "samples in any one table of an MP4/MOV file"
    )
    max_side: int = _setting(
        "SAPIENS2_MAX_SIDE",
        4096,
        whole(32),
        "longest side of the image the models see (larger photos shrink)",
    )
    max_persons: int = _setting(
        "SAPIENS2_MAX_PERSONS", 20, whole(1), "persons per photo the pose detector keeps"
    )
    decode_seconds: float = _setting(
        "SAPIENS2_DECODE_SECONDS", 20.0, POSITIVE, "seconds the app's decoder may spend on one image"
    )
    # What the public server allows (sapiens2.serving)
    upload_quota_mb: int = _setting(
        "SAPIENS2_UPLOAD_QUOTA_MB", 200, whole(1), "megabytes one client may upload over 40 minutes"
    )
    upload_total_mb: int = _setting(
        "SAPIENS2_UPLOAD_TOTAL_MB", 4000, whole(1), "megabytes everyone together may upload over 40 minutes"
    )
    trusted_proxies: int = _setting(
        "SAPIENS2_TRUSTED_PROXIES",
        0,
        whole(0),
        "proxies in front of the server that append to X-Forwarded-For (1 on a Hugging Face Space)",
    )
    max_queued_per_client: int = _setting(
        "SAPIENS2_MAX_QUEUED_PER_CLIENT", 2, whole(1), "model requests one client may have in the queue"
    )
    max_device_seconds: int = _setting(
        "SAPIENS2_MAX_DEVICE_SECONDS", 120, whole(1), "seconds of model work one request may hold the device"
    )
    device_seconds_per_client: int = _setting(
        "SAPIENS2_DEVICE_SECONDS_PER_CLIENT",
        300,
        whole(1),
        "seconds of model work one client may use in 10 minutes",
    )
    header_seconds: float = _setting(
        "SAPIENS2_HEADER_SECONDS", 10.0, POSITIVE, "seconds a connection may take to send a request's headers"
    )
    connections_per_client: int = _setting(
        "SAPIENS2_CONNECTIONS_PER_CLIENT",
        32,
        whole(1),
        "connections one address may hold (a browser opens about 6; off behind trusted proxies)",
    )
    max_connections: int | None = _setting(
        "SAPIENS2_MAX_CONNECTIONS",
        None,
        whole(1),
        "connections the server holds in all",
        shown="the file-descriptor limit less 256",
    )
    scratch_mb: int = _setting(
        "SAPIENS2_SCRATCH_MB", 4000, whole(1), "megabytes of answers being written at once, for everyone"
    )
    answer_quota_mb: int = _setting(
        "SAPIENS2_ANSWER_QUOTA_MB", 3000, whole(1), "megabytes of answers one client may get over 40 minutes"
    )
    answer_total_mb: int = _setting(
        "SAPIENS2_ANSWER_TOTAL_MB",
        12000,
        whole(1),
        "megabytes of answers everyone together may get over 40 minutes",
    )
    max_body_mb: int = _setting(
        "SAPIENS2_MAX_BODY_MB", 8, whole(1), "megabytes of a request body other than an upload"
    )
    stream_idle_seconds: float = _setting(
        "SAPIENS2_STREAM_IDLE_SECONDS",
        5.0,
        POSITIVE,
        "seconds a webcam stream may send no frame before it ends",
    )
    max_queue: int = _setting(
        "SAPIENS2_MAX_QUEUE", 24, whole(1), "requests the app's queue holds; more are refused"
    )
    max_upload_mb: int = _setting(
        "SAPIENS2_MAX_UPLOAD_MB", 40, whole(1), "mebibytes (MiB, as Gradio counts them) of one uploaded file"
    )
    live_streams: int = _setting(
        "SAPIENS2_LIVE_STREAMS", 4, whole(1), "webcam streams the app serves at once"
    )
    live_streams_per_client: int | None = _setting(
        "SAPIENS2_LIVE_STREAMS_PER_CLIENT",
        None,
        whole(1),
        "webcam streams one client may hold at once",
        shown="half the live places, at least 1",
    )
    monitoring: bool = _setting(
        "SAPIENS2_MONITORING", False, ONE, "Gradio's monitoring pages (open to anyone)"
    )
    analytics: bool = _setting("GRADIO_ANALYTICS_ENABLED", False, FLAG, "Gradio's usage analytics")
    server_name: str = _setting("GRADIO_SERVER_NAME", "127.0.0.1", TEXT, "the app's address (--host)")
    server_port: int = _setting("GRADIO_SERVER_PORT", 7860, whole(1), "the app's port (--port)")
    # The models and where they come from (sapiens2.runtime, sapiens2.models)
    device: str | None = _setting(
        "SAPIENS2_DEVICE", None, TEXT, "cpu, cuda, cuda:N or mps (--device)", shown="cuda, else mps, else cpu"
    )
    dtype: str | None = _setting(
        "SAPIENS2_DTYPE",
        None,
        TEXT,
        "bf16, fp16 or fp32 (--dtype)",
        shown="bf16 on CUDA and CPUs with native bf16, else fp32",
    )
    compile: bool = _setting(
        "SAPIENS2_COMPILE", False, FLAG, "run the models through torch.compile (--compile)"
    )
    cache_gb: float | None = _setting(
        "SAPIENS2_CACHE_GB",
        None,
        POSITIVE,
        "gigabytes of loaded models kept",
        shown="16 on CUDA, else the memory the process may use (its cgroup's limit) less 6",
    )
    checkpoint_dir: str | None = _setting(
        "SAPIENS2_CHECKPOINT_DIR",
        None,
        TEXT,
        "local checkpoints: DIR/<repo id>/ (--checkpoint-dir)",
        shown="none",
    )
    detector: str | None = _setting(
        "SAPIENS2_DETECTOR",
        None,
        TEXT,
        "the person detector: an ultralytics name or a .pt file (--detector)",
        shown="yolo11m.pt",
    )
    zerogpu_aot: bool = _setting(
        "SAPIENS2_ZEROGPU_AOT",
        True,
        ONE,
        "on ZeroGPU, compile the start-up models' blocks ahead of time (0: eager)",
    )
    warm_heap: bool = _setting(
        "SAPIENS2_WARM_HEAP", False, ONE, "keep freed memory mapped (faster large results, higher peak)"
    )
    hub_offline: bool = _setting("HF_HUB_OFFLINE", False, FLAG, "never ask the Hugging Face Hub")
    hub_cache: str | None = _setting(
        "HF_HUB_CACHE", None, TEXT, "the Hub's download cache", shown="HF_HOME/hub"
    )
    hf_home: str | None = _setting(
        "HF_HOME", None, TEXT, "the Hub's home folder", shown="~/.cache/huggingface"
    )
    xdg_cache_home: str | None = _setting(
        "XDG_CACHE_HOME",
        None,
        TEXT,
        "the user's cache folder: sapiens2/kernel-choices.json keeps the CPU kernels measured fastest",
        shown="~/.cache",
    )
    onednn_max_cpu_isa: str = _setting(
        "ONEDNN_MAX_CPU_ISA",
        "",
        TEXT,
        "oneDNN's instruction limit (read by oneDNN; the kernel choices note it)",
    )
    detector_offline: bool = _setting("YOLO_OFFLINE", False, FLAG, "never download the person detector")

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings `environ` (the process environment by default) gives, the defaults for the rest."""
        environ = os.environ if environ is None else environ
        values = {}
        for entry in fields(cls):
            raw = environ.get(entry.metadata["variable"])
            if raw is not None:
                value = parse(entry.metadata["variable"], raw, entry.metadata["accepts"])
                values[entry.name] = entry.default if value is None else value
        return cls(**values)

    def but(self, **values: Any) -> Settings:
        """These settings with `values` (a flag's, say) in place of theirs; None leaves a setting as it is."""
        return replace(self, **{name: value for name, value in values.items() if value is not None})

    @property
    def hub_cache_dir(self) -> str | None:
        """HF_HUB_CACHE, else HF_HOME/hub; None leaves huggingface_hub's default."""
        if self.hub_cache:
            return self.hub_cache
        return os.path.join(self.hf_home, "hub") if self.hf_home else None


def table() -> list[tuple[str, str, str, str]]:
    """(variable, default, what it accepts, meaning) of every setting, in the order of `Settings`."""
    rows = []
    for entry in fields(Settings):
        shown = entry.metadata["shown"]
        default = shown if shown is not None else entry.default
        default = {True: "on", False: "off"}.get(default, default) if isinstance(default, bool) else default
        text = f"{default:g}" if isinstance(default, float) else str(default)
        rows.append(
            (entry.metadata["variable"], text, entry.metadata["accepts"].says, entry.metadata["meaning"])
        )
    return rows


def markdown_table() -> str:
    """docs/settings.md's table of every setting."""
    lines = ["| variable | default | accepts | meaning |", "| --- | --- | --- | --- |"]
    lines += [
        f"| `{variable}` | {default} | {accepts} | {meaning} |"
        for variable, default, accepts, meaning in table()
    ]
    return "\n".join(lines) + "\n"


_installed: Settings | None = None


def current() -> Settings:
    """The settings the running entry point installed; for a library call made without one, those the
    environment gives now."""
    return _installed if _installed is not None else Settings.read()


def install(settings: Settings) -> None:
    """Make `settings` this process's settings (an entry point, or a Ray worker given the driver's)."""
    global _installed
    _installed = settings


@contextmanager
def installed(settings: Settings) -> Iterator[Settings]:
    """`settings` installed for the block (a command run inside a longer-lived process), then the ones
    before put back."""
    global _installed
    before = _installed
    _installed = settings
    try:
        yield settings
    finally:
        _installed = before


def export(name: str, value: str, *, keep: bool = True) -> None:
    """Set the variable `name` that another library reads itself (OpenCV, ultralytics, Ray); an operator's
    own value is kept when `keep`."""
    if keep:
        os.environ.setdefault(name, value)
    else:
        os.environ[name] = value


if __name__ == "__main__":
    print(markdown_table(), end="")
