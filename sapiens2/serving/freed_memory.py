"""Memory a request freed, handed back to the system once its answer is out (see
sapiens2.runtime.warm_heap), so the peaks of large requests one after another do not stack up."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from sapiens2.runtime.warm_heap import release_freed_memory


def release_after_answers(demo: Any, groups: Collection[str]) -> None:
    """After Gradio has turned each answer of an event of `groups` into what it sends (the handler's arrays
    and pictures freed by then), hand the freed memory back: off the event loop, as it walks every heap."""
    postprocess = demo.postprocess_data

    async def postprocess_then_release(block_fn: Any, predictions: Any, state: Any) -> Any:
        try:
            return await postprocess(block_fn, predictions, state)
        finally:
            if getattr(block_fn, "concurrency_id", None) in groups:
                await asyncio.to_thread(release_freed_memory)

    demo.postprocess_data = postprocess_then_release
