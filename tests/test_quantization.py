"""One quantization contract for every backend (issue 24, defect 1): the choice is spelt one way
(`WeightQuant`), read case-insensitively, and applied and reported by the CPU backend as well as
the Vulkan one (lavapipe here), on the real embedded model."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat import engine
from phoenix_chat.engine.errors import PhoenixError
from phoenix_chat.engine.quantization import WeightQuant

pytestmark = pytest.mark.slow
MATRICES = 1 + 18 * 7  # the tied embedding and seven projections in each of the 270M's 18 layers
NORMS = 1 + 18 * 6


def test_the_choice_parses_in_any_case_and_a_bad_one_is_a_user_error():
    assert WeightQuant.parse("Q8_0") is WeightQuant.Q8_0  # what settings.json held before the fix
    assert WeightQuant.parse("q4_0") is WeightQuant.Q4_0
    assert WeightQuant.parse(WeightQuant.F16) is WeightQuant.F16
    assert WeightQuant.parse(None) is None and WeightQuant.parse("file") is None
    with pytest.raises(PhoenixError, match="unknown quantization 'q3_k'.*q4_0, q8_0, f16"):
        WeightQuant.parse("q3_k")


def test_a_bad_choice_fails_before_any_backend_is_tried(model_path):
    # `auto` used to meet a ValueError from the Vulkan options and not fall back.
    with pytest.raises(PhoenixError, match="unknown quantization"):
        engine.load(model_path, backend="auto", quant="Q3_K")


def _expected(quant: WeightQuant) -> dict[str, int]:
    if quant is WeightQuant.Q4_0:  # the embedding keeps 8 bits, as in llama.cpp's Q4_0 files
        return {"Q8_0": 1, "Q4_0": MATRICES - 1, "F32": NORMS}
    return {quant.label: MATRICES, "F32": NORMS}


@pytest.mark.parametrize("quant", list(WeightQuant))
def test_the_cpu_backend_applies_the_choice_to_its_weights(model_path, quant):
    model = engine.load(model_path, backend="auto", quant=quant.label, context_length=256)  # "Q8_0": old settings
    try:
        info = model.describe()
        assert info["backend"] == "cpu"  # no hardware GPU here: auto takes the CPU
        assert info["quant"] == quant.value
        assert info["weight_types"] == _expected(quant)
        assert quant.label in info["device"]
        w = model.backend.model.w["layers.0.mlp.down_proj"]  # type: ignore[attr-defined]
        blocks = w.reshape(-1, 32).astype(np.float64)
        if quant is WeightQuant.F16:
            assert np.array_equal(w, w.astype(np.float16).astype(np.float32))
        else:
            # Every 32-value block holds integer multiples of one scale: at most 255 (Q8_0) or
            # 16 (Q4_0) levels; the file's own Q4_K/Q5_0 values are not on such a grid.
            levels = 255 if quant is WeightQuant.Q8_0 else 16
            assert max(len(np.unique(b)) for b in blocks) <= levels
            scale = np.abs(blocks).max(axis=1, keepdims=True) / (127 if levels == 255 else 8)
            steps = np.divide(blocks, scale, out=np.zeros_like(blocks), where=scale > 0)
            assert np.allclose(steps, np.round(steps), atol=2e-3)
        ids = model.tokenizer.encode("The capital of France is")
        assert np.isfinite(model.backend.forward(ids, 0)).all()
    finally:
        model.close()


def test_the_cpu_backend_without_a_choice_keeps_the_files_types(cpu_model):
    info = cpu_model.describe()
    assert info["quant"] == "file"
    assert info["weight_types"] == info["tensor_types"]


@pytest.mark.vulkan
@pytest.mark.parametrize("quant", [*WeightQuant, None])
def test_the_vulkan_backend_uploads_the_chosen_type(model_path, quant):
    try:
        model = engine.load(model_path, backend="vulkan", quant=quant and quant.label, context_length=256)
    except engine.PhoenixError as exc:
        pytest.skip(f"no Vulkan device here: {exc}")
    try:
        info = model.describe()
        assert info["backend"] == "vulkan"
        if quant is None:
            assert info["quant"] == "file" and info["weight_types"] == info["tensor_types"]
        else:
            assert info["quant"] == quant.value and info["weight_types"] == _expected(quant)
    finally:
        model.close()
