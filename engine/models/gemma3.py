"""Gemma 3 text model: the numpy reference forward pass (f32) and its cache plan.

This is the reference every other backend is checked against, so it favours being plainly
right over being fast: f32 everywhere, the Hugging Face formulation step by step.
Linear layers go through `linear()`, the one hook a hybrid plan (NPU prefill) overrides.
Pictures (engine/vision/): a forward may carry image spans, whose soft tokens replace the
placeholders' embeddings (unscaled, as transformers' masked_scatter) and whose positions attend
to each other both ways — on local layers still within the window's lower bound, as
transformers' AND(sliding window, OR(causal, block)). A span must lie whole in one forward.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeAlias, cast

import numpy as np
import numpy.typing as npt

from phoenix_chat.engine.config import ModelConfig
from phoenix_chat.engine.errors import CancelledError
from phoenix_chat.engine.models.kv_plan import layer_slots
from phoenix_chat.engine.weights.base import WeightSource

if TYPE_CHECKING:
    from phoenix_chat.engine.vision.spans import ImageSpan

_GELU_C = np.float32(np.sqrt(2.0 / np.pi))

F32: TypeAlias = npt.NDArray[np.float32]
# numpy's stubs type much f32 arithmetic as float64 or floating[Any]; cast(F32, ...) below says what
# the arrays are (all f32: the reference runs in f32 throughout)


def rms_norm(x: F32, multiplier: F32, eps: float) -> F32:
    """Gemma's RMSNorm; `multiplier` is already 1 + w (see engine/weights/base.py)."""
    var = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
    return cast(F32, (x / np.sqrt(var + np.float32(eps))) * multiplier)


def gelu_tanh(x: F32) -> F32:
    return cast(
        F32, np.float32(0.5) * x * (np.float32(1.0) + np.tanh(_GELU_C * (x + np.float32(0.044715) * x * x * x)))
    )


def rope_tables(positions: npt.NDArray[np.integer], head_dim: int, base: float, scale: float) -> tuple[F32, F32]:
    """cos/sin for NEOX-style (rotate-half) RoPE; linear scaling divides the positions."""
    inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    angles = (positions.astype(np.float64)[:, None] / scale) * inv_freq[None, :]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    return np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)


def apply_rope(x: F32, cos: F32, sin: F32) -> F32:
    """x: [n, heads, head_dim]; cos/sin: [n, head_dim]."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return cast(F32, x * cos[:, None, :] + rotated * sin[:, None, :])


class KVCache:
    """Per-layer K/V: full length on global layers, a ring on local ones.

    Slot of position p: p on global layers, p % ring on local ones; the ring's size is
    `kv_plan.ring_slots` (the window plus the most positions one forward writes, which is also
    how far a speculative draft can be rolled back). `positions` remembers which position each
    slot holds (-1 = empty): rolling back is simply starting the next forward at an earlier
    position.
    """

    def __init__(self, config: ModelConfig, context_length: int, forward_tokens: int):
        self.config = config
        self.forward_tokens = forward_tokens
        self.k: list[F32] = []
        self.v: list[F32] = []
        self.positions: list[npt.NDArray[np.int64]] = []
        for slots in layer_slots(config, context_length, forward_tokens):
            self.k.append(np.zeros((slots, config.num_kv_heads, config.head_dim), np.float32))
            self.v.append(np.zeros((slots, config.num_kv_heads, config.head_dim), np.float32))
            self.positions.append(np.full(slots, -1, np.int64))

    def write(self, layer: int, positions: npt.NDArray[np.int64], k: F32, v: F32) -> None:
        slots = positions % len(self.positions[layer])
        self.k[layer][slots], self.v[layer][slots] = k, v
        self.positions[layer][slots] = positions

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) * 2


class Segment(NamedTuple):
    """One sequence's run of rows in a forward: its cache, its positions, its first row, and
    which image span each of its rows is in (-1: text; None: no picture in this run)."""

    cache: KVCache
    positions: npt.NDArray[np.int64]
    first: int
    blocks: npt.NDArray[np.int64] | None = None


class Gemma3Model:
    """Weights as dense f32 arrays plus the forward pass over a chunk of tokens.
    forward_tokens: the most tokens the caller passes to one forward (sizes the KV rings)."""

    def __init__(
        self,
        weights: WeightSource,
        context_length: int,
        progress: Callable[[float, str], None] | None = None,
        cancel: threading.Event | None = None,
        *,
        forward_tokens: int,
        slots: int = 1,
    ) -> None:
        """slots: independent K/V caches (sequences) this model serves; `cache` is slot 0's."""
        self.config = cfg = weights.config
        self.context_length = context_length
        names = [n for n in weights.tensors if n != "embed_tokens"]
        self.w: dict[str, F32] = {}
        for i, name in enumerate(names):
            if cancel is not None and cancel.is_set():
                raise CancelledError("loading cancelled")
            self.w[name] = weights.dequantize(name)
            if progress:
                progress((i + 1) / (len(names) + 1), f"dequantizing {name}")
        # The embedding is also the output head (tied): keep one f32 copy.
        self.embed = weights.dequantize("embed_tokens")
        if progress:
            progress(1.0, "weights ready")
        self.embed_scale = np.float32(cfg.embed_scale)
        self.caches = [KVCache(cfg, context_length, forward_tokens) for _ in range(max(1, slots))]
        self.cache = self.caches[0]
        self.rope: dict[str, tuple[F32, F32]] = {}
        for kind, base, scale in (
            ("local", cfg.rope_local_theta, 1.0),
            ("global", cfg.rope_theta, cfg.rope_scaling_factor),
        ):
            self.rope[kind] = rope_tables(np.arange(context_length), cfg.head_dim, base, scale)

    def linear(self, x: F32, name: str) -> F32:
        """x [n, in] @ W[name].T → [n, out]. The hook hybrid plans override."""
        return x @ self.w[name].T

    def forward(
        self,
        token_ids: Sequence[int],
        start_pos: int,
        all_logits: bool = False,
        cancel: Callable[[], bool] | None = None,
        images: Sequence[ImageSpan] = (),
        slot: int = 0,
    ) -> F32:
        """Logits of the last (or every) position, K/V into `slot`'s cache. `cancel` is asked
        before each layer: on a small CPU one chunk of a long prompt takes seconds, a layer of it
        a fraction of one, and a cancelled pass leaves only positions ≥ start_pos half-written
        (never read: the next forward starts at or before them). `images`: spans (absolute
        positions) whose soft tokens this forward's positions take; each one met must lie whole
        inside it."""
        ids = np.asarray(token_ids, dtype=np.int64)
        positions = np.arange(start_pos, start_pos + len(ids))
        x = self.embed[ids] * self.embed_scale
        blocks = self._place_images(x, start_pos, images) if images else None
        x = self._layers(x, [Segment(self._cache_for(slot), positions, 0, blocks)], cancel)
        x = rms_norm(x if all_logits else x[-1:], self.w["norm"], self.config.rms_norm_eps)
        logits = x @ self.embed.T
        return logits if all_logits else logits[0]

    @staticmethod
    def _place_images(x: F32, start_pos: int, images: Sequence[ImageSpan]) -> npt.NDArray[np.int64] | None:
        """Each span met by this forward's rows writes its soft tokens over their embeddings;
        returns which span each row is in (-1: text), or None when no span is met."""
        blocks = np.full(len(x), -1, np.int64)
        end = start_pos + len(x)
        for b, span in enumerate(images):
            if span.end <= start_pos or span.start >= end:
                continue
            if span.start < start_pos or span.end > end:
                raise ValueError(f"image span {span.start}..{span.end} cut by the forward {start_pos}..{end}")
            x[span.start - start_pos : span.end - start_pos] = span.embeddings
            blocks[span.start - start_pos : span.end - start_pos] = b
        return blocks if (blocks >= 0).any() else None

    def decode_batch(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> F32:
        """One token for each of B sequences (distinct slots) in one pass over the weights:
        every matrix multiplies all B rows at once, attention runs per sequence over its own
        cache. Logits (B, vocab). No pictures here: a picture's tokens are all prefill.

        A single row is padded to two. BLAS computes one row with a matrix-vector kernel whose
        sums differ in the last bits from its matrix-matrix kernel, and with at least two rows
        each row's result does not depend on the other rows — so a sequence's logits are the
        same bits whoever shares its step (tests/test_batching.py). The price: with few rows the
        matrix-matrix kernel costs ~2x a matrix-vector pass (it packs the weights), so a backend
        of two slots or fewer decodes row by row instead (backends/cpu.py ROW_BY_ROW_SLOTS)."""
        if len(set(slots)) != len(slots):
            raise ValueError(f"a batched step feeds each slot once, got slots {list(slots)}")
        pad = len(tokens) == 1
        ids = np.asarray(list(tokens) * 2 if pad else list(tokens), dtype=np.int64)
        segments = [
            Segment(self._cache_for(s), np.array([p], np.int64), i) for i, (s, p) in enumerate(zip(slots, positions))
        ]
        x = self._layers(self.embed[ids] * self.embed_scale, segments, None)
        logits = rms_norm(x, self.w["norm"], self.config.rms_norm_eps) @ self.embed.T
        return logits[:1] if pad else logits

    def _cache_for(self, slot: int) -> KVCache:
        return self.cache if slot == 0 else self.caches[slot]

    def _layers(self, x: F32, segments: list[Segment], cancel: Callable[[], bool] | None) -> F32:
        """The decoder layers over the rows of `x` (embeddings); each segment is one sequence's
        run of rows. Rows past the segments (padding) ride along in the matrix products and are
        never attended or written."""
        for layer in range(self.config.num_layers):
            if cancel is not None and cancel():
                raise CancelledError("stopped")
            x = self._block(layer, x, segments)
        return x

    def _block(self, layer: int, x: F32, segments: list[Segment]) -> F32:
        cfg, p = self.config, f"layers.{layer}."
        h = rms_norm(x, self.w[p + "input_layernorm"], cfg.rms_norm_eps)
        attn = self._attention(layer, h, segments)
        x = x + rms_norm(attn, self.w[p + "post_attention_layernorm"], cfg.rms_norm_eps)
        h = rms_norm(x, self.w[p + "pre_feedforward_layernorm"], cfg.rms_norm_eps)
        mlp = gelu_tanh(self.linear(h, p + "mlp.gate_proj")) * self.linear(h, p + "mlp.up_proj")
        return x + rms_norm(
            self.linear(mlp, p + "mlp.down_proj"), self.w[p + "post_feedforward_layernorm"], cfg.rms_norm_eps
        )

    def _attention(self, layer: int, h: F32, segments: list[Segment]) -> F32:
        cfg, p, n = self.config, f"layers.{layer}.self_attn.", len(h)
        q = self.linear(h, p + "q_proj").reshape(n, cfg.num_heads, cfg.head_dim)
        k = self.linear(h, p + "k_proj").reshape(n, cfg.num_kv_heads, cfg.head_dim)
        v = self.linear(h, p + "v_proj").reshape(n, cfg.num_kv_heads, cfg.head_dim)
        q = rms_norm(q, self.w[p + "q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, self.w[p + "k_norm"], cfg.rms_norm_eps)
        out = np.zeros((n, cfg.q_dim), np.float32)
        for cache, positions, first, blocks in segments:
            rows = slice(first, first + len(positions))
            out[rows] = self._attend(layer, cache, positions, q[rows], k[rows], v[rows], blocks)
        return self.linear(out, p + "o_proj")

    def _attend(
        self,
        layer: int,
        cache: KVCache,
        positions: npt.NDArray[np.int64],
        q: F32,
        k: F32,
        v: F32,
        blocks: npt.NDArray[np.int64] | None,
    ) -> F32:
        """One sequence's attention over its own cache (RoPE applied here), its K/V written;
        `blocks` (the segment's) lets a picture's tokens see each other both ways."""
        cfg, n = self.config, len(positions)
        is_global = cfg.is_global_layer(layer)
        cos, sin = self.rope["global" if is_global else "local"]
        q = apply_rope(q, cos[positions], sin[positions])
        k = apply_rope(k, cos[positions], sin[positions])

        # Keys visible to this chunk: earlier positions still in the cache, then the chunk itself.
        # Read them before writing the chunk, so a chunk longer than the ring cannot overwrite
        # keys that its own first queries still need.
        held = cache.positions[layer]
        window = None if is_global else cfg.sliding_window
        keep = (held >= 0) & (held < positions[0])
        if window is not None:
            keep &= held > positions[0] - window
        order = np.argsort(held[keep])
        key_pos = np.concatenate([held[keep][order], positions])
        keys = np.concatenate([cache.k[layer][keep][order], k])
        values = np.concatenate([cache.v[layer][keep][order], v])
        cache.write(layer, positions[-len(held) :], k[-len(held) :], v[-len(held) :])

        mask = key_pos[None, :] <= positions[:, None]
        if blocks is not None:  # a picture's tokens see each other both ways
            key_blocks = np.concatenate([np.full(len(key_pos) - n, -1, np.int64), blocks])
            mask |= (blocks[:, None] >= 0) & (blocks[:, None] == key_blocks[None, :])
        if window is not None:
            mask &= key_pos[None, :] > positions[:, None] - window
        # batched matrix products (BLAS), each kv head once for its group of query heads: head h
        # reads kv head h // group. (np.einsum's unoptimized loops made this half a turn's
        # prefill once a conversation held several hundred tokens.)
        hkv, group, d = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, q.shape[-1]
        qg = q.reshape(n, hkv, group, d).transpose(1, 2, 0, 3).reshape(hkv, group * n, d)
        scores = (qg @ keys.transpose(1, 2, 0)).reshape(hkv * group, n, len(key_pos))
        scores *= np.float32(cfg.attn_scale)
        scores = np.where(mask[None], scores, np.float32(-np.inf))
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = probs.reshape(hkv, group * n, len(key_pos)) @ values.transpose(1, 0, 2)  # [hkv, group*n, d]
        return cast(F32, out.reshape(hkv, group, n, d).transpose(2, 0, 1, 3).reshape(n, cfg.q_dim))

    def reset(self) -> None:
        for cache in [self.cache, *self.caches[1:]]:
            for held in cache.positions:
                held[:] = -1
