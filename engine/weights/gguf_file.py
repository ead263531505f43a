"""A lazy, validating GGUF reader.

`gguf.GGUFReader` builds a Python object for every entry of the 262k-token vocabulary and
takes 10-18 s to open the embedded 270M file; this parser reads the header in well under a
second, memory-maps the tensor data without copying, and checks every size against the file
before it allocates anything, so a truncated or corrupt file gives a one-line error instead of
a multi-GB allocation. Dequantization is left to the `gguf` package (the reference).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType
from gguf import quants as gguf_quants

from phoenix_chat.engine.config import ModelConfig
from phoenix_chat.engine.errors import ModelFileError, UnsupportedModelError
from phoenix_chat.engine.weights.base import TensorInfo, WeightSource, check_shapes, release_file_pages

if TYPE_CHECKING:
    from collections.abc import Sequence

    from phoenix_chat.engine.tokenizer import Tokenizer

GGUF_MAGIC = b"GGUF"
MAX_TENSORS = 1_000_000
MAX_KV = 100_000
MAX_DIMS = 4

# Types this engine can run; anything else is refused at open time with the tensor named.
# (the low-bit types of popular GGUF releases, Q2_K .. IQ4_XS and IQ3_XXS / IQ3_S / IQ2_XS / IQ2_S,
# included: gguf-py dequantizes them all)
SUPPORTED_TYPES = frozenset(
    {
        QType.F32,
        QType.F16,
        QType.BF16,
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
    }
)

# GGUF value type ids → (struct format, size)
_SCALARS = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_NUMPY = {
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    6: np.float32,
    7: np.bool_,
    10: np.uint64,
    11: np.int64,
    12: np.float64,
}
_STRING, _ARRAY = 8, 9

# GGUF tensor names → canonical (Hugging Face) names, per block and global.
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def canonical_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` → `layers.3.self_attn.q_proj`; None for tensors we do not use."""
    base = gguf_name.removesuffix(".weight")
    if base.startswith("blk."):
        _, layer, rest = base.split(".", 2)
        mapped = _BLOCK_NAMES.get(rest)
        return f"layers.{layer}.{mapped}" if mapped else None
    return _GLOBAL_NAMES.get(base)


@dataclass(frozen=True)
class _RawTensor:
    name: str
    dims: tuple[int, ...]  # GGUF order: ne0 (contiguous) first
    qtype: int
    offset: int


class _Cursor:
    """Bounds-checked little-endian reads over the memory map."""

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelFileError(
                self.path,
                f"truncated or corrupt GGUF header ({what} needs {n} bytes at offset {self.pos}, file has {self.size})",
            )

    def scalar(self, vtype: int, what: str) -> Any:
        fmt, size = _SCALARS[vtype]
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        value: int = self.scalar(4, what)
        return value

    def u64(self, what: str) -> int:
        value: int = self.scalar(10, what)
        return value

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype, what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            item_type, count = self.u32(what), self.u64(what)
            if item_type in _NUMPY:
                size = _SCALARS[item_type][1]
                self.need(count * size, what)
                arr: npt.NDArray[np.generic] = np.frombuffer(
                    self.buf, dtype=_NUMPY[item_type], count=count, offset=self.pos
                ).copy()
                self.pos += count * size
                return arr
            if item_type == _STRING:
                self.need(count * 8, what)  # every string has at least its 8-byte length
                return self._strings(count, what)
            if item_type == _ARRAY:
                return [self.value(_ARRAY, what) for _ in range(count)]
            raise ModelFileError(self.path, f"corrupt GGUF header: unknown array item type {item_type} in {what}")
        raise ModelFileError(self.path, f"corrupt GGUF header: unknown value type {vtype} in {what}")

    def _strings(self, count: int, what: str) -> list[str]:
        # Hot path for the 262k-entry vocabulary: plain slicing, one bounds check at the end.
        buf, pos, out = self.buf, self.pos, []
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > self.size:
                self.pos = pos
                self.need(8, what)
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > self.size:
                self.pos = pos
                self.need(n, what)
            out.append(bytes(buf[pos : pos + n]).decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return out


def map_file(path: Path) -> tuple[mmap.mmap, int]:
    """The whole file memory-mapped read-only, and its size (one-line errors for the usual faults)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise ModelFileError(path, "file not found") from None
    except IsADirectoryError:
        raise ModelFileError(path, "is a folder, not a GGUF file") from None
    except PermissionError:
        raise ModelFileError(path, "permission denied") from None
    try:
        size = os.fstat(fd).st_size
        if size < 24:
            raise ModelFileError(path, f"not a GGUF file (only {size} bytes)")
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ), size
    finally:
        os.close(fd)


def parse_header(buf: memoryview, path: Path) -> tuple[dict[str, Any], list[_RawTensor], int]:
    """(metadata, tensor records, offset where tensor data starts), every size bounds-checked."""
    cur = _Cursor(buf, path)
    cur.need(4, "magic")
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise ModelFileError(path, "not a GGUF file (bad magic; expected 'GGUF')")
    cur.pos = 4
    version = cur.u32("version")
    if version not in (2, 3):
        raise UnsupportedModelError(path, f"unsupported GGUF version {version} (2 and 3 are read)")
    n_tensors, n_kv = cur.u64("tensor count"), cur.u64("metadata count")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise ModelFileError(path, f"corrupt GGUF header: absurd counts ({n_tensors} tensors, {n_kv} keys)")
    meta: dict[str, Any] = {}  # values: int, float, bool, str, numpy array, list
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        meta[key] = cur.value(cur.u32(key), key)
    raw = []
    for i in range(n_tensors):
        name = cur.string(f"tensor name #{i}")
        n_dims = cur.u32(name)
        if not 1 <= n_dims <= MAX_DIMS:
            raise ModelFileError(path, f"corrupt tensor {name!r}: {n_dims} dimensions")
        dims = tuple(cur.u64(name) for _ in range(n_dims))
        raw.append(_RawTensor(name, dims, cur.u32(name), cur.u64(name)))
    align = int(meta.get("general.alignment", 32))
    if align <= 0 or align & (align - 1):
        raise ModelFileError(path, f"corrupt GGUF header: alignment {align}")
    data_start = (cur.pos + align - 1) // align * align
    return meta, raw, data_start


def known_type(path: Path, t: _RawTensor) -> QType:
    try:
        return QType(t.qtype)
    except ValueError:
        raise UnsupportedModelError(path, f"tensor {t.name!r} has unknown type id {t.qtype}") from None


def locate_tensor(path: Path, file_size: int, t: _RawTensor, data_start: int, name: str) -> tuple[TensorInfo, int]:
    """(its TensorInfo under `name`, where its bytes start): a type this engine runs, whole
    blocks per row, and every byte inside the file."""
    qtype = known_type(path, t)
    if qtype not in SUPPORTED_TYPES:
        raise UnsupportedModelError(
            path,
            f"tensor {t.name!r} has unsupported type {qtype.name} "
            f"(supported: {', '.join(sorted(q.name for q in SUPPORTED_TYPES))})",
        )
    block, type_size = GGML_QUANT_SIZES[qtype]
    if t.dims[0] % block:
        raise ModelFileError(path, f"corrupt tensor {t.name!r}: row of {t.dims[0]} not a multiple of {block}")
    n_elements = int(np.prod(t.dims, dtype=np.uint64))
    nbytes = n_elements // block * type_size
    start = data_start + t.offset
    if start + nbytes > file_size:
        raise ModelFileError(
            path, f"truncated file: tensor {t.name!r} ends at byte {start + nbytes}, file has {file_size} bytes"
        )
    return TensorInfo(name, qtype, tuple(reversed(t.dims)), nbytes, t.name), start


class GGUFFile(WeightSource):
    """An open GGUF model: `metadata`, `tensors` (canonical names), memory-mapped bytes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._map, self.file_size = map_file(self.path)
        self._buf = memoryview(self._map)
        self.metadata, raw_tensors, data_start = parse_header(self._buf, self.path)
        if self.metadata.get("general.type") == "mmproj":
            raise UnsupportedModelError(
                self.path,
                "this is an mmproj file (a vision tower for a text model): open the text model's GGUF "
                "and give this one with --mmproj (or keep it beside the model)",
            )
        self.config = ModelConfig.from_gguf_metadata(self.metadata, self.path)
        self.tensors, self._offsets = self._build_table(raw_tensors, data_start)
        self.chat_template = self.metadata.get("tokenizer.chat_template")
        self._check_required()

    # ---- parsing ------------------------------------------------------------------

    def _build_table(
        self, raw_tensors: list[_RawTensor], data_start: int
    ) -> tuple[dict[str, TensorInfo], dict[str, int]]:
        tensors: dict[str, TensorInfo] = {}
        offsets: dict[str, int] = {}
        for t in raw_tensors:
            name = canonical_name(t.name)
            if name is None:
                known_type(self.path, t)  # an unknown type id is refused in a tensor we skip too
                continue
            tensors[name], offsets[name] = locate_tensor(self.path, self.file_size, t, data_start, name)
        return tensors, offsets

    def _check_required(self) -> None:
        cfg = self.config
        required = ["embed_tokens", "norm"] + [
            f"layers.{i}.{n}" for i in range(cfg.num_layers) for n in _BLOCK_NAMES.values()
        ]
        missing = [n for n in required if n not in self.tensors]
        if missing:
            raise ModelFileError(
                self.path,
                f"missing {len(missing)} tensor(s), e.g. {missing[0]!r}: file incomplete or not a Gemma 3 model",
            )
        check_shapes(self.path, cfg, self.tensors)

    # ---- WeightSource -------------------------------------------------------------

    def raw(self, name: str) -> npt.NDArray[np.uint8]:
        info = self.tensors[name]
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        flat = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=self._offsets[name])
        return flat.reshape(rows, info.nbytes // rows)

    def dequantize(self, name: str) -> npt.NDArray[np.float32]:
        info = self.tensors[name]
        out = gguf_quants.dequantize(merged_rows(self.raw(name)), info.qtype)
        return np.ascontiguousarray(out, dtype=np.float32).reshape(info.shape)

    def dequantize_rows(self, name: str, rows: Sequence[int] | npt.NDArray[np.integer]) -> npt.NDArray[np.float32]:
        """Only some rows (embedding lookups) without dequantizing the whole table."""
        info = self.tensors[name]
        out = gguf_quants.dequantize(self.raw(name)[np.asarray(rows)], info.qtype)
        return np.asarray(out, dtype=np.float32).reshape(len(rows), info.shape[-1])

    def tokenizer(self) -> Tokenizer:
        from phoenix_chat.engine.tokenizer import Tokenizer, gguf_cache_key

        if "tokenizer.ggml.tokens" not in self.metadata:  # ids only (llama.cpp's benches load such files)
            model = self.metadata.get("tokenizer.ggml.model", "?")
            raise ModelFileError(
                self.path,
                f"holds no vocabulary (tokenizer model {model!r}, no tokenizer.ggml.tokens): a chat needs "
                "the model's own tokenizer; convert the model with it",
            )
        return Tokenizer.from_gguf_metadata(self.metadata, gguf_cache_key(self.path))

    def release_pages(self, name: str | None = None) -> None:
        if name is None:
            release_file_pages(self._map, self.path)
        else:
            release_file_pages(self._map, self.path, self._offsets[name], self.tensors[name].nbytes)

    def close(self) -> None:
        if self.mmproj is not None:
            self.mmproj.close()
        self._buf.release()
        try:
            self._map.close()
        except BufferError:
            pass  # numpy views still alive; the map closes with them


_Cell = TypeVar("_Cell", bound=np.generic)
MERGED_ROWS = 256  # rows handed to gguf's dequantize as one: it loops over groups of 16 "rows"


def merged_rows(raw: npt.NDArray[_Cell]) -> npt.NDArray[_Cell]:
    """`raw` (rows x row bytes; or rows x values, for gguf's quantize) seen as fewer, longer
    rows. gguf walks a tensor 16 rows at a time in Python; a row is whole blocks, so rows laid
    end to end give the same values, and the 270M's CPU load dequantized in 2.5 s, not 3.8."""
    if raw.ndim != 2:
        return raw
    rows, m = raw.shape[0], MERGED_ROWS
    while m > 1 and rows % m:
        m //= 2
    return raw.reshape(rows // m, -1)
