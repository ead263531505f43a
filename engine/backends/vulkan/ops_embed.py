"""Embedding lookup (shaders/embed.comp): ids from the token buffer at step.pos, rows dequantized."""

from __future__ import annotations

from phoenix_chat.engine.backends.vulkan.ops_table import EMBED_TYPES


def embed(
    cl, dev, step, tokens, table, out, *, wtype: str, hidden: int, scale: float, max_tokens: int = 1, wg: int = 256
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
