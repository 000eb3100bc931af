"""What a public web server needs around the runtime: the device slot and request jobs, each request's
and client's device time and share of the queue, webcam frames and streams, upload quotas, scratch
folders, a clean shutdown, and the Gradio tabs' components and handlers.

Imports `sapiens2.batch`, `sapiens2.runtime` and everything below them."""
