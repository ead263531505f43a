#!/usr/bin/env python3
"""Write a Gemma 3 `mmproj` GGUF (SigLIP vision tower + projector, llama.cpp's split form) with
random weights, for speed measurements of llama.cpp's libmtmd only.

Metadata, tensor names, shapes and types are those llama.cpp's converter writes for Gemma 3
(convert_hf_to_gguf.py --mmproj, conversion/gemma.py `Gemma3VisionModel`, as in
tests/goldens/mmproj-tiny-gemma3-vision-f16.gguf): `general.architecture` clip, `general.type`
mmproj, `clip.projector_type` gemma3, `clip.vision.*` sizes, mean = std = 0.5, `clip.use_gelu`;
`clip.vision.projector.scale_factor` only where the patches do not pool by clip.cpp's default 4;
`v.*` tower and `mm.*` projector tensors. Types as the converter's `--outtype`: matrices F16 (or
BF16 / Q8_0 / F32), the input projection always F16, the patch and position embeddings F32,
norms and biases F32. The soft-embedding norm is stored as 1 + w (the converter adds the 1).

The default is the real Gemma 3 4B/12B/27B tower (SigLIP so400m: width 1152, 27 layers, 16
heads, MLP 4304, 896 px, patch 14: 256 soft tokens) projecting into the 4B's 2560:

    python -m tools.make_synthetic_mmproj -o /tmp/mmproj-4b-f16.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFType, GGUFWriter, LlamaFileType
from gguf import GGMLQuantizationType as QType

from phoenix_chat.engine.vision_config import VisionConfig
from tools.make_synthetic_gguf import random_blocks

DEFAULT_MERGE = 4  # clip.cpp's n_merge for Gemma 3 when the file does not say
TYPES = {"f16": QType.F16, "bf16": QType.BF16, "q8_0": QType.Q8_0, "f32": QType.F32}
FILE_TYPES = {
    QType.F16: LlamaFileType.MOSTLY_F16,
    QType.BF16: LlamaFileType.MOSTLY_BF16,
    QType.Q8_0: LlamaFileType.MOSTLY_Q8_0,
    QType.F32: LlamaFileType.ALL_F32,
}
_POOL = 1 << 23  # random values tiled into the matrices (8 Mi: any one so400m matrix is smaller)


def plan(cfg: VisionConfig, matrix_type: QType = QType.F16) -> list[tuple[str, tuple[int, ...], QType]]:
    """(name, numpy shape, type) in the converter's order (the Hugging Face checkpoint's: projector
    first, then the tower)."""
    W, ffn, p = cfg.hidden_size, cfg.intermediate_size, cfg.patch_size

    def matrix(shape: tuple[int, ...]) -> QType:
        # gguf-py cannot quantize a row its block does not divide: the converter keeps F16 then
        if matrix_type == QType.Q8_0 and shape[-1] % GGML_QUANT_SIZES[QType.Q8_0][0]:
            return QType.F16
        return matrix_type

    out: list[tuple[str, tuple[int, ...], QType]] = [
        ("mm.input_projection.weight", (W, cfg.text_hidden_size), QType.F16),  # tensor_force_quant
        ("mm.soft_emb_norm.weight", (W,), QType.F32),
        ("v.patch_embd.bias", (W,), QType.F32),
        ("v.patch_embd.weight", (W, 3, p, p), QType.F32),  # ".embeddings." -> F32
        ("v.position_embd.weight", (cfg.patches_per_side**2, W), QType.F32),
    ]
    for i in range(cfg.num_layers):
        b = f"v.blk.{i}."
        out += [
            (b + "ln1.bias", (W,), QType.F32),
            (b + "ln1.weight", (W,), QType.F32),
            (b + "ln2.bias", (W,), QType.F32),
            (b + "ln2.weight", (W,), QType.F32),
            (b + "ffn_up.bias", (ffn,), QType.F32),
            (b + "ffn_up.weight", (ffn, W), matrix((ffn, W))),
            (b + "ffn_down.bias", (W,), QType.F32),
            (b + "ffn_down.weight", (W, ffn), matrix((W, ffn))),
        ]
        for m in ("attn_k", "attn_out", "attn_q", "attn_v"):
            out += [(b + m + ".bias", (W,), QType.F32), (b + m + ".weight", (W, W), matrix((W, W)))]
    out += [("v.post_ln.bias", (W,), QType.F32), ("v.post_ln.weight", (W,), QType.F32)]
    return out


def _nbytes(shape: tuple[int, ...], t: QType) -> int:
    block, size = GGML_QUANT_SIZES[t]
    return int(np.prod(shape)) // block * size


def write(
    path: str | Path, cfg: VisionConfig | None = None, matrix_type: str = "f16", seed: int = 0, name: str = ""
) -> Path:
    """The mmproj of `cfg` (default: the real Gemma 3 4B tower and projector) at `path`."""
    cfg = cfg or VisionConfig()
    side, per_side = cfg.patches_per_side, cfg.tokens_per_side
    if per_side**2 != cfg.mm_tokens_per_image or side % per_side:
        raise ValueError(f"{cfg.mm_tokens_per_image} soft tokens do not pool from {side} x {side} patches")
    if cfg.hidden_size % cfg.num_heads:
        raise ValueError(f"width {cfg.hidden_size} does not split into {cfg.num_heads} heads")
    mt = TYPES[matrix_type]
    tensors = plan(cfg, mt)
    rng = np.random.default_rng(seed)
    pool = (0.02 * rng.standard_normal(_POOL)).astype(np.float32)

    w = GGUFWriter(str(path), "clip")
    w.add_type(GGUFType.MMPROJ)
    w.add_name(name or f"synthetic Gemma 3 vision {cfg.hidden_size}x{cfg.num_layers} {matrix_type}")
    w.add_file_type(int(FILE_TYPES[mt]))
    w.add_bool("clip.has_vision_encoder", True)
    w.add_uint32("clip.vision.projection_dim", cfg.text_hidden_size)
    w.add_uint32("clip.vision.image_size", cfg.image_size)
    w.add_uint32("clip.vision.patch_size", cfg.patch_size)
    w.add_uint32("clip.vision.embedding_length", cfg.hidden_size)
    w.add_uint32("clip.vision.feed_forward_length", cfg.intermediate_size)
    w.add_uint32("clip.vision.block_count", cfg.num_layers)
    w.add_uint32("clip.vision.attention.head_count", cfg.num_heads)
    w.add_array("clip.vision.image_mean", [float(x) for x in cfg.image_mean])
    w.add_array("clip.vision.image_std", [float(x) for x in cfg.image_std])
    w.add_string("clip.projector_type", "gemma3")
    w.add_float32("clip.vision.attention.layer_norm_epsilon", cfg.layer_norm_eps)
    w.add_bool("clip.use_gelu", True)
    merge = side // per_side
    if merge != DEFAULT_MERGE:  # the converter writes it only for test models
        w.add_uint32("clip.vision.projector.scale_factor", merge)
    w.add_quantization_version(2)
    for tname, shape, t in tensors:
        if t in (QType.F32, QType.F16):
            dtype = np.dtype(np.float32 if t == QType.F32 else np.float16)
            w.add_tensor_info(tname, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
        else:
            block, size = GGML_QUANT_SIZES[t]
            byte_shape = (*shape[:-1], shape[-1] // block * size)
            w.add_tensor_info(tname, byte_shape, np.dtype(np.uint8), _nbytes(shape, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for tname, shape, t in tensors:
        n = int(np.prod(shape))
        if len(shape) == 1:
            if tname.endswith(("ln1.weight", "ln2.weight", "post_ln.weight", "soft_emb_norm.weight")):
                data = (1.0 + 0.05 * rng.standard_normal(n)).astype(np.float32)  # LayerNorm / 1 + w
            else:
                data = (0.01 * rng.standard_normal(n)).astype(np.float32)
        else:
            start = int(rng.integers(0, _POOL - n + 1)) if n < _POOL else 0
            values = np.resize(pool[start:], n) if n > _POOL - start else pool[start : start + n]
            if t == QType.F32:
                data = values.astype(np.float32)
            elif t == QType.F16:
                data = values.astype(np.float16)
            elif t == QType.BF16:
                data = (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
            else:  # Q8_0: random valid blocks (finite f16 scales)
                data = random_blocks(t, n // GGML_QUANT_SIZES[t][0], rng, 0.0002, 0.001).reshape(-1)
        w.write_tensor_data(data.reshape(-1) if t not in (QType.F32, QType.F16) else data.reshape(shape))
    w.close()
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    real = VisionConfig()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", choices=sorted(TYPES), default="f16", help="the tower's matrices")
    ap.add_argument("--image-size", type=int, default=real.image_size)
    ap.add_argument("--patch-size", type=int, default=real.patch_size)
    ap.add_argument("--hidden", type=int, default=real.hidden_size)
    ap.add_argument("--ffn", type=int, default=real.intermediate_size)
    ap.add_argument("--layers", type=int, default=real.num_layers)
    ap.add_argument("--heads", type=int, default=real.num_heads)
    ap.add_argument("--tokens", type=int, default=real.mm_tokens_per_image, help="soft tokens per picture")
    ap.add_argument("--text-hidden", type=int, default=real.text_hidden_size, help="the text model's width")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    cfg = VisionConfig(
        image_size=args.image_size,
        patch_size=args.patch_size,
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_layers=args.layers,
        num_heads=args.heads,
        mm_tokens_per_image=args.tokens,
        text_hidden_size=args.text_hidden,
    )
    p = write(args.output, cfg, args.type, args.seed)
    print(f"{p}: {p.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
