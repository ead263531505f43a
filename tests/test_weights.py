"""The GGUF parser against the `gguf` package's reader, and every bad-input case."""

import json
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType

from phoenix_chat.engine.errors import ModelFileError, UnsupportedModelError
from phoenix_chat.engine.weights import open_weights
from phoenix_chat.engine.weights.gguf_file import GGUFFile, canonical_name
from tests.tinymodels import tiny_gguf


@pytest.fixture(scope="module")
def reference_reader(model_path):
    import gguf

    return gguf.GGUFReader(str(model_path))


def test_parser_matches_gguf_reader(gguf, reference_reader):
    ref = reference_reader
    assert len(gguf.tensors) == len(ref.tensors)
    for t in ref.tensors:
        ours = gguf.tensors[canonical_name(t.name)]
        assert ours.qtype == t.tensor_type
        assert ours.shape == tuple(int(x) for x in reversed(t.shape))
        assert ours.nbytes == t.n_bytes
        assert np.array_equal(gguf.raw(ours.name).reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))
    tokens = ref.fields["tokenizer.ggml.tokens"]
    assert gguf.metadata["tokenizer.ggml.tokens"][:50] == [bytes(tokens.parts[i]).decode() for i in tokens.data[:50]]
    assert len(gguf.metadata["tokenizer.ggml.tokens"]) == 262144
    scores = ref.fields["tokenizer.ggml.scores"]
    assert np.array_equal(
        gguf.metadata["tokenizer.ggml.scores"][:1000], np.array([scores.parts[i][0] for i in scores.data[:1000]])
    )


def test_config_of_embedded_model(gguf):
    c = gguf.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (18, 640, 4, 1, 256)
    assert (c.intermediate_size, c.vocab_size, c.sliding_window) == (2048, 262144, 512)
    assert c.eos_token_ids == (1, 106) and c.bos_token_id == 2
    assert [c.is_global_layer(i) for i in range(6)] == [False] * 5 + [True]
    assert 260e6 < c.parameter_count() < 280e6


def test_dequantize_uses_gguf_reference(gguf, reference_reader):
    from gguf import quants

    t = next(t for t in reference_reader.tensors if t.name == "blk.0.ffn_down.weight")
    assert np.array_equal(gguf.dequantize("layers.0.mlp.down_proj"), quants.dequantize(t.data, t.tensor_type))
    # one tensor of each type in the file (and the whole embedding table), dequantized with many
    # rows handed to gguf as one (gguf_file._merged_rows): the same values as row by row
    first_of_type = {}
    for name, info in gguf.tensors.items():
        first_of_type.setdefault(info.qtype, name)
    first_of_type["embed"] = "embed_tokens"
    for name in first_of_type.values():
        info = gguf.tensors[name]
        plain = quants.dequantize(gguf.raw(name), info.qtype).reshape(info.shape)
        assert np.array_equal(gguf.dequantize(name), plain), name
    rows = gguf.dequantize_rows("embed_tokens", [2, 105, 262143])
    emb = next(t for t in reference_reader.tensors if t.name == "token_embd.weight")
    assert np.array_equal(rows, quants.dequantize(np.asarray(emb.data)[[2, 105, 262143]], emb.tensor_type))


def test_opening_is_fast(model_path):
    import time

    start = time.perf_counter()
    GGUFFile(model_path)
    assert time.perf_counter() - start < 5.0  # gguf.GGUFReader takes 10-18 s on this file


# ---- bad input -------------------------------------------------------------------------


def _header(*parts) -> bytes:
    return b"".join(parts)


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="file not found"):
        open_weights(tmp_path / "nope.gguf")


def test_not_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelFileError, match="bad magic"):
        open_weights(bad)


def test_absurd_counts_fail_before_allocating(tmp_path):
    bad = tmp_path / "absurd.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**60, 1) + bytes(64))
    with pytest.raises(ModelFileError, match="absurd"):
        open_weights(bad)


def test_absurd_string_length(tmp_path):
    bad = tmp_path / "absurd_str.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**62) + b"general.architecture")
    with pytest.raises(ModelFileError, match="truncated or corrupt"):
        open_weights(bad)


def test_truncated_header(tmp_path, model_path):
    bad = tmp_path / "head.gguf"
    with open(model_path, "rb") as src:
        bad.write_bytes(src.read(1_000_000))  # cut inside the vocabulary
    with pytest.raises(ModelFileError, match="truncated or corrupt GGUF header"):
        open_weights(bad)


def test_truncated_tensor_data(tmp_path, model_path):
    bad = tmp_path / "cut.gguf"
    shutil.copyfile(model_path, bad)
    with open(bad, "r+b") as fh:
        fh.truncate(bad.stat().st_size - 4096)
    with pytest.raises(ModelFileError, match="truncated file: tensor"):
        open_weights(bad)


def test_unsupported_architecture(tmp_path):
    path = tiny_gguf(tmp_path / "llama.gguf", arch="llama")
    with pytest.raises(UnsupportedModelError, match="unsupported architecture 'llama'"):
        open_weights(path)


def test_unsupported_tensor_type(tmp_path):
    path = tiny_gguf(tmp_path / "tq2.gguf", types={"blk.0.ffn_up.weight": QType.TQ2_0}, cfg=dict(hidden=256, ffn=256))
    with pytest.raises(UnsupportedModelError, match="blk.0.ffn_up.weight.*unsupported type TQ2_0"):
        open_weights(path)


def test_a_gguf_without_a_vocabulary_is_refused_with_one_line(tmp_path):
    """A file of ids only (tokenizer model "none", as the synthetic bench shapes and some
    llama.cpp test files are) opens for the ids-only benches but cannot be chatted with: loading
    it names the file and the missing vocabulary before any weight is uploaded."""
    from phoenix_chat.engine.loader import load
    from tools.make_synthetic_gguf import write

    path = write(tmp_path / "ids-only.gguf", "tiny", "q4_0", "q8_0")
    assert open_weights(path).config.num_layers > 0
    with pytest.raises(ModelFileError, match=r"ids-only\.gguf: holds no vocabulary \(tokenizer model 'none'"):
        load(path, backend="cpu", context_length=64)


def test_missing_tensor(tmp_path):
    path = tiny_gguf(tmp_path / "missing.gguf", omit=("blk.3.ffn_down.weight",))
    with pytest.raises(ModelFileError, match="missing 1 tensor.*layers.3.mlp.down_proj"):
        open_weights(path)


def test_tensor_shape_that_disagrees_with_the_config(tmp_path):
    """A tensor whose shape the config does not imply is refused at open: a GPU kernel would
    read past it without complaint."""
    path = tiny_gguf(tmp_path / "bad-shape.gguf", shapes={"blk.2.ffn_up.weight": (80, 64)})
    with pytest.raises(
        ModelFileError, match=r"1 tensor\(s\) do not match.*blk.2.ffn_up.weight is \(80, 64\), expected \(96, 64\)"
    ):
        open_weights(path)
    path = tiny_gguf(tmp_path / "bad-embd.gguf", shapes={"token_embd.weight": (300, 32)})
    with pytest.raises(ModelFileError, match=r"token_embd.weight is \(300, 32\), expected \(vocab, 64\)"):
        open_weights(path)


def test_hf_missing_shard_and_corrupt_header(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gemma3_text",
                "hidden_size": 64,
                "num_attention_heads": 2,
                "num_hidden_layers": 1,
                "intermediate_size": 96,
            }
        )
    )
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    (folder / "model-00001-of-00002.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    with pytest.raises(ModelFileError, match="missing shard model-00002-of-00002.safetensors"):
        open_weights(folder)
    (folder / "model.safetensors.index.json").unlink()
    (folder / "model-00001-of-00002.safetensors").write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(ModelFileError, match="corrupt safetensors header"):
        open_weights(folder)


def test_hf_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UnsupportedModelError, match="unsupported model_type 'llama'"):
        open_weights(tmp_path)


@pytest.mark.parametrize("content", [b"GGUF" + struct.pack("<IQQ", 3, 2**60, 1), b"garbage"])
def test_cli_reports_one_line_and_exit_2(tmp_path, content):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content + bytes(64))
    proc = subprocess.run(
        [sys.executable, "-m", "phoenix_chat.app.cli", "info", "--model", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("phoenix-chat: error: ") and str(bad) in lines[0]


def test_released_pages_read_back_the_same(model_path):
    """After release_pages (the Vulkan upload's: MADV_DONTNEED + POSIX_FADV_DONTNEED) a read
    faults the bytes back in from the file, unchanged."""
    w = open_weights(model_path)
    try:
        before = {n: w.raw(n).copy() for n in ("embed_tokens", "layers.0.mlp.down_proj", "norm")}
        w.release_pages("layers.0.mlp.down_proj")
        w.release_pages()
        for n, b in before.items():
            assert np.array_equal(w.raw(n), b), n
    finally:
        w.close()
