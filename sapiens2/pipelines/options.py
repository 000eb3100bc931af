"""Declarative task options: one description drives the app's controls, the command line, defaults and the
typed options a pipeline reads (a `TaskOptions` subclass per task, one field per option)."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch

from sapiens2.errors import RequestError
from sapiens2.outputs.results import TaskOptions

if TYPE_CHECKING:
    from sapiens2.models.config import Sapiens2Config

OptionKind = Literal["slider", "checkbox", "color", "image", "choices"]


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
    choices: tuple[str, ...] = ()  # for "choices": the names any number of which may be chosen
    # For "choices": names always in the value, whether given or not (accepted when given, offered nowhere):
    # what a task always writes beside the extras chosen.
    always: tuple[str, ...] = ()
    # The option this one replaces when it is given (matting's background image over its colour): the page
    # turns that one's control off meanwhile.
    overrides: str | None = None
    # For "choices" whose names depend on the model (a fine-tuned model's classes): the choices a model's
    # config offers. Names beyond `choices` are then kept, for the task to check against its model's own.
    model_choices: Callable[[Sapiens2Config], tuple[str, ...]] | None = None

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
        if self.kind == "choices":
            only = f"{', '.join(self.always)} only" if self.always else "none"
            return ", ".join(self.default) or only
        return f"{self.default:g}" if self.kind == "slider" else str(self.default)

    def coerce(self, value: Any) -> Any:
        """`value` checked by type and range and converted to this option's type; None means the default
        (which must be settled by `on_device` first when it is a ByDevice).

        The one place where option values from the page, the API, the command line or Python are checked:
        anything else (a list, NaN, a huge number, a string that is not a number) is a RequestError naming
        the option and its allowed values, never a Python error.
        """
        if value is None:
            if isinstance(self.default, ByDevice):
                raise TypeError(
                    f"option {self.name!r}: its default depends on the device; call on_device first"
                )
            if self.default is None:
                return None
            value = self.default
        if self.kind == "slider":
            return self._number(value)
        if self.kind == "checkbox":
            return self._flag(value)
        if self.kind == "color":
            return parse_color(value, self.name)
        if self.kind == "choices":
            return self._chosen(value)
        return value

    def _number(self, value: Any) -> float:
        allowed = f"a number between {self.minimum:g} and {self.maximum:g}"
        number = _finite_number(value)
        if number is None:
            raise RequestError(f"Option '{self.name}' must be {allowed}, not {shown(value)}.")
        if not (self.minimum <= number <= self.maximum):
            raise RequestError(f"Option '{self.name}' must be {allowed}, not {number:g}.")
        return number

    def _chosen(self, value: Any) -> tuple[str, ...]:
        """The names chosen, from a list of names or one string of names separated by commas, in the order
        of `choices` (then, with `model_choices`, the other names in the order given)."""
        names = value.split(",") if isinstance(value, str) and len(value) <= 200 else value
        always = f"; {', '.join(self.always)} always comes too" if self.always else ""
        allowed = f"any of {', '.join(self.choices)} (a list, or names separated by commas{always})"
        if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) for name in names):
            raise RequestError(f"Option '{self.name}' must be {allowed}, not {shown(value)}.")
        chosen = list(dict.fromkeys(name.strip() for name in names if name.strip()))
        unknown = [name for name in chosen if name not in (*self.always, *self.choices)]
        if unknown and (self.model_choices is None or len(chosen) > _MAX_NAMES):
            raise RequestError(f"Option '{self.name}' must be {allowed}, not {shown(sorted(unknown)[0])}.")
        return (*self.always, *(name for name in self.choices if name in chosen), *unknown)

    def _flag(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _FLAG_WORDS:
            return _FLAG_WORDS[value.strip().lower()]
        raise RequestError(f"Option '{self.name}' must be true or false, not {shown(value)}.")


_FLAG_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
               "off": False}  # fmt: skip
_SHOWN_CHARS = 40
_MAX_NAMES = 256  # names one "choices" option takes beyond its own: a class id is one byte


def shown(value: Any) -> str:
    """A short, printable rendering of a value sent by a user, for messages."""
    text = repr(value) if isinstance(value, (str, int, float, bool)) else f"a {type(value).__name__}"
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _finite_number(value: Any) -> float | None:
    """`value` as a finite float (a number, or a string holding one), else None; bools are not numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    if isinstance(value, str) and len(value) > _SHOWN_CHARS:
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


_COLOUR_HELP = "use '#rrggbb' or 'rgb(r, g, b)' with r, g and b from 0 to 255"


def parse_color(value: Any, name: str = "background_color") -> tuple[int, int, int]:
    """An RGB triple from '#rrggbb', '#rgb', 'rgb(r, g, b)', 'rgba(r, g, b, a)' or three numbers 0-255."""
    channels: list[Any] | None = None
    if isinstance(value, (tuple, list)) and len(value) in (3, 4):
        channels = list(value[:3])
    elif isinstance(value, str) and len(value) <= 64:
        text = value.strip().lower()
        if re.fullmatch(r"#[0-9a-f]{6}|#[0-9a-f]{3}", text):
            digits = text[1:] if len(text) == 7 else "".join(c * 2 for c in text[1:])
            return tuple(int(digits[i : i + 2], 16) for i in (0, 2, 4))
        match = re.fullmatch(r"rgba?\((.*)\)", text)
        if match:
            parts = [part.strip() for part in match.group(1).split(",")]
            channels = parts[:3] if len(parts) in (3, 4) else None
    numbers = [_finite_number(channel) for channel in channels or []]
    if len(numbers) != 3 or any(n is None or not 0 <= n <= 255 for n in numbers):
        raise RequestError(f"Option '{name}' must be a colour: {_COLOUR_HELP}, not {shown(value)}.")
    return tuple(int(round(n)) for n in numbers)


_OPTION = "sapiens2.option"  # a TaskOptions field's metadata key: the Option it declares


def option(
    label: str,
    kind: OptionKind,
    default: Any,
    minimum: float | None = None,
    maximum: float | None = None,
    step: float | None = None,
    **more: Any,
) -> Any:
    """A field of a `TaskOptions` subclass declaring one option, named as the field (see `Option` for the
    arguments); the value is always given, checked, by `checked`."""
    declared = Option("", label, kind, default, minimum, maximum, step, **more)
    return field(metadata={_OPTION: declared})


@functools.cache
def declared(options: type[TaskOptions]) -> tuple[Option, ...]:
    """The options a `TaskOptions` subclass declares, in the order of its fields."""
    return tuple(replace(item.metadata[_OPTION], name=item.name) for item in fields(options))


T = TypeVar("T", bound=TaskOptions)


def checked(
    options: type[T], title: str, values: Mapping[str, Any], device: torch.device | str = "cpu"
) -> T:
    """`options` from `values` by name where given, else each option's default for models running on
    `device`; unknown names refused (`title`: the task's, for the message)."""
    settled = tuple(item.on_device(device) for item in declared(options))
    return options(**coerced(title, settled, values))


def coerced(title: str, options: Sequence[Option], values: Mapping[str, Any]) -> dict[str, Any]:
    """Every one of `options` by name, from `values` where given, else its default; names not among them
    refused."""
    known = {item.name: item for item in options}
    unknown = sorted(map(str, set(values) - set(known)))
    if unknown:
        names = ", ".join(shown(name) for name in unknown)
        raise RequestError(f"{title} has no option {names}; it takes {', '.join(known)}.")
    return {name: item.coerce(values.get(name)) for name, item in known.items()}
