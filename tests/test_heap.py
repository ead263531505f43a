"""engine/heap.py on a real model: what a dropped model leaves in glibc's heaps goes back to the
OS (the worker calls it after every unload, tests/conftest.py after every module)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from phoenix_chat.engine.heap import can_trim

pytestmark = pytest.mark.skipif(not can_trim(), reason="no glibc malloc_trim here (musl or macOS)")

# A fresh process, so that nothing of this test session's heap is measured.
_SCRIPT = """
import gc, json, psutil
from phoenix_chat import engine
from phoenix_chat.engine.heap import release_freed_memory
rss = lambda: psutil.Process().memory_info().rss
model = engine.load(path=None, backend="cpu", quant="f16", context_length=2048)
loaded = rss()
model.backend.close()
del model
gc.collect()
closed = rss()
release_freed_memory()
print(json.dumps({"loaded": loaded, "closed": closed, "released": rss()}))
"""


def test_a_dropped_model_s_heap_goes_back_to_the_os():
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=600, check=True)
    mb = {k: v / 2**20 for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    # measured here, MiB: loaded 1,451 / closed (gc only) 183 / released 57 with the tokenizer
    # already built; 2,068 / 1,136 / 65 where this process built it (an app's first start)
    assert mb["released"] < mb["closed"] - 64, mb
    assert mb["released"] < mb["loaded"] / 8, mb
