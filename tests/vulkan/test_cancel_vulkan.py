"""Stop during prefill on the Vulkan backend (lavapipe in CI): the cancel check runs before
each prefill submission, so Stop lands within one chunk, and the backend stays usable."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from phoenix_chat.engine.errors import CancelledError

LONG_TEXT = "The quick brown fox jumps over the lazy dog while the phoenix watches. " * 140  # ~2,000 tokens


@pytest.fixture(scope="module")
def vk_backend(vk_device):
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.weights import embedded_model_path, open_weights

    weights = open_weights(embedded_model_path())
    backend = VulkanBackend(weights, 4096, device=vk_device)
    yield backend, weights.tokenizer().encode(LONG_TEXT)
    backend.close()
    weights.close()


def test_cancel_between_prefill_chunks_and_the_backend_stays_usable(vk_backend):
    backend, ids = vk_backend
    assert len(ids) > 3 * backend.prefill_chunk
    short = ids[:16]
    before = backend.forward(short, 0)
    asked = []

    def cancel_after_first_chunk() -> bool:
        asked.append(time.perf_counter())
        return len(asked) > 1

    t0 = time.perf_counter()
    with pytest.raises(CancelledError):
        backend.forward(ids, 0, cancel=cancel_after_first_chunk)
    assert len(asked) == 2  # asked before chunk 1 (no) and before chunk 2 (stop): one chunk ran
    chunk_s = asked[1] - asked[0]
    print(
        f"lavapipe: one {backend.prefill_chunk}-token prefill chunk {chunk_s:.2f} s "
        f"(total {time.perf_counter() - t0:.2f} s)"
    )
    assert np.allclose(backend.forward(short, 0), before, atol=1e-3)

    # Timed: Stop set partway through a chunk lands when that chunk ends (within one chunk).
    stop = threading.Event()
    delay = chunk_s * 1.5  # inside the second chunk
    threading.Timer(delay, stop.set).start()
    t0 = time.perf_counter()
    with pytest.raises(CancelledError):
        backend.forward(ids, 0, cancel=stop.is_set)
    latency = time.perf_counter() - t0 - delay
    print(f"lavapipe stop latency {latency:.2f} s (one chunk {chunk_s:.2f} s)")
    assert latency < chunk_s * 1.5 + 1.0
