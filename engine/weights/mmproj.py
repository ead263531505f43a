"""llama.cpp's split form of a Gemma 3 vision model: the text GGUF + an `mmproj` GGUF holding the
SigLIP tower and the projector (what `convert_hf_to_gguf.py --mmproj` writes and ggml-org's
`mmproj-model-f16.gguf` files are).

`MmprojFile` reads one (`clip.*` metadata, `v.*` tower and `mm.*` projector tensors) and hands its
tensors out under the Hugging Face names `models/siglip.py` and `vision/encoder.py` read, in the
Hugging Face conventions: the layouts already agree (numpy order of the GGUF dims is torch's: the
patch convolution [width, 3, p, p], positions [patches, width], the projection [vision width, text
width] as clip.cpp multiplies it), the LayerNorms are stored as they are, and only the projector's
RMSNorm is stored as its multiplier 1 + w (the converter adds 1), so w is handed back.
The soft-token count comes from `clip.vision.projector.scale_factor` (clip.cpp's n_merge, 4 when
absent); the image token ids from the text model's vocabulary.

`pair(text, mmproj_path | AUTO)` attaches one to a text GGUF: given explicitly (`--mmproj`) any
mismatch is an error; AUTO takes the one `mmproj*.gguf` beside the model (as LM Studio keeps them),
and says in `WeightSource.mmproj_note` why none was paired where there are several or the one there
is for another model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType as QType
from gguf import quants as gguf_quants

from phoenix_chat.engine.errors import ModelFileError, UnsupportedModelError
from phoenix_chat.engine.vision_config import VisionConfig
from phoenix_chat.engine.weights.base import TensorInfo, WeightSource
from phoenix_chat.engine.weights.gguf_file import GGUFFile, known_type, locate_tensor, map_file, parse_header

AUTO = "auto"  # pair(): the one mmproj*.gguf beside the model, if there is exactly one
PROJECTOR = "gemma3"  # clip.cpp's PROJECTOR_TYPE_GEMMA3: SigLIP + average pool + RMSNorm + matrix
DEFAULT_MERGE = 4  # clip.cpp: Gemma 3 pools 4 x 4 patches when the file does not say
SOFT_NORM = "multi_modal_projector.mm_soft_emb_norm.weight"
TOWER = "vision_tower.vision_model."
IMAGE_TOKENS = ("<image_soft_token>", "<start_of_image>", "<end_of_image>")

_LAYER_NAMES = {
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}
_GLOBAL_NAMES = {
    "v.patch_embd": TOWER + "embeddings.patch_embedding",
    "v.position_embd": TOWER + "embeddings.position_embedding",
    "v.post_ln": TOWER + "post_layernorm",
    "mm.soft_emb_norm": "multi_modal_projector.mm_soft_emb_norm",
    "mm.input_projection": "multi_modal_projector.mm_input_projection_weight",
}


def hf_name(gguf_name: str) -> str | None:
    """`v.blk.3.attn_q.bias` -> `vision_tower.vision_model.encoder.layers.3.self_attn.q_proj.bias`;
    `mm.input_projection.weight` -> `multi_modal_projector.mm_input_projection_weight` (a bare
    parameter in transformers, not a Linear); None for a tensor Gemma 3 does not use."""
    base, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if base.startswith("v.blk."):
        _, _, layer, rest = base.split(".", 3)
        mapped = _LAYER_NAMES.get(rest)
        return f"{TOWER}encoder.layers.{layer}.{mapped}.{suffix}" if mapped else None
    mapped = _GLOBAL_NAMES.get(base)
    if mapped is None:
        return None
    return mapped if mapped.endswith("_weight") else f"{mapped}.{suffix}"


def required(cfg: VisionConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the tower and projector read, by its name in the file, with the shape `cfg`
    implies (numpy order)."""
    w, ffn, p = cfg.hidden_size, cfg.intermediate_size, cfg.patch_size
    out: dict[str, tuple[int, ...]] = {
        "v.patch_embd.weight": (w, 3, p, p),
        "v.patch_embd.bias": (w,),
        "v.position_embd.weight": (cfg.patches_per_side**2, w),
        "v.post_ln.weight": (w,),
        "v.post_ln.bias": (w,),
        "mm.soft_emb_norm.weight": (w,),
        "mm.input_projection.weight": (w, cfg.text_hidden_size),
    }
    shapes = {"ln1": (w,), "ln2": (w,), "ffn_up": (ffn, w), "ffn_down": (w, ffn)}
    shapes.update({m: (w, w) for m in ("attn_q", "attn_k", "attn_v", "attn_out")})
    for i in range(cfg.num_layers):
        for name, shape in shapes.items():
            out[f"v.blk.{i}.{name}.weight"] = shape
            out[f"v.blk.{i}.{name}.bias"] = shape[:1]
    return out


class MmprojFile:
    """One mmproj GGUF, validated at open: Gemma 3's projector, every tensor present and shaped
    as its `clip.*` metadata says. `vision_config(text)` completes the settings from the text model."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        self._map, self.file_size = map_file(self.path)
        buf = memoryview(self._map)
        try:
            self.metadata, raw_tensors, data_start = parse_header(buf, self.path)
        finally:
            buf.release()
        meta = self.metadata
        if meta.get("general.type") != "mmproj" and meta.get("general.architecture") != "clip":
            arch = meta.get("general.architecture", "?")
            raise ModelFileError(self.path, f"not an mmproj file (a {arch!r} model, not llama.cpp's vision 'clip')")
        kind = meta.get("clip.projector_type", meta.get("clip.vision.projector_type"))
        if kind != PROJECTOR:
            raise UnsupportedModelError(
                self.path, f"unsupported projector type {kind!r}: Phoenix Chat runs Gemma 3's ({PROJECTOR!r})"
            )
        if not meta.get("clip.has_vision_encoder", False):
            raise UnsupportedModelError(self.path, "this mmproj file has no vision encoder")
        self.tensors: dict[str, TensorInfo] = {}
        self._offsets: dict[str, int] = {}
        for t in raw_tensors:
            name = hf_name(t.name)
            if name is None:
                known_type(self.path, t)
                continue
            self.tensors[name], self._offsets[name] = locate_tensor(self.path, self.file_size, t, data_start, name)
        try:
            self._geometry = self._read_geometry()
        except (TypeError, ValueError, IndexError) as exc:
            raise ModelFileError(self.path, f"mangled clip.* metadata ({exc})") from None
        self.merge = int(self._geometry["merge"])
        self.projection_dim = int(self._geometry["projection_dim"])
        self._check_tensors(self.settings(self.projection_dim, (0, 0, 0)))

    def _key(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelFileError(self.path, f"mmproj metadata lacks {key!r}")
        return self.metadata[key]

    def _read_geometry(self) -> dict[str, Any]:
        g: dict[str, Any] = {
            "image_size": int(self._key("clip.vision.image_size")),
            "patch_size": int(self._key("clip.vision.patch_size")),
            "hidden_size": int(self._key("clip.vision.embedding_length")),
            "intermediate_size": int(self._key("clip.vision.feed_forward_length")),
            "num_layers": int(self._key("clip.vision.block_count")),
            "num_heads": int(self._key("clip.vision.attention.head_count")),
            "layer_norm_eps": float(self.metadata.get("clip.vision.attention.layer_norm_epsilon", 1e-6)),
            "merge": int(self.metadata.get("clip.vision.projector.scale_factor", DEFAULT_MERGE)),
            "projection_dim": int(self._key("clip.vision.projection_dim")),
        }
        mean = [float(x) for x in self.metadata.get("clip.vision.image_mean", (0.5, 0.5, 0.5))]
        std = [float(x) for x in self.metadata.get("clip.vision.image_std", (0.5, 0.5, 0.5))]
        if len(mean) != 3 or len(std) != 3:
            raise ValueError("clip.vision.image_mean/std must have three values")
        g["image_mean"], g["image_std"] = (mean[0], mean[1], mean[2]), (std[0], std[1], std[2])
        if min(g["patch_size"], g["merge"], g["num_heads"], g["hidden_size"]) < 1:
            raise ValueError("a size of 0")
        side = g["image_size"] // g["patch_size"]
        if side < 1 or side % g["merge"]:
            raise ValueError(f"{side} x {side} patches do not pool by {g['merge']}")
        if g["hidden_size"] % g["num_heads"]:
            raise ValueError(f"width {g['hidden_size']} does not split into {g['num_heads']} heads")
        g["mm_tokens_per_image"] = (side // g["merge"]) ** 2
        return g

    def settings(self, text_hidden: int, ids: tuple[int, int, int]) -> VisionConfig:
        """The tower's settings in front of a text model of width `text_hidden` whose vocabulary
        has (placeholder, start-of-image, end-of-image) at `ids`."""
        g = self._geometry
        return VisionConfig(
            image_size=g["image_size"],
            patch_size=g["patch_size"],
            hidden_size=g["hidden_size"],
            intermediate_size=g["intermediate_size"],
            num_layers=g["num_layers"],
            num_heads=g["num_heads"],
            layer_norm_eps=g["layer_norm_eps"],
            mm_tokens_per_image=g["mm_tokens_per_image"],
            text_hidden_size=text_hidden,
            image_token_id=ids[0],
            boi_token_id=ids[1],
            eoi_token_id=ids[2],
            image_mean=g["image_mean"],
            image_std=g["image_std"],
        )

    def _check_tensors(self, cfg: VisionConfig) -> None:
        want = required(cfg)
        missing = [n for n in want if hf_name(n) not in self.tensors]
        if missing:
            raise ModelFileError(
                self.path,
                f"missing {len(missing)} tensor(s), e.g. {missing[0]!r}: file incomplete or not a Gemma 3 mmproj",
            )
        bad = [
            f"{n} is {self.tensors[str(hf_name(n))].shape}, expected {shape}"
            for n, shape in want.items()
            if self.tensors[str(hf_name(n))].shape != shape
        ]
        if bad:
            raise ModelFileError(self.path, f"{len(bad)} tensor(s) do not match its clip.* metadata, e.g. {bad[0]}")

    def vision_config(self, text: GGUFFile) -> VisionConfig:
        """The settings for this tower in front of `text`; ModelFileError when it is another model's."""
        hidden = text.config.hidden_size
        if self.projection_dim != hidden:
            raise ModelFileError(
                self.path,
                f"mmproj for another model: it projects into width {self.projection_dim}, "
                f"{text.path.name} has width {hidden}",
            )
        tokens = text.metadata.get("tokenizer.ggml.tokens", [])
        index = {t: i for i, t in enumerate(tokens) if t in IMAGE_TOKENS}
        lacking = [t for t in IMAGE_TOKENS if t not in index]
        if lacking:
            raise ModelFileError(
                text.path, f"its vocabulary lacks {lacking[0]} (not a Gemma 3 vision model's text half)"
            )
        return self.settings(hidden, (index[IMAGE_TOKENS[0]], index[IMAGE_TOKENS[1]], index[IMAGE_TOKENS[2]]))

    def vision_tensor(self, name: str) -> npt.NDArray[np.float32]:
        """A tower / projector tensor as f32 in transformers' conventions (the projector's norm
        as w: the file stores 1 + w)."""
        info = self.tensors.get(name)
        if info is None:
            raise ModelFileError(self.path, f"missing vision tensor {name!r}")
        raw = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=self._offsets[name])
        if info.qtype == QType.F32:
            out = raw.view(np.float32).reshape(info.shape).copy()
        else:
            out = np.asarray(gguf_quants.dequantize(raw, info.qtype), dtype=np.float32).reshape(info.shape)
        return out - np.float32(1.0) if name == SOFT_NORM else out

    def tensor_types(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.qtype.name] = counts.get(t.qtype.name, 0) + 1
        return counts

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:
            pass  # numpy views still alive; the map closes with them


def candidates(model: Path) -> list[Path]:
    """The `mmproj*.gguf` files beside a model file, any case (never the model itself)."""
    try:
        entries = list(model.parent.iterdir())
    except OSError:  # a folder we may not list: nothing is paired, as with none there
        return []
    return sorted(
        p
        for p in entries
        if p.name.lower().startswith("mmproj") and p.name.lower().endswith(".gguf") and p != model and p.is_file()
    )


def pair(text: WeightSource, mmproj: str | os.PathLike[str] | None) -> None:
    """Attach an mmproj to a text GGUF (`text.vision_config`, `vision_tensor`, `mmproj`,
    `mmproj_note`). mmproj: a path (errors are errors), AUTO (the one beside it, reported in
    `mmproj_note` when none is taken), None (nothing)."""
    if mmproj is None:
        return
    if not isinstance(text, GGUFFile):
        if mmproj == AUTO:
            return
        raise UnsupportedModelError(
            text.path, "--mmproj goes with a GGUF text model; a Hugging Face folder carries its own vision tower"
        )
    if mmproj != AUTO:
        attach(text, MmprojFile(mmproj), "given with --mmproj")
        return
    found = candidates(text.path)
    if not found:
        return
    if len(found) > 1:
        text.mmproj_note = (
            f"not paired: {len(found)} mmproj*.gguf files beside the model "
            f"({', '.join(p.name for p in found)}); choose one with --mmproj"
        )
        return
    try:
        attach(text, MmprojFile(found[0]), "paired automatically: the only mmproj*.gguf beside the model")
    except ModelFileError as exc:
        text.mmproj_note = f"not paired: {found[0].name} beside the model does not fit it ({exc.problem})"


def attach(text: GGUFFile, mm: MmprojFile, how: str) -> None:
    text.vision_config = mm.vision_config(text)
    text.mmproj = mm
    text.mmproj_note = how
