"""Where pictures sit in a prompt (`ImageSpan`), and how prefix reuse tells them apart.

For prefix reuse the placeholders of one picture carry a key derived from its hash
(`cache_keys`), so a cached prompt is never mistaken for another with a different picture at
the same place (every picture's placeholders have the same token id)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class ImageSpan:
    """One picture in the prompt: its soft tokens fill positions start .. start + len - 1."""

    start: int
    embeddings: npt.NDArray[np.float32]  # [tokens, text width]
    key: str  # the encoder's cache key (SHA-256 of the pixel values)

    @property
    def end(self) -> int:
        return self.start + len(self.embeddings)


def cache_keys(ids: Sequence[int], spans: Sequence[ImageSpan]) -> list[int]:
    """`ids` with each span's positions replaced by a negative key from its picture's hash."""
    keyed = list(ids)
    for span in spans:
        key = -1 - int(span.key[:15], 16)
        keyed[span.start : span.end] = [key] * (span.end - span.start)
    return keyed


def span_containing(spans: Sequence[ImageSpan], pos: int) -> ImageSpan | None:
    return next((s for s in spans if s.start < pos < s.end), None)
