"""Hugging Face folders: a 2-layer BF16 checkpoint made from the real model reads back exactly
and runs like the GGUF it came from."""

import dataclasses
import json
import struct

import numpy as np
import pytest

from phoenix_chat.engine.backends.cpu import CpuBackend
from phoenix_chat.engine.weights import open_weights

LAYERS = 2


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


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, gguf):
    folder = tmp_path_factory.mktemp("hf-gemma3-2layer")
    c = gguf.config
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": c.hidden_size,
            "num_hidden_layers": LAYERS,
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
        n for n in gguf.tensors if n.startswith(tuple(f"layers.{i}." for i in range(LAYERS)))
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
    return folder


def test_reads_back_bf16_exactly(hf_folder, gguf):
    hf = open_weights(hf_folder)
    assert hf.config.num_layers == LAYERS and hf.config.hidden_size == gguf.config.hidden_size
    assert "vision_tower.vision_model.embeddings.patch_embedding" not in hf.tensors
    for name in ("layers.1.self_attn.q_proj", "layers.0.mlp.down_proj"):
        assert hf.tensors[name].qtype.name == "BF16"
        assert np.array_equal(hf.dequantize(name), bf16_round(gguf.dequantize(name)))
    assert np.allclose(
        hf.dequantize("layers.0.input_layernorm"), gguf.dequantize("layers.0.input_layernorm"), atol=1e-5
    )
    assert np.array_equal(
        hf.dequantize_rows("embed_tokens", [5, 7]), bf16_round(gguf.dequantize_rows("embed_tokens", [5, 7]))
    )


def test_safetensors_library_agrees_with_our_reader(hf_folder):
    from safetensors import safe_open

    hf = open_weights(hf_folder)
    shard = sorted(hf_folder.glob("*.safetensors"))[1]
    with safe_open(str(shard), framework="numpy") as f:
        for key in f.keys():
            if key.endswith("norm.weight"):
                name = key.removeprefix("language_model.model.").removesuffix(".weight")
                assert np.allclose(f.get_tensor(key) + 1.0, hf.dequantize(name))


class _Truncated:
    """The GGUF model cut to LAYERS layers, weights rounded through bf16: what the HF folder holds."""

    def __init__(self, gguf):
        self._g = gguf
        self.config = dataclasses.replace(gguf.config, num_layers=LAYERS)
        self.tensors = {
            n: t for n, t in gguf.tensors.items() if not n.startswith("layers.") or int(n.split(".")[1]) < LAYERS
        }

    def dequantize(self, name):
        data = self._g.dequantize(name)
        return data if self._g.tensors[name].is_norm else bf16_round(data)


def test_forward_matches_the_source_model(hf_folder, gguf):
    ids = [2, 818, 5279, 529, 7001, 563]
    from_hf = CpuBackend(open_weights(hf_folder), 64).forward(ids, 0, all_logits=True)
    from_gguf = CpuBackend(_Truncated(gguf), 64).forward(ids, 0, all_logits=True)
    assert np.max(np.abs(from_hf - from_gguf)) < 2e-3
    assert (from_hf.argmax(-1) == from_gguf.argmax(-1)).all()
