"""Embedding lookup (shaders/embed.comp): ids from the token buffer at step.pos, rows dequantized."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phoenix_chat.engine.backends.vulkan.ops_table import EMBED_TYPES

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.memory import Binding, Tensor
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList


def embed(
    cl: CommandList,
    dev: Device,
    step: Binding,
    tokens: Binding,
    table: Tensor,
    out: Binding,
    *,
    wtype: str,
    hidden: int,
    scale: float,
    max_tokens: int = 1,
    wg: int = 256,
) -> None:
    """out[t] = table[tokens[step.pos + t]] * scale for t < step.n_tokens.

    `table` is a memory.Tensor (one dispatch per bound row range; they never conflict).
    """
    wt = wtype.upper()
    if wt not in EMBED_TYPES:
        raise ValueError(f"embed: weight type {wtype} unsupported (have {', '.join(EMBED_TYPES)})")
    p = dev.pipeline(f"embed_{wt.lower()}_f32", WG=wg)
    for r in table.ranges:
        push = p.push.pack(hidden=hidden, row_start=r.row_start, rows=r.rows, row_bytes=table.row_bytes, scale=scale)
        cl.dispatch(p, [step, tokens, r.binding, out], groups=(max_tokens, 1, 1), push=push)
