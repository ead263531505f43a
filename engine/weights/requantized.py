"""A weight source that reads as if the model were stored in another type (Q4_0, Q4_1, Q5_1, Q8_0, F16).

The CPU reference computes in f32, so "Q8_0 on the CPU" cannot mean Q8_0 arithmetic; it means
the model's values are those a Q8_0 file holds. Each matrix is dequantized from the file,
re-quantized with gguf-py's reference quantizer (the one llama.cpp's files agree with) and
handed out as those blocks (`raw`) or their f32 values (`dequantize`). Norms stay f32; the
embedding follows `WeightQuant.embedding_qtype`, as the Vulkan backend does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType
from gguf import quants as gguf_quants

from phoenix_chat.engine.errors import UnsupportedModelError
from phoenix_chat.engine.quantization import WeightQuant
from phoenix_chat.engine.weights.base import TensorInfo, WeightSource
from phoenix_chat.engine.weights.gguf_file import merged_rows

if TYPE_CHECKING:
    from phoenix_chat.engine.tokenizer import Tokenizer


class RequantizedWeights(WeightSource):
    """`source` with every matrix in `quant`'s type (computed on each read, not cached; the
    source stays open and belongs to whoever opened it)."""

    def __init__(self, source: WeightSource, quant: WeightQuant):
        self.source, self.quant = source, quant
        self.path, self.config = source.path, source.config
        self.chat_template, self.file_size = source.chat_template, source.file_size
        self.metadata = getattr(source, "metadata", {})
        self.tensors = {name: self._retyped(t) for name, t in source.tensors.items()}

    def _retyped(self, t: TensorInfo) -> TensorInfo:
        if t.is_norm or len(t.shape) != 2:
            return t
        target = self.quant.embedding_qtype if t.name == "embed_tokens" else self.quant.qtype
        block, size = GGML_QUANT_SIZES[target]
        rows, cols = t.shape
        if cols % block:
            raise UnsupportedModelError(
                self.path, f"{t.source_name or t.name}: rows of {cols} are no whole {target.name} blocks of {block}"
            )
        return replace(t, qtype=target, nbytes=rows * cols // block * size)

    def release_pages(self, name: str | None = None) -> None:
        self.source.release_pages(name)

    def raw(self, name: str) -> npt.NDArray[np.uint8]:
        """The tensor's blocks in its new type, one row of bytes per matrix row."""
        t = self.tensors[name]
        if t.qtype == self.source.tensors[name].qtype:
            return self.source.raw(name)
        values = self.source.dequantize(name)
        blocks = gguf_quants.quantize(np.ascontiguousarray(values, dtype=np.float32), t.qtype)
        return np.ascontiguousarray(blocks).view(np.uint8).reshape(t.shape[0], -1)

    def dequantize(self, name: str) -> npt.NDArray[np.float32]:
        t = self.tensors[name]
        if t.qtype == self.source.tensors[name].qtype:
            return self.source.dequantize(name)
        return self._values(self.raw(name), t)

    def dequantize_rows(self, name: str, rows: Sequence[int] | npt.NDArray[np.integer]) -> npt.NDArray[np.float32]:
        t = self.tensors[name]
        picked = self.raw(name)[np.asarray(rows)]
        return self._values(picked, replace(t, shape=(len(picked), t.shape[1])))

    @staticmethod
    def _values(blocks: npt.NDArray[np.uint8], t: TensorInfo) -> npt.NDArray[np.float32]:
        if t.qtype == QType.F16:
            out = blocks.view(np.float16)
        else:
            out = gguf_quants.dequantize(merged_rows(blocks), t.qtype)
        return np.ascontiguousarray(out, dtype=np.float32).reshape(t.shape)

    def tokenizer(self) -> Tokenizer:
        return self.source.tokenizer()
