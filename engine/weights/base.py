"""What every weight source (GGUF file, Hugging Face folder) offers the backends.

Tensor names are canonical and follow the Hugging Face checkpoint (`layers.3.self_attn.q_proj`,
`embed_tokens`, `norm`, without `model.` or `.weight`); GGUF names are mapped once, in its loader.
Shapes are in numpy order: (rows=out_features, cols=in_features) for matrices.

Norm weights are always handed out as the *multiplier*: Gemma scales by (1 + w); GGUF files
already store 1 + w, Hugging Face files store w, and the loaders hide that difference.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType as QType

from phoenix_chat.engine.errors import ModelFileError

if TYPE_CHECKING:
    from phoenix_chat.engine.config import ModelConfig
    from phoenix_chat.engine.tokenizer import Tokenizer
    from phoenix_chat.engine.vision_config import VisionConfig


class VisionFile(Protocol):
    """A separate file holding the vision tower and projector (llama.cpp's mmproj GGUF)."""

    path: Path
    file_size: int

    def vision_tensor(self, name: str) -> npt.NDArray[np.float32]: ...

    def tensor_types(self) -> dict[str, int]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class TensorInfo:
    name: str  # canonical name
    qtype: QType  # storage type in the file (F32, F16, BF16, Q8_0, Q4_K, ...)
    shape: tuple[int, ...]  # numpy order, logical (dequantized) shape
    nbytes: int  # bytes in the file
    source_name: str = ""  # the name inside the file, for error messages

    @property
    def is_norm(self) -> bool:
        return self.name.endswith("norm")


class WeightSource:
    """A memory-mapped model: config, tensor table, raw bytes, f32 dequantization, tokenizer."""

    path: Path
    config: ModelConfig
    tensors: dict[str, TensorInfo]
    chat_template: str | None = None
    file_size: int = 0
    vision_config: VisionConfig | None = None  # None: a text-only model (no image input)
    mmproj: VisionFile | None = None  # the tower's own file, paired with a text GGUF (weights/mmproj.py)
    mmproj_note: str = ""  # how that file was paired, or why one beside the model was not

    def raw(self, name: str) -> npt.NDArray[np.uint8]:
        """The tensor's bytes as stored (uint8, memory-mapped, no copy)."""
        raise NotImplementedError

    def dequantize(self, name: str) -> npt.NDArray[np.float32]:
        """The tensor as float32 in its logical shape (norms as 1 + w multipliers)."""
        raise NotImplementedError

    def tokenizer(self) -> Tokenizer:
        raise NotImplementedError

    def vision_tensor(self, name: str) -> npt.NDArray[np.float32]:
        """A vision tower or projector tensor as f32 (only where `vision_config` is set), in
        transformers' names and conventions (norm weights w, not 1 + w)."""
        if self.mmproj is None:
            raise NotImplementedError(f"{type(self).__name__} holds no vision tensors")
        return self.mmproj.vision_tensor(name)

    def tensor_types(self) -> dict[str, int]:
        """How many tensors of each storage type: for `info` and the GUI."""
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.qtype.name] = counts.get(t.qtype.name, 0) + 1
        return counts

    def release_pages(self, name: str | None = None) -> None:
        """Tensor `name` (None: every tensor) is on the device now: drop its file pages from this
        process and from the page cache (release_file_pages). Reads after this still work: they
        fault the pages back in from the file."""

    def close(self) -> None:
        pass


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Each layer tensor's shape as the config implies it (numpy order); the embedding's rows
    (the vocabulary) are left to the file."""
    H, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    block = {
        "input_layernorm": (H,),
        "self_attn.q_proj": (q, H),
        "self_attn.k_proj": (kv, H),
        "self_attn.v_proj": (kv, H),
        "self_attn.o_proj": (H, q),
        "self_attn.q_norm": (hd,),
        "self_attn.k_norm": (hd,),
        "post_attention_layernorm": (H,),
        "pre_feedforward_layernorm": (H,),
        "mlp.gate_proj": (inter, H),
        "mlp.up_proj": (inter, H),
        "mlp.down_proj": (H, inter),
        "post_feedforward_layernorm": (H,),
    }
    out: dict[str, tuple[int, ...]] = {"norm": (H,)}
    for i in range(cfg.num_layers):
        out.update({f"layers.{i}.{name}": shape for name, shape in block.items()})
    return out


def check_shapes(path: str | os.PathLike[str], cfg: ModelConfig, tensors: dict[str, TensorInfo]) -> None:
    """ModelFileError naming the first tensor whose shape disagrees with the config (a broken
    converter, a mislabelled file): caught at open, since a GPU kernel would read past it
    without complaint."""
    bad = [
        f"{tensors[n].source_name or n} is {tensors[n].shape}, expected {want}"
        for n, want in expected_shapes(cfg).items()
        if n in tensors and tensors[n].shape != want
    ]
    for n in ("embed_tokens", "lm_head"):
        if n in tensors and tensors[n].shape[-1:] != (cfg.hidden_size,):
            bad.append(f"{tensors[n].source_name or n} is {tensors[n].shape}, expected (vocab, {cfg.hidden_size})")
    if bad:
        raise ModelFileError(path, f"{len(bad)} tensor(s) do not match the model's configuration, e.g. {bad[0]}")


def release_file_pages(m: mmap.mmap, path: Path, start: int = 0, length: int = 0) -> None:
    """Unmap bytes [start, start + length) of `m` (length 0: to the end) from this process
    (MADV_DONTNEED: they count in its RSS) and ask the kernel to drop those clean pages of `path`
    from the page cache (POSIX_FADV_DONTNEED). After a GPU upload they are a second copy of the
    weights in RAM, which on an integrated GPU is the memory the device copy lives in too. Best
    effort: a platform without either call keeps them."""
    end = len(m) if length == 0 else min(len(m), start + length)
    first = start - start % mmap.PAGESIZE
    if end <= first:
        return
    if hasattr(mmap, "MADV_DONTNEED"):
        m.madvise(mmap.MADV_DONTNEED, first, end - first)
    if hasattr(os, "posix_fadvise"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return
        try:
            os.posix_fadvise(fd, first, end - first, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
