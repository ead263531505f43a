"""Fit advice (engine/fit.py): before loading, one line with the memory the model needs at the
chosen context, what the machine has, and the best weight type that would fit — in `info`, in
the loader's progress and model description, and in the out-of-memory error."""

from __future__ import annotations

import json
from collections import namedtuple

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES

from phoenix_chat.engine.errors import OutOfMemoryError
from phoenix_chat.engine.fit import CANDIDATES, GIB, USABLE, fit_advice, kv_cache_bytes, weight_bytes
from phoenix_chat.engine.weights import open_weights
from tests.test_cli import cli
from tests.tinymodels import sparse_gguf


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 40B-parameter F16 Gemma 3 header (data a sparse hole): ~80 GB as stored."""
    w = open_weights(sparse_gguf(tmp_path_factory.mktemp("fit") / "big.gguf"))
    yield w
    w.close()


def test_weight_bytes_at_a_type_count_blocks(big):
    f16 = weight_bytes(big)
    assert f16 == sum(t.nbytes for t in big.tensors.values())
    q2 = weight_bytes(big, CANDIDATES[-1])
    block, size = GGML_QUANT_SIZES[CANDIDATES[-1]]
    mats = sum(int(np.prod(t.shape)) for t in big.tensors.values() if not t.is_norm)
    norms = sum(t.nbytes for t in big.tensors.values() if t.is_norm)
    assert q2 == mats // block * size + norms  # every row of this shape is whole 256-blocks


def test_suggests_the_best_type_that_fits(big):
    """20 GiB free: F16 does not fit; the advice names the first candidate (best quality first)
    that fits, and the one before it would not."""
    ctx = 8192
    adv = fit_advice(big, ctx, available=20 * GIB, total=32 * GIB)
    assert not adv.fits and adv.suggestion is not None
    extra = kv_cache_bytes(big, ctx) + adv.working
    i = CANDIDATES.index(adv.suggestion)
    assert weight_bytes(big, adv.suggestion) + extra <= 20 * GIB * USABLE
    assert i == 0 or weight_bytes(big, CANDIDATES[i - 1]) + extra > 20 * GIB * USABLE
    line = adv.line()
    assert "\n" not in line and "8192 tokens" in line and "20.0 GiB free of 32.0" in line
    assert f"at {adv.suggestion.name}" in line and "does not fit" in line


def test_kv_cache_grows_with_context_and_can_decide(big):
    small, large = fit_advice(big, 1024, 10**15, 10**15), fit_advice(big, 8192, 10**15, 10**15)
    assert large.kv_cache > small.kv_cache > 0 and small.fits and large.line().endswith("it fits.")
    hopeless = fit_advice(big, 8192, available=GIB, total=2 * GIB)
    assert hopeless.suggestion is None and "does not fit at any weight type" in hopeless.line()


def test_info_prints_the_line_and_json():
    text = cli("info", "--ctx", "2048")
    assert text.returncode == 0, text.stderr
    mem = [ln for ln in text.stdout.splitlines() if ln.startswith("memory:")]
    assert len(mem) == 1 and "2048 tokens" in mem[0] and "GiB free of" in mem[0]
    data = json.loads(cli("info", "--json", "--ctx", "1024").stdout)["fit"]
    assert data["context_length"] == 1024 and data["fits"] is True and data["suggestion"] is None
    assert "1024 tokens" in data["line"] and data["line"].endswith("it fits.")
    assert 0 < data["kv_cache_bytes"] < data["need_bytes"] < data["available_bytes"]


def test_loader_reports_the_line_and_keeps_it(model_path):
    from phoenix_chat.engine import loader

    messages: list[str] = []
    m = loader.load(model_path, backend="cpu", context_length=512, progress=lambda f, msg: messages.append(msg))
    try:
        fit = m.describe()["fit"]
        assert "512 tokens" in fit and fit in messages
        assert messages.index(fit) < messages.index("loading weights")  # before any weight is loaded
    finally:
        m.close()


def test_out_of_memory_names_the_type_that_would_fit(model_path, monkeypatch):
    """The CPU reference refuses (f32 weights) on a machine the 270M fits at the smallest type: the error
    says so, in one line, instead of failing mid-load."""
    import psutil

    from phoenix_chat.engine import loader

    w = open_weights(model_path)
    probe = fit_advice(w, 512, available=10**15, total=10**15)
    at_q2 = weight_bytes(w, CANDIDATES[-1]) + probe.kv_cache + probe.working
    w.close()
    assert at_q2 < probe.need
    avail = int((at_q2 + probe.need) / 2 / USABLE)  # fits at the smallest type, not as stored
    VM = namedtuple("VM", "total available")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: VM(2 * avail, avail))
    with pytest.raises(OutOfMemoryError, match=r"CPU backend needs .* weights it would fit the machine") as exc:
        loader.load(model_path, backend="cpu", context_length=512)
    assert "\n" not in str(exc.value) and " at Q" in str(exc.value)


@pytest.mark.parametrize(
    ("what", "kw"),
    [("context length", {"context_length": 0}), ("context length", {"context_length": -5}), ("slots", {"slots": 0})],
)
def test_load_refuses_a_zero_or_negative_size_before_opening_anything(what, kw):
    from phoenix_chat.engine import load
    from phoenix_chat.engine.errors import PhoenixError

    with pytest.raises(PhoenixError, match=what):  # a negative context length crashed in numpy before
        load("/nonexistent/model.gguf", backend="cpu", **kw)
