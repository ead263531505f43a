"""tools/make_synthetic_mmproj.py: a random-weight Gemma 3 mmproj laid out as llama.cpp's converter
writes one (the committed converter output is the reference), read by our mmproj reader at the
requested shape and loaded and run by llama.cpp's own libmtmd (the peer build, CPU here) beside a
synthetic text GGUF of the same width that carries a tokenizer (make_synthetic_gguf's vocab_from)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from phoenix_chat.engine.vision_config import VisionConfig
from phoenix_chat.engine.weights.mmproj import MmprojFile, required
from tools import make_synthetic_mmproj as mk

GOLDEN = Path(__file__).parent / "goldens" / "mmproj-tiny-gemma3-vision-f16.gguf"
# the shape of the committed converter output (tools/tiny_vision_model.py)
GOLDEN_CFG = VisionConfig(
    image_size=112,
    patch_size=14,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=2,
    mm_tokens_per_image=16,
    text_hidden_size=64,
)
IDS = (262144, 255999, 256000)
NAMING = {"general.name", "general.basename", "general.finetune", "general.size_label"}  # the model's own names


def _fields(path: Path) -> dict:
    r = GGUFReader(path)
    return {k: (f.types, f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.") and k not in NAMING}


def _tensors(path: Path) -> list:
    return [(t.name, t.tensor_type.name, [int(x) for x in t.shape]) for t in GGUFReader(path).tensors]


def test_layout_is_the_converters(tmp_path):
    """Same metadata keys, value types and values, same tensor names, order, types and dims as
    llama.cpp's converter wrote for the tiny model."""
    out = mk.write(tmp_path / "mmproj.gguf", GOLDEN_CFG)
    assert _fields(out) == _fields(GOLDEN)
    assert _tensors(out) == _tensors(GOLDEN)


@pytest.mark.parametrize("mtype", ["f16", "bf16", "q8_0"])
def test_reader_opens_it_at_the_requested_shape(tmp_path, mtype):
    """An MLP width 32 does not divide (so400m's 4304 does not either) and 16 x 16 patches pooled
    by clip.cpp's default 4 (no scale_factor key written, as for the real models)."""
    cfg = replace(GOLDEN_CFG, image_size=224, intermediate_size=72, mm_tokens_per_image=16, num_heads=4)
    out = mk.write(tmp_path / f"mmproj-{mtype}.gguf", cfg, mtype)
    assert "clip.vision.projector.scale_factor" not in GGUFReader(out).fields
    mm = MmprojFile(out)
    try:
        got = mm.settings(cfg.text_hidden_size, IDS)
        assert got.layer_norm_eps == pytest.approx(1e-6)  # stored as float32
        assert replace(got, layer_norm_eps=cfg.layer_norm_eps) == cfg
        types = mm.tensor_types()
        main = {"f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}[mtype]
        assert types[main] >= 4 * cfg.num_layers  # the attention matrices
        assert types["F32"] == 6 + 10 * cfg.num_layers  # norms, biases, patch/position embeddings
        x = mm.vision_tensor("vision_tower.vision_model.encoder.layers.1.self_attn.q_proj.weight")
        assert x.shape == (32, 32) and np.isfinite(x).all() and 0.005 < float(x.std()) < 0.05
        norm = mm.vision_tensor("multi_modal_projector.mm_soft_emb_norm.weight")  # stored 1 + w, read as w
        assert abs(float(norm.mean())) < 0.05
    finally:
        mm.close()


def test_real_4b_plan_is_what_the_reader_requires():
    """The default (Gemma 3 4B) plan, without writing its 850 MB: every tensor the reader requires,
    at its shape, and nothing else."""
    cfg = VisionConfig()
    plan = {name: shape for name, shape, _t in mk.plan(cfg)}
    assert plan == required(cfg)
    types = {name: t.name for name, _s, t in mk.plan(cfg)}
    assert types["v.blk.26.ffn_down.weight"] == "F16" and types["v.position_embd.weight"] == "F32"
    q8 = {name: t.name for name, _s, t in mk.plan(cfg, mk.TYPES["q8_0"])}
    assert q8["v.blk.0.ffn_up.weight"] == "Q8_0" and q8["v.blk.0.ffn_down.weight"] == "F16"  # 4304 % 32


def test_text_vocabulary_is_fitted_to_the_shape(model_path):
    """The 4B's 262208 ids: the 270M's 262144 tokens, <image_soft_token> at 262144, unused after."""
    from tools.make_synthetic_gguf import vocabulary

    tokens, scores, types, rest = vocabulary(model_path, 262208)
    assert len(tokens) == len(scores) == len(types) == 262208
    assert tokens[262144] == "<image_soft_token>" and tokens[255999] == "<start_of_image>"
    assert rest["tokenizer.ggml.model"] == "llama" and rest["tokenizer.ggml.bos_token_id"] == 2
    small = vocabulary(model_path, 4096)[0]
    assert small[:4096] == tokens[:4096]


def test_llama_cpp_mtmd_loads_and_encodes_it(tmp_path, model_path):
    """llama.cpp's libmtmd (peer build, CPU) loads the synthetic mmproj beside a synthetic text
    GGUF of the projector's width, encodes one picture into finite soft tokens of that width and
    prefills the prompt holding it."""
    from tools import llama_cpp_mtmd
    from tools.make_synthetic_gguf import write

    cfg = replace(GOLDEN_CFG, hidden_size=64, intermediate_size=120, text_hidden_size=256)  # "tiny" text width
    mmproj = mk.write(tmp_path / "mmproj.gguf", cfg)
    text = write(tmp_path / "text.gguf", "tiny", "q8_0", "q8_0", vocab_from=model_path)
    picture = np.random.default_rng(0).integers(0, 256, (cfg.image_size, cfg.image_size, 3), dtype=np.uint8)
    try:
        out = llama_cpp_mtmd.run(text, mmproj, [picture], "<__media__> what is this?", answer_tokens=1)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    (soft,) = out["soft"]
    assert soft.shape == (cfg.mm_tokens_per_image, cfg.text_hidden_size) and np.isfinite(soft).all()
    assert ("image", cfg.mm_tokens_per_image) in out["chunks"]
    assert np.isfinite(out["logits"]).all() and len(out["greedy"]) == 1
