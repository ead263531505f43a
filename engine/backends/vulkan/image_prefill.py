"""A prompt's pictures in the Vulkan text prefill: what one chunk's recorded forward reads to put
the soft tokens in place and let a picture's tokens see each other (gemma3_graph.py records the
reads when a chunk holds a picture).

Three host-mapped buffers of one prefill chunk's rows, written before each submission:
`flags` (u32 per token: 1 where a picture's soft token replaces the placeholder's embedding,
unscaled, after the embedding dispatch: ops_vision.overlay), `rows` (f32 [tokens][hidden], the
soft tokens) and `vis` (u32 per token: the last position the token's query sees — its own, or
its picture's last: attention_prefill.comp's ATTN_SPANS mask, (kp <= vis) AND the window's lower
bound, as transformers composes it). A chunk never cuts a picture (base.image_chunks), so its
later tokens' keys are in the cache when the attention runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.memory import Buffer
    from phoenix_chat.engine.vision.spans import ImageSpan


class ImageRows:
    """The picture inputs of up to `capacity` tokens of one forward."""

    def __init__(self, dev: Device, capacity: int, hidden: int) -> None:
        self.capacity, self.hidden = capacity, hidden
        self.flags: Buffer = dev.buffer(4 * capacity, host=True, name="image_flags")
        self.rows: Buffer = dev.buffer(4 * capacity * hidden, host=True, name="image_rows")
        self.vis: Buffer = dev.buffer(4 * capacity, host=True, name="image_vis")

    @property
    def nbytes(self) -> int:
        return self.flags.size + self.rows.size + self.vis.size

    def write(self, pos0: int, n: int, spans: Sequence[ImageSpan], recorded: int = 0) -> bool:
        """Fill the rows of positions pos0 .. pos0 + n - 1; False: no picture among them (the
        chunk can take the text-only recording). recorded: the rows of the recording that runs
        (a bucket, at least n): those past n get no overlay either."""
        recorded = max(recorded, n)
        if recorded > self.capacity:
            raise ValueError(
                f"a forward of {recorded} tokens holding a picture exceeds the {self.capacity} rows of its buffers"
            )
        self.flags.view(np.uint32, recorded)[:] = 0
        flags = self.flags.view(np.uint32, n)
        vis = self.vis.view(np.uint32, n)
        vis[:] = np.arange(pos0, pos0 + n, dtype=np.uint32)
        end = pos0 + n
        pictured = False
        for span in spans:
            if span.end <= pos0 or span.start >= end:
                continue
            if span.start < pos0 or span.end > end:
                raise ValueError(f"image span {span.start}..{span.end} cut by the forward {pos0}..{end}")
            emb = np.asarray(span.embeddings, np.float32)
            if emb.ndim != 2 or emb.shape[1] != self.hidden:
                raise ValueError(f"soft tokens of shape {emb.shape}, the text model's width is {self.hidden}")
            a, b = span.start - pos0, span.end - pos0
            flags[a:b] = 1
            vis[a:b] = span.end - 1
            self.rows.view(np.float32, (b - a) * self.hidden, 4 * a * self.hidden)[:] = emb.reshape(-1)
            pictured = True
        return pictured

    def destroy(self) -> None:
        for b in (self.flags, self.rows, self.vis):
            b.destroy()
