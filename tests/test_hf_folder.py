"""Hugging Face folders: a 2-layer BF16 checkpoint made from the real model reads back exactly
and runs like the GGUF it came from."""

import dataclasses
import json

import numpy as np
import pytest

from phoenix_chat.engine.backends.cpu import CpuBackend
from phoenix_chat.engine.errors import ModelFileError
from phoenix_chat.engine.weights import open_weights

from .tinymodels import bf16_round, hf_gemma3_folder

LAYERS = 2


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, gguf):
    return hf_gemma3_folder(gguf, tmp_path_factory.mktemp("hf-gemma3-2layer"), LAYERS)


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


def test_released_pages_read_back_the_same(hf_folder):
    """release_pages (after a Vulkan upload) per tensor and for every shard: reads fault back in."""
    hf = open_weights(hf_folder)
    try:
        names = ("layers.1.self_attn.q_proj", "embed_tokens")
        before = {n: hf.raw(n).copy() for n in names}
        hf.release_pages(names[0])
        hf.release_pages()
        for n in names:
            assert np.array_equal(hf.raw(n), before[n]), n
    finally:
        hf.close()


def test_a_config_that_disagrees_with_the_tensors_is_refused(hf_folder, tmp_path):
    """The same shards under a config.json with another FFN width: refused at open, naming a tensor."""
    for f in hf_folder.iterdir():
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "config.json").unlink()
    config = json.loads((hf_folder / "config.json").read_text())
    config["text_config"]["intermediate_size"] += 256
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match=r"do not match the model's configuration.*mlp"):
        open_weights(tmp_path)
