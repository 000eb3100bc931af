"""The settings: one parser with sentences naming the variable, the documented defaults, docs/settings.md
generated from them, and the process environment touched only by the settings module (and the MPS switch)."""

from __future__ import annotations

import ast
import pickle
import re
from dataclasses import fields
from pathlib import Path

import pytest

from sapiens2 import settings
from sapiens2.errors import ConfigError
from sapiens2.settings import FLAG, ONE, POSITIVE, TEXT, Settings, parse, whole

ROOT = Path(__file__).resolve().parents[1]
# The modules that may read or write the process environment: the settings, and PyTorch's MPS switch, which
# must be set before torch is imported.
ALLOWED = {"sapiens2/settings.py", "sapiens2/_mps_fallback.py"}


def test_a_number_above_zero():
    assert parse("SAPIENS2_MAX_MEGAPIXELS", " 12.5 ", POSITIVE) == 12.5
    for bad in ("0", "-3", "nan", "inf", "lots", "1e999"):
        with pytest.raises(
            ConfigError, match=rf"^SAPIENS2_MAX_MEGAPIXELS must be a number above 0, not '{bad}'"
        ):
            parse("SAPIENS2_MAX_MEGAPIXELS", bad, POSITIVE)


def test_a_whole_number_with_its_minimum():
    assert parse("SAPIENS2_TRUSTED_PROXIES", "0", whole(0)) == 0
    assert parse("SAPIENS2_MAX_PERSONS", " 5 ", whole(1)) == 5
    for bad in ("0", "2.5", "-1", "five", "1e3"):
        with pytest.raises(ConfigError, match="SAPIENS2_MAX_PERSONS must be a whole number of at least 1"):
            parse("SAPIENS2_MAX_PERSONS", bad, whole(1))


def test_a_switch_says_on_or_off_and_nothing_else():
    for on in ("1", "true", "Yes", " ON "):
        assert parse("SAPIENS2_COMPILE", on, FLAG) is True
    for off in ("0", "false", "No", "off"):
        assert parse("SAPIENS2_COMPILE", off, FLAG) is False
    assert parse("SAPIENS2_COMPILE", "", FLAG) is None and not Settings.read({"SAPIENS2_COMPILE": ""}).compile
    with pytest.raises(ConfigError, match=r"SAPIENS2_COMPILE must be 1, true, yes or on .*not 'maybe'"):
        parse("SAPIENS2_COMPILE", "maybe", FLAG)


def test_an_opt_in_takes_1_and_refuses_a_word():
    assert parse("SAPIENS2_WARM_HEAP", "1", ONE) is True
    assert parse("SAPIENS2_WARM_HEAP", "0", ONE) is False
    assert Settings.read({"SAPIENS2_WARM_HEAP": " "}) == Settings()
    with pytest.raises(ConfigError, match="SAPIENS2_WARM_HEAP must be 1 to turn it on"):
        parse("SAPIENS2_WARM_HEAP", "yes", ONE)


def test_empty_text_is_unset():
    assert parse("SAPIENS2_DEVICE", "  ", TEXT) is None
    assert parse("SAPIENS2_MAX_SIDE", "", whole(32)) is None
    assert Settings.read({"SAPIENS2_MAX_SIDE": " ", "SAPIENS2_DEVICE": ""}) == Settings()


def test_the_documented_defaults():
    defaults = Settings.read({})
    assert defaults == Settings()
    assert (defaults.max_megapixels, defaults.max_aspect, defaults.max_frame_megapixels) == (24.0, 10.0, 8.3)
    assert (defaults.max_video_frames, defaults.max_output_mb, defaults.max_jpeg_scans) == (300, 1536.0, 100)
    assert (defaults.max_video_samples, defaults.max_side, defaults.max_persons) == (1_000_000, 4096, 20)
    assert (defaults.upload_quota_mb, defaults.upload_total_mb, defaults.trusted_proxies) == (200, 4000, 0)
    assert (defaults.max_device_seconds, defaults.device_seconds_per_client, defaults.max_body_mb) == (
        120,
        300,
        8,
    )
    assert (defaults.max_queued_per_client, defaults.decode_seconds, defaults.stream_idle_seconds) == (
        2,
        20,
        5,
    )
    assert (defaults.server_name, defaults.server_port) == ("127.0.0.1", 7860)
    assert not (defaults.compile or defaults.warm_heap or defaults.monitoring or defaults.hub_offline)
    assert defaults.device is defaults.dtype is defaults.cache_gb is defaults.checkpoint_dir is None


def test_every_variable_is_read_with_its_type():
    given = Settings.read(
        {
            "SAPIENS2_MAX_MEGAPIXELS": "40",
            "SAPIENS2_MAX_PERSONS": "3",
            "SAPIENS2_COMPILE": "on",
            "SAPIENS2_CACHE_GB": "2",
            "SAPIENS2_CHECKPOINT_DIR": "/models",
            "HF_HOME": "/hf",
            "UNRELATED": "x",
        }
    )
    assert (given.max_megapixels, given.max_persons, given.compile, given.cache_gb) == (40.0, 3, True, 2.0)
    assert given.checkpoint_dir == "/models" and given.hub_cache_dir == "/hf/hub"
    assert Settings.read({"HF_HOME": "/hf", "HF_HUB_CACHE": "/cache"}).hub_cache_dir == "/cache"
    with pytest.raises(ConfigError, match="SAPIENS2_MAX_OUTPUT_MB must be a number above 0, not 'big'"):
        Settings.read({"SAPIENS2_MAX_OUTPUT_MB": "big"})


def test_flags_go_over_the_environment():
    base = Settings.read({"SAPIENS2_DEVICE": "cuda", "SAPIENS2_DTYPE": "bf16"})
    laid = base.but(device="cpu", dtype=None)
    assert (laid.device, laid.dtype) == ("cpu", "bf16")


def test_settings_travel_as_data():
    given = Settings.read({"SAPIENS2_MAX_SIDE": "512", "HF_HUB_OFFLINE": "1"})
    assert pickle.loads(pickle.dumps(given)) == given
    assert hash(given) == hash(Settings.read({"SAPIENS2_MAX_SIDE": "512", "HF_HUB_OFFLINE": "1"}))


def test_installed_settings_are_in_force_for_the_block_only(monkeypatch):
    monkeypatch.setenv("SAPIENS2_MAX_PERSONS", "7")
    assert settings.current().max_persons == 7
    with settings.installed(Settings(max_persons=3)):
        monkeypatch.setenv("SAPIENS2_MAX_PERSONS", "9")
        assert settings.current().max_persons == 3
    assert settings.current().max_persons == 9


def test_every_setting_is_documented_in_one_table():
    page = (ROOT / "docs" / "settings.md").read_text()
    assert settings.markdown_table() in page, "docs/settings.md's table: python -m sapiens2.settings"
    variables = [entry.metadata["variable"] for entry in fields(Settings)]
    assert len(variables) == len(set(variables))
    assert all(entry.metadata["meaning"] for entry in fields(Settings))
    for entry in fields(Settings):  # each default is a value its own parser gives, or None (the table says)
        default = entry.default
        text = "1" if default is True else "0" if default is False else str(default)
        assert default is None or entry.metadata["accepts"].value(text) == default, entry.name


def _touches_the_environment(path: Path) -> list[str]:
    """Where `path` reads or writes the process environment: os.environ, os.getenv, putenv, unsetenv."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in {
            "environ",
            "environb",
            "getenv",
            "putenv",
            "unsetenv",
        }:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names = {alias.name for alias in node.names}
            if names & {"environ", "environb", "getenv", "putenv", "unsetenv"}:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_the_settings_module_touches_the_environment():
    paths = [ROOT / "app.py", *sorted((ROOT / "sapiens2").rglob("*.py"))]
    touching = {str(path.relative_to(ROOT)) for path in paths if _touches_the_environment(path)}
    assert touching <= ALLOWED, [
        where
        for path in paths
        if str(path.relative_to(ROOT)) not in ALLOWED
        for where in _touches_the_environment(path)
    ]
    assert len(ALLOWED) <= 3


def test_every_variable_named_anywhere_is_a_setting():
    """A variable the README, the docs or the code name is read by the settings: none undocumented, none
    named that nothing reads."""
    known = {entry.metadata["variable"] for entry in fields(Settings)}
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "app.py"]
    texts += sorted((ROOT / "sapiens2").rglob("*.py"))
    named = {
        name
        for path in texts
        for name in re.findall(r"SAPIENS2_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_]*\*)", path.read_text())
    }
    assert named <= known, sorted(named - known)
    assert {name for name in known if name.startswith("SAPIENS2_")} <= named
