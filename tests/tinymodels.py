"""Small Gemma-3-shaped model files written with the `gguf` package's own writer.

Used where the real 270M file cannot show a case: tiny sliding windows (ring-buffer wrap in a
few tokens), unsupported types, missing tensors. Random weights, real layout. And
`truncated_gguf`: a real model cut to its first layers (same tokenizer, real weights), a draft
that disagrees with its full model often enough to exercise speculative decoding's rejections.
"""

from __future__ import annotations

import json
import struct

import numpy as np
from gguf import GGMLQuantizationType as QType
from gguf import GGUFWriter, quants

TINY = dict(hidden=64, heads=2, kv_heads=1, head_dim=32, ffn=96, vocab=300, layers=7, window=4, ctx=64)


def tiny_gguf(path, *, arch="gemma3", omit=(), types=None, cfg=None, seed=0, shapes=None):
    """`shapes` overrides a tensor's shape (a mislabelled or badly converted file)."""
    c = dict(TINY, **(cfg or {}))
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch)
    w.add_context_length(c["ctx"])
    w.add_embedding_length(c["hidden"])
    w.add_block_count(c["layers"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0)
    w.add_sliding_window(c["window"])
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(c["vocab"])])
    types = types or {}

    def tensor(name, shape, scale=0.2, norm=False):
        if name in omit:
            return
        shape = (shapes or {}).get(name, shape)
        data = (1.0 + rng.normal(0, 0.1, shape) if norm else rng.normal(0, scale, shape)).astype(np.float32)
        qtype = types.get(name, QType.F32)
        if qtype == QType.F32:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, quants.quantize(data, qtype), raw_dtype=qtype)

    h, d, q, kv, f = c["hidden"], c["head_dim"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["ffn"]
    tensor("token_embd.weight", (c["vocab"], h), 1.0)
    tensor("output_norm.weight", (h,), norm=True)
    for i in range(c["layers"]):
        b = f"blk.{i}."
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            tensor(b + n + ".weight", (h,), norm=True)
        tensor(b + "attn_q_norm.weight", (d,), norm=True)
        tensor(b + "attn_k_norm.weight", (d,), norm=True)
        tensor(b + "attn_q.weight", (q, h))
        tensor(b + "attn_k.weight", (kv, h))
        tensor(b + "attn_v.weight", (kv, h))
        tensor(b + "attn_output.weight", (h, q))
        tensor(b + "ffn_gate.weight", (f, h))
        tensor(b + "ffn_up.weight", (f, h))
        tensor(b + "ffn_down.weight", (h, f))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sparse_gguf(path, *, hidden=8192, ffn=32768, layers=48, vocab=262144):
    """A Gemma-3-shaped GGUF header whose F16 tensors (tens of GB) live in a sparse file.

    The header is real and complete; the data is a hole the filesystem never stores, so tests can
    check size limits (memory budget) on a 'huge' model without writing gigabytes.
    """
    w = GGUFWriter(str(path), "gemma3")
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(32)
    w.add_head_count_kv(16)
    w.add_key_length(128)
    w.add_value_length(128)
    w.add_sliding_window(1024)
    w.add_tokenizer_model("llama")
    q, kv = 32 * 128, 16 * 128
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    for i in range(layers):
        b = f"blk.{i}."
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            shapes[b + n + ".weight"] = (hidden,)
        shapes[b + "attn_q_norm.weight"] = shapes[b + "attn_k_norm.weight"] = (128,)
        shapes.update(
            {
                b + "attn_q.weight": (q, hidden),
                b + "attn_k.weight": (kv, hidden),
                b + "attn_v.weight": (kv, hidden),
                b + "attn_output.weight": (hidden, q),
                b + "ffn_gate.weight": (ffn, hidden),
                b + "ffn_up.weight": (ffn, hidden),
                b + "ffn_down.weight": (hidden, ffn),
            }
        )
    total = 0
    for name, shape in shapes.items():
        dtype = np.float32 if len(shape) == 1 else np.float16
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        w.add_tensor_info(name, shape, np.dtype(dtype), nbytes)
        total += nbytes + (-nbytes % 32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size + (-size % 32) + total)
    return path


def truncated_gguf(src, dst, layers: int):
    """Copy the GGUF at `src` keeping only blocks 0..layers-1 (metadata, tokenizer, embedding
    and output norm unchanged but for the block count)."""
    from gguf import GGUFReader, GGUFValueType, Keys

    reader = GGUFReader(str(src))
    arch = reader.fields[Keys.General.ARCHITECTURE].contents()
    block_count = Keys.LLM.BLOCK_COUNT.format(arch=arch)
    w = GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == block_count:
            w.add_key_value(field.name, layers, GGUFValueType.UINT32)
            continue
        kind = field.types[0]
        w.add_key_value(
            field.name, field.contents(), kind, sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None
        )
    kept = [t for t in reader.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < layers]
    for t in kept:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in kept:
        w.write_tensor_data(t.data)
    w.close()
    return dst


def bf16_bytes(a: np.ndarray) -> bytes:
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    return rounded.tobytes()


def bf16_round(a: np.ndarray) -> np.ndarray:
    return (np.frombuffer(bf16_bytes(a), np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(a.shape)


def write_safetensors(path, tensors: dict[str, tuple[str, tuple, bytes]]):
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for b in blobs:
            fh.write(b)


def hf_gemma3_folder(gguf, folder, layers: int, tokenizer: bool = False):
    """The real model's first `layers` blocks as a Hugging Face checkpoint: BF16 matrices in two
    safetensors shards (with a vision tensor to skip), config.json, and with `tokenizer` the
    tokenizer files, so the folder also loads in the app."""
    folder.mkdir(parents=True, exist_ok=True)
    c = gguf.config
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": c.hidden_size,
            "num_hidden_layers": layers,
            "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim,
            "vocab_size": c.vocab_size,
            "max_position_embeddings": c.context_length,
            "sliding_window": c.sliding_window,
            "rope_theta": c.rope_theta,
            "rope_local_base_freq": 10000.0,
            "query_pre_attn_scalar": 256,
            "rms_norm_eps": 1e-6,
        },
        "eos_token_id": [1, 106],
        "bos_token_id": 2,
    }
    (folder / "config.json").write_text(json.dumps(config))
    shards = [{}, {"vision_tower.vision_model.embeddings.patch_embedding.weight": ("F32", (2, 2), bytes(16))}]
    names = ["embed_tokens", "norm"] + [
        n for n in gguf.tensors if n.startswith(tuple(f"layers.{i}." for i in range(layers)))
    ]
    for i, name in enumerate(names):
        data = gguf.dequantize(name)
        hf_name = f"language_model.model.{name}.weight"
        if gguf.tensors[name].is_norm:  # HF stores w, Gemma multiplies by 1 + w
            shards[i % 2][hf_name] = ("F32", data.shape, (data - 1.0).astype(np.float32).tobytes())
        else:
            shards[i % 2][hf_name] = ("BF16", data.shape, bf16_bytes(data))
    weight_map = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-00002.safetensors"
        write_safetensors(folder / fname, shard)
        weight_map.update({n: fname for n in shard})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if tokenizer:
        (folder / "tokenizer.json").write_text(gguf.tokenizer().hf.to_str())
        (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    return folder
