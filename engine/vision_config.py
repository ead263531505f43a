"""The vision half of a Gemma 3 multimodal `config.json` (+ `preprocessor_config.json`).

Gemma 3 4B/12B/27B: SigLIP 896 px, patch 14, width 1152, 27 layers, 16 heads; 256 soft tokens
per image; `<start_of_image>` 255999, `<end_of_image>` 256000, placeholder 262144."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phoenix_chat.engine.errors import ModelFileError


@dataclass(frozen=True)
class VisionConfig:
    image_size: int = 896
    patch_size: int = 14
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_layers: int = 27
    num_heads: int = 16
    layer_norm_eps: float = 1e-6
    mm_tokens_per_image: int = 256
    text_hidden_size: int = 2560
    image_token_id: int = 262144
    boi_token_id: int = 255999
    eoi_token_id: int = 256000
    # the processor's normalization (Gemma 3: mean = std = 0.5 after rescaling by 1/255)
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_side(self) -> int:
        return math.isqrt(self.mm_tokens_per_image)

    @property
    def pool_kernel(self) -> int:
        """Patches averaged per soft token along each side (4 on Gemma 3: 64 x 64 -> 16 x 16)."""
        return self.patches_per_side // self.tokens_per_side

    @classmethod
    def from_hf(cls, raw: dict[str, Any], folder: Path) -> VisionConfig:
        """From a parsed config.json that has a `vision_config` (and the folder's preprocessor settings)."""
        v, t = raw["vision_config"], raw.get("text_config", {})
        try:
            cfg = cls(
                image_size=int(v.get("image_size", 896)),
                patch_size=int(v.get("patch_size", 14)),
                hidden_size=int(v.get("hidden_size", 1152)),
                intermediate_size=int(v.get("intermediate_size", 4304)),
                num_layers=int(v.get("num_hidden_layers", 27)),
                num_heads=int(v.get("num_attention_heads", 16)),
                layer_norm_eps=float(v.get("layer_norm_eps", 1e-6)),
                mm_tokens_per_image=int(raw.get("mm_tokens_per_image", 256)),
                text_hidden_size=int(t.get("hidden_size", 2560)),
                image_token_id=int(raw.get("image_token_index", raw.get("image_token_id", 262144))),
                boi_token_id=int(raw.get("boi_token_index", 255999)),
                eoi_token_id=int(raw.get("eoi_token_index", 256000)),
                **_preprocessor(folder / "preprocessor_config.json"),
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise ModelFileError(folder / "config.json", f"vision_config lacks or mangles a field: {exc}") from None
        if cfg.tokens_per_side**2 != cfg.mm_tokens_per_image or cfg.patches_per_side % cfg.tokens_per_side:
            raise ModelFileError(
                folder / "config.json",
                f"{cfg.mm_tokens_per_image} soft tokens per image do not pool from "
                f"{cfg.patches_per_side} x {cfg.patches_per_side} patches",
            )
        return cfg


def _preprocessor(path: Path) -> dict[str, Any]:
    """Normalization from preprocessor_config.json when the folder has one (else Gemma 3's)."""
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(path, f"not valid JSON ({exc})") from None
    out: dict[str, Any] = {}
    if "image_mean" in raw:
        out["image_mean"] = tuple(float(x) for x in raw["image_mean"])
    if "image_std" in raw:
        out["image_std"] = tuple(float(x) for x in raw["image_std"])
    if "rescale_factor" in raw:
        out["rescale_factor"] = float(raw["rescale_factor"])
    return out
