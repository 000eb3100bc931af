"""Whether the Hugging Face Hub may be asked (HF_HUB_OFFLINE) and can be reached: one short request, whose
answer is kept for a minute, so that a machine without a connection learns it once and not per file."""

from __future__ import annotations

import threading
import time

from huggingface_hub import constants
from huggingface_hub.utils import get_session, httpx

from sapiens2.settings import current

PROBE_TIMEOUT_SECONDS = 3.0
REMEMBER_SECONDS = 60.0

_lock = threading.Lock()
_known: dict[str, tuple[bool, float]] = {}  # endpoint -> (reachable, until when, monotonic)


def offline() -> bool:
    """HF_HUB_OFFLINE as set now (huggingface_hub reads it once, at import)."""
    return current().hub_offline or constants.HF_HUB_OFFLINE


def reachable() -> bool:
    """Whether the Hub answers at all (any HTTP status counts), through huggingface_hub's own client and its
    proxy settings; asked at most once a minute, concurrent callers waiting for the one answer."""
    endpoint = constants.ENDPOINT
    with _lock:
        known = _known.get(endpoint)
        if known is not None and time.monotonic() < known[1]:
            return known[0]
        try:
            get_session().head(endpoint, timeout=PROBE_TIMEOUT_SECONDS, follow_redirects=False)
            answer = True
        except (httpx.HTTPError, OSError):
            answer = False
        _known[endpoint] = (answer, time.monotonic() + REMEMBER_SECONDS)
        return answer


def local_only() -> bool:
    """True when files must come from the local cache: the Hub is forbidden or cannot be reached."""
    return offline() or not reachable()


def mark_unreachable() -> None:
    """Remember for a minute that a request to the Hub failed to connect."""
    with _lock:
        _known[constants.ENDPOINT] = (False, time.monotonic() + REMEMBER_SECONDS)


def forget() -> None:
    """Ask the Hub again on the next call."""
    with _lock:
        _known.clear()
