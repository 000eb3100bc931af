"""Running tasks: `Runtime` (the task runner) and its model `Host` (the device, the model cache, the person
detector, forwards), the one device runner and its boundary, cancellation between batches, the sentences
shown for errors and the runtime flags both entry points share.

Imports `sapiens2.tasks` and everything below it."""

from sapiens2.runtime.host import DEFAULT_BATCH_SIZE, Host
from sapiens2.runtime.runtime import Runtime

__all__ = ["DEFAULT_BATCH_SIZE", "Host", "Runtime"]
