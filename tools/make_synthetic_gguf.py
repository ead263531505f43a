#!/usr/bin/env python3
"""Write a Gemma-3-shaped GGUF with random weights, for speed measurements only.

The layout (tensor names, shapes, quant types, metadata) is that of a real Gemma 3 file, so
every engine loads it like the real model; the values are random blocks with sane scales.
Real 4B/27B weights cannot be downloaded here; their shapes are all a bandwidth benchmark needs.

    python -m tools.make_synthetic_gguf --shape 27b --type q4_0 -o /tmp/g27.gguf
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter, RopeScalingType, TokenType
from gguf import GGMLQuantizationType as QType

# layers, hidden, heads, kv heads, head_dim, intermediate, vocab, window, rope scaling, query_pre_attn_scalar
SHAPES = {
    "tiny": (6, 256, 2, 1, 64, 512, 4096, 32, 1.0, 64),
    "270m": (18, 640, 4, 1, 256, 2048, 262144, 512, 1.0, 256),
    "1b": (26, 1152, 4, 1, 256, 6912, 262144, 512, 1.0, 256),
    "4b": (34, 2560, 8, 4, 256, 10240, 262208, 1024, 8.0, 256),
    "12b": (48, 3840, 16, 8, 256, 15360, 262208, 1024, 8.0, 256),
    "27b": (62, 5376, 32, 16, 128, 21504, 262208, 1024, 8.0, 168),
}
QUANT_TYPES = (
    QType.Q8_0,
    QType.Q4_0,
    QType.Q4_1,
    QType.Q5_0,
    QType.Q5_1,
    QType.IQ4_NL,
    QType.IQ4_XS,
    QType.Q2_K,
    QType.Q3_K,
    QType.Q4_K,
    QType.Q5_K,
    QType.Q6_K,
    QType.IQ3_XXS,
    QType.IQ3_S,
    QType.IQ2_XS,
    QType.IQ2_S,
)
# a 256-block type on a row that 256 does not divide (the 270M's 640, the 1B's 1152) falls back
# as llama.cpp's quantizer does, so the file has the types a real one of that shape would have
FALLBACK = {
    QType.Q2_K: QType.IQ4_NL,
    QType.Q3_K: QType.IQ4_NL,
    QType.IQ4_XS: QType.IQ4_NL,
    QType.Q4_K: QType.Q5_0,
    QType.Q5_K: QType.Q5_1,
    QType.Q6_K: QType.Q8_0,
    QType.IQ3_XXS: QType.IQ4_NL,
    QType.IQ3_S: QType.IQ4_NL,
    QType.IQ2_XS: QType.IQ4_NL,
    QType.IQ2_S: QType.IQ4_NL,
}
TYPES = {"f16": QType.F16, **{t.name.lower(): t for t in QUANT_TYPES}}
_POOL_BLOCKS = 1 << 20

# byte offsets of each block's f16 scale fields (ggml-common.h): random bytes there could be
# inf / NaN, so random blocks get modest positive scales in them and random bits elsewhere
F16_FIELDS = {
    QType.Q8_0: (0,),
    QType.Q4_0: (0,),
    QType.Q4_1: (0, 2),  # d, m
    QType.Q5_0: (0,),
    QType.Q5_1: (0, 2),
    QType.IQ4_NL: (0,),
    QType.IQ4_XS: (0,),
    QType.Q2_K: (80, 82),  # scales[16], qs[64], d, dmin
    QType.Q3_K: (108,),  # hmask[32], qs[64], scales[12], d
    QType.Q4_K: (0, 2),
    QType.Q5_K: (0, 2),
    QType.Q6_K: (208,),
    QType.IQ3_XXS: (0,),  # d, then grid indexes and sign/scale words: every index is in range
    QType.IQ3_S: (0,),
    QType.IQ2_XS: (0,),
    QType.IQ2_S: (0,),
}


def random_blocks(qtype: QType, n_blocks: int, rng, lo: float = 0.002, hi: float = 0.02) -> np.ndarray:
    """n_blocks random valid blocks of a quantized type, uint8 [n_blocks, block bytes]: every
    bit pattern of the quants and sub-scales, f16 scales drawn from [lo, hi]."""
    _block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off : off + 2] = rng.uniform(lo, hi, n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw


def _pool(qtype: QType, rng, n_blocks: int = _POOL_BLOCKS) -> np.ndarray:
    """Random valid blocks (finite f16 scales) to tile tensors from."""
    if qtype == QType.F16:
        return (rng.standard_normal(n_blocks * 32) * 0.02).astype(np.float16).view(np.uint8)
    return random_blocks(qtype, n_blocks, rng, 0.001, 0.01).reshape(-1)


def tensors(shape: str, wtype: QType, etype: QType, roles: Mapping[str, QType] | None = None):
    """(gguf name, (rows, cols), type) in file order; `roles` gives some matrices (attn_q,
    ffn_down, ...) a type of their own, as llama.cpp's mixed recipes (Q3_K_M, ...) do."""
    L, H, nh, nkv, hd, inter, vocab, *_ = SHAPES[shape]
    roles = roles or {}
    out = [("token_embd.weight", (vocab, H), etype), ("output_norm.weight", (H,), QType.F32)]
    for i in range(L):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (H,), QType.F32),
            (b + "attn_q.weight", (nh * hd, H), roles.get("attn_q", wtype)),
            (b + "attn_k.weight", (nkv * hd, H), roles.get("attn_k", wtype)),
            (b + "attn_v.weight", (nkv * hd, H), roles.get("attn_v", wtype)),
            (b + "attn_q_norm.weight", (hd,), QType.F32),
            (b + "attn_k_norm.weight", (hd,), QType.F32),
            (b + "attn_output.weight", (H, nh * hd), roles.get("attn_output", wtype)),
            (b + "post_attention_norm.weight", (H,), QType.F32),
            (b + "ffn_norm.weight", (H,), QType.F32),
            (b + "ffn_gate.weight", (inter, H), roles.get("ffn_gate", wtype)),
            (b + "ffn_up.weight", (inter, H), roles.get("ffn_up", wtype)),
            (b + "ffn_down.weight", (H, inter), roles.get("ffn_down", wtype)),
            (b + "post_ffw_norm.weight", (H,), QType.F32),
        ]
    return [(name, shp, _fitting(name, shp, t)) for name, shp, t in out]


def _fitting(name: str, shp: tuple[int, ...], t: QType) -> QType:
    """`t`, or llama.cpp's fallback for it when its block does not divide the row."""
    if t == QType.F32 or shp[-1] % GGML_QUANT_SIZES[t][0] == 0:
        return t
    fb = FALLBACK.get(t)
    if fb is None or shp[-1] % GGML_QUANT_SIZES[fb][0]:
        raise ValueError(f"{name}: a row of {shp[-1]} does not fit {t.name} blocks and has no fallback")
    return fb


def write(
    path,
    shape: str = "270m",
    wtype: str = "q4_0",
    etype: str = "q8_0",
    seed: int = 0,
    context_length: int = 32768,
    roles: Mapping[str, str] | None = None,
    vocab_from: str | Path | None = None,
) -> Path:
    """roles: {"attn_output": "iq4_nl", ...} matrices of another type than `wtype`.
    vocab_from: a Gemma 3 GGUF whose tokenizer the file gets (fitted to this shape's vocabulary
    by `vocabulary`) and a chat template: what llama.cpp's tools that tokenize text (llama-mtmd-cli)
    need; without it the file has ids only (tokenizer model "none")."""
    L, H, nh, nkv, hd, inter, vocab, window, rope_scale, qpas = SHAPES[shape]
    wt, et = TYPES[wtype], TYPES[etype]
    rng = np.random.default_rng(seed)
    plan = tensors(shape, wt, et, {r: TYPES[t] for r, t in (roles or {}).items()})
    blocks: dict[QType, int] = {}  # the largest tensor of each type, in blocks: pool no bigger than that
    for _n, shp, t in plan:
        if t != QType.F32:
            blocks[t] = max(blocks.get(t, 0), int(np.prod(shp)) // GGML_QUANT_SIZES[t][0])
    pools = {t: _pool(t, rng, min(n, _POOL_BLOCKS)) for t, n in blocks.items()}
    w = GGUFWriter(str(path), "gemma3")
    w.add_name(f"synthetic Gemma 3 {shape} {wtype}")
    w.add_context_length(context_length)
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(inter)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_sliding_window(window)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)
    w.add_uint32("gemma3.attention.query_pre_attn_scalar", qpas)
    if rope_scale != 1.0:
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope_scale)
    if vocab_from is None:
        w.add_tokenizer_model("none")  # ids only: llama.cpp loads it without a vocabulary (bench side by side)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
    else:
        add_vocabulary(w, vocab_from, vocab)
    for name, shp, t in plan:
        if t == QType.F32:
            w.add_tensor_info(name, shp, np.dtype(np.float32), int(np.prod(shp)) * 4)
        else:
            block, size = GGML_QUANT_SIZES[t]
            rows, cols = shp
            nbytes = rows * cols // block * size
            w.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8), nbytes, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _name, shp, t in plan:
        if t == QType.F32:
            data = (1.0 + 0.1 * rng.standard_normal(shp)).astype(np.float32)
        else:
            block, size = GGML_QUANT_SIZES[t]
            data = np.resize(pools[t], shp[0] * shp[1] // block * size)
        w.write_tensor_data(data)
    w.close()
    return Path(path)


IMAGE_SOFT_TOKEN = 262144  # Gemma 3 4B/12B/27B: <image_soft_token>, the first id past the 262144 text tokens
# Gemma 3's turns, without the BOS (llama.cpp's tools add it): tokenizer.chat_template
CHAT_TEMPLATE = (
    "{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def vocabulary(source: str | Path, size: int) -> tuple[list[str], np.ndarray, np.ndarray, dict]:
    """(tokens, scores, token types, other tokenizer.ggml.* keys) of a Gemma 3 GGUF's tokenizer (a
    model, or a file holding only its tokenizer.ggml.* keys) fitted to `size` entries: cut (a tiny
    shape keeps the first ids: the specials and byte tokens) or padded as the 4B's 262208 are
    (<image_soft_token> at 262144, unused entries after it)."""
    from gguf import GGUFReader

    # gguf-py's reader, not the engine's: it also opens a vocabulary-only file (no model config),
    # which is how the tokenizer travels to a GPU machine the 240 MB embedded model cannot reach
    reader = GGUFReader(str(source))
    meta = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.ggml.")}
    tokens = list(meta.pop("tokenizer.ggml.tokens"))[:size]
    scores = np.asarray(meta.pop("tokenizer.ggml.scores"), np.float32)[:size]
    types = np.asarray(meta.pop("tokenizer.ggml.token_type"), np.int32)[:size]
    extra = size - len(tokens)
    if extra > 0:
        pad = [f"<unused_pad_{i}>" for i in range(len(tokens), size)]
        if len(tokens) <= IMAGE_SOFT_TOKEN < size:
            pad[IMAGE_SOFT_TOKEN - len(tokens)] = "<image_soft_token>"
        tokens += pad
        scores = np.concatenate([scores, np.zeros(extra, np.float32)])
        pad_types = np.full(extra, int(TokenType.UNUSED), np.int32)
        if len(types) <= IMAGE_SOFT_TOKEN < size:
            pad_types[IMAGE_SOFT_TOKEN - len(types)] = int(TokenType.USER_DEFINED)
        types = np.concatenate([types, pad_types])
    rest = {k: v for k, v in meta.items() if k.startswith("tokenizer.ggml.")}
    return tokens, scores, types, rest


def add_vocabulary(w: GGUFWriter, source: str | Path, size: int) -> None:
    tokens, scores, types, rest = vocabulary(source, size)
    w.add_tokenizer_model(str(rest.pop("tokenizer.ggml.model")))
    if "tokenizer.ggml.pre" in rest:
        w.add_tokenizer_pre(str(rest.pop("tokenizer.ggml.pre")))
    w.add_token_list(tokens)
    w.add_token_scores([float(x) for x in scores])
    w.add_token_types([int(x) for x in types])
    for key, value in rest.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int) and value < size:
            w.add_uint32(key, value)
    w.add_chat_template(CHAT_TEMPLATE)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="270m")
    ap.add_argument("--type", choices=sorted(TYPES), default="q4_0", help="matrix weights")
    ap.add_argument("--embed-type", choices=sorted(TYPES), default="q8_0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-from", help="a Gemma 3 GGUF whose tokenizer to copy (llama-mtmd-cli needs one)")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    p = write(args.output, args.shape, args.type, args.embed_type, args.seed, vocab_from=args.vocab_from)
    print(f"{p}: {p.stat().st_size / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
