"""Declarative task options: one description drives the app's controls, the command line and defaults."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

OptionKind = Literal["slider", "checkbox", "color", "image"]


@dataclass(frozen=True)
class ByDevice:
    """A default that depends on where the models run: `gpu` on a GPU (CUDA or MPS), `cpu` on the CPU."""

    gpu: Any
    cpu: Any

    def pick(self, device: torch.device | str) -> Any:
        """The value for `device`."""
        return self.cpu if torch.device(device).type == "cpu" else self.gpu


@dataclass(frozen=True)
class Option:
    """A user-settable parameter of a task, with its default and, for sliders, its range."""

    name: str
    label: str
    kind: OptionKind
    default: Any
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    help: str = ""

    def on_device(self, device: torch.device | str) -> Option:
        """This option with its default settled for models running on `device` (see ByDevice)."""
        if isinstance(self.default, ByDevice):
            return replace(self, default=self.default.pick(device))
        return self

    @property
    def default_text(self) -> str:
        """The default as the command line's help states it: "on", "0.3", "on with a GPU, off on the CPU"."""
        if isinstance(self.default, ByDevice):
            on_gpu, on_cpu = (
                replace(self, default=v).default_text for v in (self.default.gpu, self.default.cpu)
            )
            return f"{on_gpu} with a GPU, {on_cpu} on the CPU"
        if self.kind == "checkbox":
            return "on" if self.default else "off"
        return f"{self.default:g}" if self.kind == "slider" else str(self.default)

    def coerce(self, value: Any) -> Any:
        """`value` checked and converted to this option's type; None means the default (which must be settled
        by `on_device` first when it is a ByDevice)."""
        if value is None:
            if isinstance(self.default, ByDevice):
                raise TypeError(
                    f"option {self.name!r}: its default depends on the device; call on_device first"
                )
            if self.default is None:
                return None
            value = self.default
        if self.kind == "slider":
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"Option {self.name!r} must be a number, got {value!r}.") from None
            if not (self.minimum <= number <= self.maximum):
                raise ValueError(f"Option {self.name!r} must be between {self.minimum} and {self.maximum}.")
            return number
        if self.kind == "checkbox":
            if isinstance(value, str):
                return value.strip().lower() in ("1", "true", "yes", "on")
            return bool(value)
        if self.kind == "color":
            return parse_color(value)
        return value


def parse_color(value: Any) -> tuple[int, int, int]:
    """An RGB triple from '#rrggbb', 'rgb(r, g, b)', 'rgba(...)' or a sequence of three numbers."""
    if isinstance(value, (tuple, list)) and len(value) >= 3:
        return tuple(int(max(0, min(255, round(float(c))))) for c in value[:3])
    text = str(value).strip()
    if text.startswith("#") and len(text) in (4, 7):
        digits = text[1:] if len(text) == 7 else "".join(c * 2 for c in text[1:])
        try:
            return tuple(int(digits[i : i + 2], 16) for i in (0, 2, 4))
        except ValueError:
            pass
    if text.startswith(("rgb(", "rgba(")) and text.endswith(")"):
        parts = text[text.index("(") + 1 : -1].split(",")
        try:
            return parse_color([float(p) for p in parts[:3]])
        except ValueError:
            pass
    raise ValueError(f"Colour {value!r} is not understood; use '#rrggbb' or 'rgb(r, g, b)'.")
