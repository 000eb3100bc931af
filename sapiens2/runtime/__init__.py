"""Running tasks: `Runtime` (the device, the model cache, the person detector), cancellation between
batches, the sentences shown for errors and the runtime flags both entry points share.

Imports `sapiens2.tasks` and everything below it."""

from sapiens2.runtime.runtime import DEFAULT_BATCH_SIZE, Runtime

__all__ = ["DEFAULT_BATCH_SIZE", "Runtime"]
