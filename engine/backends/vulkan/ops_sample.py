"""Sampling on the GPU (shaders/sample.comp); the id lands in the token buffer.

greedy:  argmax                                  (1 dispatch)
sampled: [penalty -> barrier ->] top-k           (1 dispatch, 2 with the penalty; temperature,
         top-k <= KC, top-p over the K, min-p, Philox RNG keyed by step.seed and the drawn
         token's position)
Each sampler dispatch reduces blocks of BLOCK logits to candidates; the last block to finish
(an arrival counter) does the final pass. Both write tokens[step.pos + step.n_tokens (+ d)] and,
with advance, set step.pos to that position and step.n_tokens to 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.memory import Binding
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList

BLOCK = 1024
KC = 64  # the largest top_k served on the GPU; top_k = 0 means KC


def scratch_bytes(vocab: int, block: int = BLOCK, kc: int = KC) -> int:
    """Size of the candidate buffer (enough for either path)."""
    return -(-vocab // block) * kc * 8


def sample(
    cl: CommandList,
    dev: Device,
    step: Binding,
    logits: Binding,
    cand: Binding,
    counters: Binding,
    tokens: Binding,
    *,
    vocab: int,
    greedy: bool,
    penalty: bool = False,
    n_draws: int = 1,
    advance: bool = True,
    wg: int = 256,
    block: int = BLOCK,
    kc: int = KC,
) -> None:
    """Draw n_draws ids from `logits` into `tokens`. cand: scratch_bytes(vocab) bytes; counters:
    one uint32, 0 (the kernel leaves it 0 again, so a recording replays as is)."""
    n_blocks = -(-vocab // block)
    if n_blocks > 1024:
        raise ValueError("sample: vocab / BLOCK must be <= 1024")
    if block > 1024 or block & (block - 1):
        raise ValueError("sample: BLOCK must be a power of 2 <= 1024")
    spec = dict(WG=wg, BLOCK=block, KC=kc)
    p = dev.pipeline("sample_argmax_f32" if greedy else "sample_topk_f32", **spec)
    push = p.push.pack(vocab=vocab, n_blocks=n_blocks, n_draws=n_draws, advance=int(advance))
    if penalty:
        pen = dev.pipeline("sample_penalty_f32", **spec)
        cl.dispatch(pen, [step, logits, tokens], groups=(1, 1, 1), push=push)
        cl.barrier()
    cl.dispatch(p, [step, logits, cand, tokens, counters], groups=(n_blocks, 1, 1), push=push)
