"""The last real token's row moved to row 0 (shaders/last_row.comp), where the LM head of a
recorded prefill reads it: a chunk may run in a recording made for more tokens (a bucket), so
the row to read is known only from the step buffer's n_tokens at replay."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.memory import Binding
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList


def last_row_to_front(
    cl: CommandList, dev: Device, step: Binding, rows: Binding, *, row_bytes: int, wg: int = 256
) -> None:
    """rows[0] = rows[step.n_tokens - 1] for rows of `row_bytes` (a multiple of 4) each."""
    if row_bytes % 4:
        raise ValueError(f"last_row_to_front: rows of {row_bytes} bytes are not whole 32-bit words")
    words = row_bytes // 4
    p = dev.pipeline("last_row_u32", WG=wg)
    cl.dispatch(p, [step, rows], groups=(-(-words // wg), 1, 1), push=p.push.pack(row_words=words))
