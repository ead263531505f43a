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
    assert WeightQuant.parse("Q4_1") is WeightQuant.Q4_1 and WeightQuant.parse("q5_1") is WeightQuant.Q5_1
    with pytest.raises(PhoenixError, match="unknown quantization 'q3_k'.*q4_0, q4_1, q5_1, q8_0, f16"):
        WeightQuant.parse("q3_k")


def test_a_bad_choice_fails_before_any_backend_is_tried(model_path):
    # `auto` used to meet a ValueError from the Vulkan options and not fall back.
    with pytest.raises(PhoenixError, match="unknown quantization"):
        engine.load(model_path, backend="auto", quant="Q3_K")


def _expected(quant: WeightQuant) -> dict[str, int]:
    if quant in (WeightQuant.Q4_0, WeightQuant.Q4_1, WeightQuant.Q5_1):
        # the tied embedding keeps 8 bits, as llama.cpp keeps it for this model (rows of 640)
        return {"Q8_0": 1, quant.label: MATRICES - 1, "F32": NORMS}
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
        elif quant in (WeightQuant.Q4_1, WeightQuant.Q5_1):
            # m + d * q, q = 0 at the block's min and 15 (31) at its max: at most 16 (32) levels,
            # evenly spaced between them
            levels = 16 if quant is WeightQuant.Q4_1 else 32
            assert max(len(np.unique(b)) for b in blocks) <= levels
            lo, hi = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
            step = (hi - lo) / (levels - 1)
            steps = np.divide(blocks - lo, step, out=np.zeros_like(blocks), where=step > 0)
            assert np.allclose(steps, np.round(steps), atol=2e-3)
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


@pytest.mark.parametrize("backend", ["cpu", pytest.param("vulkan", marks=pytest.mark.vulkan)])
def test_the_cli_quant_flag_reaches_the_engine(model_path, monkeypatch, capsys, backend):
    """`phoenix-chat run --quant q4_1`: the engine the command loads holds Q4_1 matrices (on
    Vulkan re-quantized by the device), and the command answers."""
    from phoenix_chat.app import cli

    seen: list[dict] = []
    load = engine.load

    def recording_load(*args, **kwargs):
        model = load(*args, **kwargs)
        seen.append(model.describe())
        return model

    monkeypatch.setattr(engine, "load", recording_load)
    argv = ["run", "The capital of France is", "--raw", "--model", str(model_path), "--backend", backend]
    rc = cli.main([*argv, "--quant", "q4_1", "--ctx", "256", "--temperature", "0", "--max-tokens", "2"])
    out = capsys.readouterr()
    if rc == 2 and backend == "vulkan" and not seen:  # a PhoenixError is one line and exit 2
        pytest.skip(f"no Vulkan device here: {out.err.strip()}")
    assert rc == 0, out.err
    assert len(seen) == 1
    assert seen[0]["backend"] == backend and seen[0]["quant"] == "q4_1"
    assert seen[0]["weight_types"] == _expected(WeightQuant.Q4_1)
    assert out.out.strip()
