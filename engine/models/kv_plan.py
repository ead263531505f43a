"""How many K/V slots each layer keeps: the one rule every backend's cache follows.

Global layers keep every position. A sliding-window layer keeps a ring of the window plus
`forward_tokens`, the most positions one forward pass writes: a backend that writes a chunk's
K/V before attending (Vulkan) still has the window behind the chunk's first query, and a
speculative verify pass (draft + 1 positions, at most one chunk) can be rolled back without
losing a key the next pass still needs (engine/speculative.py).
"""

from __future__ import annotations

from phoenix_chat.engine.config import ModelConfig


def ring_slots(config: ModelConfig, context_length: int, forward_tokens: int) -> int:
    """Slots of a sliding-window layer's ring: the window plus one forward's positions."""
    return min(context_length, config.sliding_window + forward_tokens)


def layer_slots(config: ModelConfig, context_length: int, forward_tokens: int) -> list[int]:
    """K/V slots per layer: the whole context on global layers, the ring on the others."""
    ring = ring_slots(config, context_length, forward_tokens)
    return [context_length if config.is_global_layer(i) else ring for i in range(config.num_layers)]
