"""What every Ray worker of a run does before its first photo or frame."""

from __future__ import annotations

from sapiens2.models import kernels
from sapiens2.runtime.arguments import kernel_choices_file
from sapiens2.settings import Settings, install


def start_worker(settings: Settings) -> None:
    """The run's settings, received as data, made this process's; and the CPU kernels measured fastest on
    this machine, read from the file the command line keeps, so every worker and a run without --ray
    compute alike to the bit."""
    install(settings)
    kernels.remember_in(kernel_choices_file())
