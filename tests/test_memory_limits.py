"""A model too big for memory is refused with the numbers, before anything big is allocated."""

import psutil
import pytest

from phoenix_chat.engine.backends.cpu import CpuBackend, f32_footprint
from phoenix_chat.engine.errors import OutOfMemoryError
from phoenix_chat.engine.weights import open_weights
from tests.tinymodels import sparse_gguf


def test_cpu_backend_refuses_model_that_does_not_fit(tmp_path):
    weights = open_weights(sparse_gguf(tmp_path / "huge.gguf"))
    need = f32_footprint(weights, 4096)
    assert need > psutil.virtual_memory().available  # ~60 GB of f32 weights
    rss_before = psutil.Process().memory_info().rss
    with pytest.raises(OutOfMemoryError, match=r"needs \d+\.\d GiB .* GiB is available"):
        CpuBackend(weights, 4096)
    assert psutil.Process().memory_info().rss - rss_before < 200 * 2**20
