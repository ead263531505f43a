"""The low-bit weight types of popular GGUF releases (Q2_K, Q3_K, Q4_1, Q5_1, IQ4_NL, IQ4_XS,
and the codebook types IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S) in the CPU reference: files holding them
open, every tensor dequantizes exactly as the `gguf` package does (the reference), and a model
made of them runs.

gguf-py quantizes only Q4_1 / Q5_1 of these, so the files hold random valid blocks (every bit
pattern of quants and sub-scales, finite f16 scales: tools/make_synthetic_gguf.random_blocks)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType
from gguf import quants

from phoenix_chat.engine.weights import open_weights
from tools.make_synthetic_gguf import write

NEW_TYPES = ("Q2_K", "Q3_K", "Q4_1", "Q5_1", "IQ4_NL", "IQ4_XS")
# (matrix type, embedding type, per-role types): the tiny shape's o-proj has 128 columns, so it
# takes a 32-weight type in every mix (256-weight types need whole super-blocks per row)
MIXES = {
    "k_and_iq": ("q3_k", "q4_1", {"attn_output": "iq4_nl", "ffn_gate": "q2_k", "ffn_up": "q2_k", "ffn_down": "iq4_xs"}),
    "legacy_1": ("q4_1", "q5_1", {"attn_output": "q5_1", "ffn_gate": "iq4_nl", "ffn_up": "iq4_nl"}),
}


# the codebook types (a lattice grid index per 4 or 8 weights), IQ4_NL where a row has 128 columns
CODEBOOK_TYPES = ("IQ3_XXS", "IQ3_S", "IQ2_XS", "IQ2_S")
MIXES["iq3"] = ("iq3_xxs", "q8_0", {"attn_output": "iq4_nl", "ffn_gate": "iq3_s", "ffn_up": "iq3_s"})
MIXES["iq2"] = ("iq2_xs", "q8_0", {"attn_output": "iq4_nl", "ffn_down": "iq2_s"})


@pytest.fixture(scope="module", params=sorted(MIXES))
def mixed_file(request, tmp_path_factory):
    wtype, etype, roles = MIXES[request.param]
    return write(tmp_path_factory.mktemp("types") / f"{request.param}.gguf", "tiny", wtype, etype, seed=3, roles=roles)


def test_every_new_type_is_read():
    """Both mixes together hold every new type (and the file lists them by name)."""
    held = set()
    for wtype, etype, roles in MIXES.values():
        held |= {wtype, etype, *roles.values()}
    assert {t.lower() for t in NEW_TYPES} <= held
    assert {t.lower() for t in CODEBOOK_TYPES} <= held


def test_tensors_dequantize_as_gguf_does(mixed_file):
    w = open_weights(mixed_file)
    try:
        types = w.tensor_types()
        assert set(types) - {"F32"} <= {*NEW_TYPES, *CODEBOOK_TYPES, "Q8_0"}, types
        for name, t in w.tensors.items():
            if t.qtype == QType.F32:
                continue
            got = w.dequantize(name)
            ref = quants.dequantize(np.asarray(w.raw(name)), t.qtype).reshape(t.shape)
            assert got.shape == t.shape and got.dtype == np.float32
            np.testing.assert_array_equal(got, ref, err_msg=name)
            assert np.isfinite(got).all() and np.abs(got).max() > 0, name
        rows = [0, 7, 4095]
        np.testing.assert_array_equal(w.dequantize_rows("embed_tokens", rows), w.dequantize("embed_tokens")[rows])
    finally:
        w.close()


def test_cpu_reference_runs_a_model_of_them(mixed_file):
    from phoenix_chat.engine.backends.cpu import CpuBackend

    w = open_weights(mixed_file)
    try:
        cpu = CpuBackend(w, 64)
        ids = [2, 17, 300, 4000, 12]
        logits = cpu.forward(ids, 0, all_logits=True)
        assert logits.shape == (len(ids), w.config.vocab_size) and np.isfinite(logits).all()
        assert logits.std() > 0
        # decoding the last token after the prefix gives the prefill's last row
        cpu2 = CpuBackend(w, 64)
        cpu2.forward(ids[:-1], 0)
        np.testing.assert_allclose(cpu2.forward(ids[-1:], len(ids) - 1), logits[-1], rtol=1e-4, atol=1e-4)
    finally:
        w.close()
