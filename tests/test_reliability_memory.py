"""Large requests one after another: the memory each freed is handed back after its answer, so the server's
resident memory does not stack up toward an out-of-memory kill (sapiens2.runtime.warm_heap)."""

from __future__ import annotations

import signal
import sys

import psutil
import pytest
from gradio_client import Client, handle_file
from test_reliability_attacks import app_process
from test_reliability_stops import large_photo

from sapiens2.runtime.warm_heap import release_freed_memory
from sapiens2.settings import Settings

MIB = 2**20
REQUESTS = 5
# Measured through `python app.py` on tiny checkpoints at 1024x768, five 12 MP /depth requests (2 shared CPU
# cores, under load): resident memory +245 to +345 MiB above the idle server before (two runs), +79 to +81
# MiB after each with the trim. The bound sits between, far from both. (At 256x192 the model's share is
# smaller: +187 before, +77 after.)
GROWTH_BOUND = 180 * MIB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_five_large_requests_leave_the_server_near_its_idle_memory(tiny_mirror, tmp_path):
    photo = large_photo(tmp_path)
    with app_process(tiny_mirror, tmp_path) as (process, url, _):
        server = psutil.Process(process.pid)
        idle = server.memory_info().rss
        client = Client(url, verbose=False)
        after = []
        for _ in range(REQUESTS):
            client.predict(handle_file(str(photo)), api_name="/depth")
            after.append(server.memory_info().rss)
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    growth = [(rss - idle) // MIB for rss in after]
    print(f"resident memory after each of {REQUESTS} 12 MP /depth answers, above the idle: {growth} MiB")
    assert max(after) - idle < GROWTH_BOUND, growth


def test_the_trim_respects_a_warm_heap():
    assert release_freed_memory(Settings(warm_heap=True)) is False
    assert release_freed_memory(Settings(warm_heap=False)) is sys.platform.startswith("linux")
