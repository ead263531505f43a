"""SigLIP vision tower (Gemma 3's image encoder): the numpy f32 reference.

Per image: 14 x 14 patches -> a linear patch embedding (the stride-14 convolution as one matrix
product) + learned position embeddings -> N pre-norm encoder layers (LayerNorm, bidirectional
multi-head attention with biases, LayerNorm, GELU-tanh MLP) -> a final LayerNorm. No pooling
head (Gemma 3 pools in its projector). Names follow transformers' `SiglipVisionModel`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np

from phoenix_chat.engine.models.gemma3 import F32, gelu_tanh
from phoenix_chat.engine.vision_config import VisionConfig

PREFIX = "vision_tower.vision_model."


def layer_norm(x: F32, weight: F32, bias: F32, eps: float) -> F32:
    mean = np.mean(x, axis=-1, keepdims=True, dtype=np.float32)
    var = np.mean(np.square(x - mean), axis=-1, keepdims=True, dtype=np.float32)
    return cast(F32, (x - mean) / np.sqrt(var + np.float32(eps)) * weight + bias)


def patchify(pixels: F32, patch: int) -> F32:
    """[3, H, W] -> [(H/p)(W/p), 3 p p], patches row by row, each in (channel, y, x) order (the
    convolution weight's order)."""
    c, h, w = pixels.shape
    gh, gw = h // patch, w // patch
    grid = pixels.reshape(c, gh, patch, gw, patch).transpose(1, 3, 0, 2, 4)
    return np.ascontiguousarray(grid.reshape(gh * gw, c * patch * patch))


class SiglipVisionTower:
    """The tower's weights as f32 arrays; `forward(pixels)` -> [patches, width]."""

    def __init__(self, cfg: VisionConfig, tensor: Callable[[str], F32]) -> None:
        self.cfg = cfg
        self.w: dict[str, F32] = {}

        def take(name: str) -> F32:
            self.w[name] = tensor(PREFIX + name)
            return self.w[name]

        patch = take("embeddings.patch_embedding.weight")
        self.patch_weight = patch.reshape(patch.shape[0], -1)  # [width, 3 p p]
        take("embeddings.patch_embedding.bias")
        take("embeddings.position_embedding.weight")
        for i in range(cfg.num_layers):
            p = f"encoder.layers.{i}."
            for n in ("layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2") + tuple(
                f"self_attn.{m}" for m in ("q_proj", "k_proj", "v_proj", "out_proj")
            ):
                take(p + n + ".weight")
                take(p + n + ".bias")
        take("post_layernorm.weight")
        take("post_layernorm.bias")

    def _linear(self, x: F32, name: str) -> F32:
        return cast(F32, x @ self.w[name + ".weight"].T + self.w[name + ".bias"])

    def forward(self, pixels: F32) -> F32:
        """pixels [3, size, size] (preprocessed) -> the last hidden state [patches, width]."""
        cfg = self.cfg
        x = patchify(pixels, cfg.patch_size) @ self.patch_weight.T + self.w["embeddings.patch_embedding.bias"]
        x = cast(F32, x + self.w["embeddings.position_embedding.weight"])
        for i in range(cfg.num_layers):
            x = self._layer(i, x)
        return layer_norm(x, self.w["post_layernorm.weight"], self.w["post_layernorm.bias"], cfg.layer_norm_eps)

    def _layer(self, i: int, x: F32) -> F32:
        cfg, p = self.cfg, f"encoder.layers.{i}."
        h = layer_norm(x, self.w[p + "layer_norm1.weight"], self.w[p + "layer_norm1.bias"], cfg.layer_norm_eps)
        x = cast(F32, x + self._attention(p + "self_attn.", h))
        h = layer_norm(x, self.w[p + "layer_norm2.weight"], self.w[p + "layer_norm2.bias"], cfg.layer_norm_eps)
        return cast(F32, x + self._linear(gelu_tanh(self._linear(h, p + "mlp.fc1")), p + "mlp.fc2"))

    def _attention(self, p: str, h: F32) -> F32:
        n, heads = len(h), self.cfg.num_heads
        d = h.shape[-1] // heads
        q = self._linear(h, p + "q_proj").reshape(n, heads, d)
        k = self._linear(h, p + "k_proj").reshape(n, heads, d)
        v = self._linear(h, p + "v_proj").reshape(n, heads, d)
        out = np.empty((n, heads, d), np.float32)
        for head in range(heads):  # one head at a time: 4,096 patches make a 64 MiB score matrix each
            scores = q[:, head] @ k[:, head].T * np.float32(d**-0.5)  # every patch sees every patch
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            out[:, head] = probs @ v[:, head]
        return self._linear(out.reshape(n, heads * d), p + "out_proj")
