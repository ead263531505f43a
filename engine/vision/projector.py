"""Gemma 3's multimodal projector: vision tower output -> soft tokens in the text model's width.

Average-pool the patch grid (64 x 64 -> 16 x 16 on Gemma 3), RMSNorm with the (1 + w)
multiplier, then one [vision width, text width] matrix (stored input-major, unlike nn.Linear)."""

from __future__ import annotations

from typing import cast

import numpy as np

from phoenix_chat.engine.models.gemma3 import F32, rms_norm
from phoenix_chat.engine.vision_config import VisionConfig


def average_pool(tower_out: F32, cfg: VisionConfig) -> F32:
    """[patches, width] (row-major grid) -> [tokens, width], each token the mean of a k x k block."""
    side, k, width = cfg.patches_per_side, cfg.pool_kernel, tower_out.shape[-1]
    t = side // k
    grid = tower_out.reshape(t, k, t, k, width)
    return cast(F32, grid.mean(axis=(1, 3), dtype=np.float32).reshape(t * t, width))


def project(tower_out: F32, norm_multiplier: F32, projection: F32, cfg: VisionConfig) -> F32:
    """Soft tokens [mm_tokens_per_image, text width]; norm_multiplier is already 1 + w."""
    pooled = average_pool(tower_out, cfg)
    return cast(F32, rms_norm(pooled, norm_multiplier, cfg.layer_norm_eps) @ projection)
