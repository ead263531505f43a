"""The contract every compute backend (cpu, vulkan, npu-hybrid) fulfils.

A backend owns the weights on its device and the KV cache. The generation loop only sees:
`forward` (prefill a chunk or decode one token, returning logits) and, where the backend can
keep the whole token step on the device, `decode_tokens` (sampling on the device, ids back).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence

import numpy as np

from engine.config import ModelConfig
from engine.sampling import SamplingParams


class Backend(ABC):
    name: str = "?"
    device_name: str = "?"

    def __init__(self, config: ModelConfig, context_length: int):
        self.config = config
        self.context_length = context_length

    @abstractmethod
    def forward(self, token_ids: Sequence[int], start_pos: int, *, all_logits: bool = False) -> np.ndarray:
        """Run `token_ids` at positions start_pos.. (filling the KV cache there).

        Returns float32 logits: shape (vocab,) for the last token, or (n, vocab) with all_logits.
        Positions ≥ start_pos + n are forgotten, so rolling back is just a smaller start_pos.
        """

    def decode_tokens(self, first_token: int, start_pos: int, params: SamplingParams,
                      max_tokens: int) -> Iterator[int] | None:
        """Device-resident decode: feed `first_token` at `start_pos`, sample on the device, yield ids.

        Returns None when this backend cannot do it for these params (the caller then samples
        on the CPU from `forward` logits). The consumer stops by closing the generator.
        """
        return None

    def stats(self) -> dict:
        """Backend-specific numbers (busy fraction, memory) for gauges and benchmarks."""
        return {}

    def close(self) -> None:
        pass
