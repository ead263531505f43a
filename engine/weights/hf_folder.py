"""Hugging Face Gemma 3 checkpoint folders: config.json + (sharded) *.safetensors + tokenizer.json.

Each shard is memory-mapped and its JSON header parsed here (the format is 8 bytes of length and
a JSON table), so BF16 tensors — which numpy cannot name — come out as raw bytes without a copy.
The multimodal 4B/12B/27B checkpoints keep the text model under `language_model.`; the vision
tower and projector are indexed apart (`vision_tensors`, read with `vision_tensor`), so the
text backends never see them, and `vision_config` says whether the folder can take images.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType as QType

from phoenix_chat.engine.config import ModelConfig
from phoenix_chat.engine.errors import ModelFileError, UnsupportedModelError
from phoenix_chat.engine.vision_config import VisionConfig
from phoenix_chat.engine.weights.base import TensorInfo, WeightSource, check_shapes, release_file_pages

if TYPE_CHECKING:
    from phoenix_chat.engine.tokenizer import Tokenizer

_DTYPES = {"F32": (QType.F32, 4), "F16": (QType.F16, 2), "BF16": (QType.BF16, 2)}
_TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.")
_SKIP_PREFIXES = _VISION_PREFIXES + tuple("model." + p for p in _VISION_PREFIXES)
PROJECTION = "multi_modal_projector.mm_input_projection_weight"
MAX_HEADER = 100 * 1024 * 1024


def vision_name(hf_name: str) -> str | None:
    """`vision_tower.…` / `multi_modal_projector.…` (the `model.` prefix of newer checkpoints
    dropped, `.weight`/`.bias` kept: the tower has both), or None for a text-model tensor."""
    if not hf_name.startswith(_SKIP_PREFIXES):
        return None
    return hf_name.removeprefix("model.")


def canonical_name(hf_name: str) -> str | None:
    if hf_name.startswith(_SKIP_PREFIXES):
        return None
    name = hf_name.removesuffix(".weight")
    for prefix in _TEXT_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name


class HFFolder(WeightSource):
    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.path = Path(folder)
        if not self.path.is_dir():
            raise ModelFileError(self.path, "not a folder")
        self.config = ModelConfig.from_hf_config(self.path / "config.json")
        self.chat_template = _read_chat_template(self.path)
        self._maps: list[mmap.mmap] = []
        self._shard_paths: list[Path] = []  # beside _maps
        self.tensors: dict[str, TensorInfo] = {}
        self._where: dict[str, tuple[mmap.mmap, int]] = {}
        self.vision_tensors: dict[str, TensorInfo] = {}
        for shard in self._shards():
            self._index_shard(shard)
        self.file_size = sum(len(m) for m in self._maps)
        self._check_required()
        self.vision_config = self._read_vision_config()

    def _read_vision_config(self) -> VisionConfig | None:
        """The vision settings when config.json has them and the projector is in the files
        (a text-only export of a multimodal model keeps the config but not the tower)."""
        raw = json.loads((self.path / "config.json").read_text())
        if not isinstance(raw.get("vision_config"), dict) or PROJECTION not in self.vision_tensors:
            return None
        return VisionConfig.from_hf(raw, self.path)

    def _shards(self) -> list[Path]:
        index = self.path / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ModelFileError(index, f"corrupt shard index ({exc})") from None
            shards = sorted(set(weight_map.values()))
            missing = [s for s in shards if not (self.path / s).exists()]
            if missing:
                raise ModelFileError(self.path, f"missing shard {missing[0]} ({len(missing)} of {len(shards)} missing)")
            return [self.path / s for s in shards]
        shards = sorted(self.path.glob("*.safetensors"))
        if not shards:
            raise ModelFileError(self.path, "no *.safetensors files in the folder")
        return shards

    def _index_shard(self, shard: Path) -> None:
        size = shard.stat().st_size
        if size < 8:
            raise ModelFileError(shard, "truncated safetensors file")
        with open(shard, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        (header_len,) = struct.unpack_from("<Q", mm, 0)
        if header_len > min(MAX_HEADER, size - 8):
            raise ModelFileError(shard, f"corrupt safetensors header (claims {header_len} bytes)")
        try:
            header = json.loads(bytes(mm[8 : 8 + header_len]))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelFileError(shard, f"corrupt safetensors header ({exc})") from None
        self._maps.append(mm)
        self._shard_paths.append(shard)
        base = 8 + header_len
        for hf_name, entry in header.items():
            if hf_name == "__metadata__":
                continue
            vision = vision_name(hf_name)
            name = vision or canonical_name(hf_name)
            if name is None:
                continue
            dtype = entry.get("dtype")
            if dtype not in _DTYPES:
                raise UnsupportedModelError(
                    shard, f"tensor {hf_name!r} has unsupported dtype {dtype} (F32, F16, BF16 are read)"
                )
            qtype, itemsize = _DTYPES[dtype]
            shape = tuple(int(d) for d in entry["shape"])
            start, end = (int(x) for x in entry["data_offsets"])
            nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
            if end - start != nbytes:
                raise ModelFileError(shard, f"corrupt tensor {hf_name!r}: {end - start} bytes for shape {shape}")
            if base + end > size:
                raise ModelFileError(
                    shard, f"truncated file: tensor {hf_name!r} ends at byte {base + end}, file has {size}"
                )
            table = self.vision_tensors if vision else self.tensors
            table[name] = TensorInfo(name, qtype, shape, nbytes, hf_name)
            self._where[name] = (mm, base + start)

    def _check_required(self) -> None:
        cfg = self.config
        blocks = [
            "input_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "self_attn.q_norm",
            "self_attn.k_norm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
            "post_feedforward_layernorm",
        ]
        required = ["embed_tokens", "norm"] + [f"layers.{i}.{b}" for i in range(cfg.num_layers) for b in blocks]
        missing = [n for n in required if n not in self.tensors]
        if missing:
            raise ModelFileError(self.path, f"missing {len(missing)} tensor(s), e.g. {missing[0]!r}")
        check_shapes(self.path, cfg, self.tensors)

    def raw(self, name: str) -> npt.NDArray[np.uint8]:
        info = self.tensors[name] if name in self.tensors else self.vision_tensors[name]
        mm, offset = self._where[name]
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        return np.frombuffer(mm, dtype=np.uint8, count=info.nbytes, offset=offset).reshape(rows, -1)

    def dequantize(self, name: str) -> npt.NDArray[np.float32]:
        info = self.tensors[name]
        out = _to_f32(self.raw(name), info.qtype).reshape(info.shape)
        return out + np.float32(1.0) if info.is_norm else out

    def dequantize_rows(self, name: str, rows: Sequence[int] | npt.NDArray[np.integer]) -> npt.NDArray[np.float32]:
        info = self.tensors[name]
        return _to_f32(self.raw(name)[np.asarray(rows)], info.qtype).reshape(len(rows), info.shape[-1])

    def vision_tensor(self, name: str) -> npt.NDArray[np.float32]:
        """A vision tower / projector tensor as f32, as stored (norm weights are w, not 1 + w:
        the tower's LayerNorms use w as it is)."""
        info = self.vision_tensors.get(name)
        if info is None:
            raise ModelFileError(self.path, f"missing vision tensor {name!r}")
        return _to_f32(self.raw(name), info.qtype).reshape(info.shape)

    def tokenizer(self) -> Tokenizer:
        from phoenix_chat.engine.tokenizer import Tokenizer

        return Tokenizer.from_hf_folder(self.path)

    def release_pages(self, name: str | None = None) -> None:
        if name is None:
            for mm, shard in zip(self._maps, self._shard_paths):
                release_file_pages(mm, shard)
        elif name in self._where:
            mm, offset = self._where[name]
            shard = self._shard_paths[next(i for i, m in enumerate(self._maps) if m is mm)]
            release_file_pages(mm, shard, offset, self.tensors[name].nbytes)

    def close(self) -> None:
        for mm in self._maps:
            try:
                mm.close()
            except BufferError:
                pass


def _to_f32(raw: npt.NDArray[np.uint8], qtype: QType) -> npt.NDArray[np.float32]:
    flat = np.ascontiguousarray(raw).reshape(-1)
    if qtype == QType.F32:
        return flat.view(np.float32).copy()
    if qtype == QType.F16:
        return flat.view(np.float16).astype(np.float32)
    # BF16: the high half of an f32
    return (flat.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _read_chat_template(folder: Path) -> str | None:
    for name in ("chat_template.jinja",):
        if (folder / name).exists():
            return (folder / name).read_text()
    for name in ("tokenizer_config.json", "chat_template.json"):
        path = folder / name
        if path.exists():
            try:
                template = json.loads(path.read_text()).get("chat_template")
            except json.JSONDecodeError:
                continue
            if isinstance(template, list):  # named templates: take "default"
                template = next((t["template"] for t in template if t.get("name") == "default"), None)
            if isinstance(template, str) and template:
                return template
    return None
