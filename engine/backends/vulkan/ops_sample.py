"""Sampling on the GPU (shaders/sample.comp); the id lands in the token buffer.

greedy:  argmax block pass -> barrier -> argmax final         (2 dispatches)
sampled: [penalty ->] top-k block pass -> barrier -> top-k final (temperature, top-k <= KC,
         top-p over the K, min-p, Philox RNG keyed by step.seed and the drawn token's position)
Both write tokens[step.pos + step.n_tokens (+ d)] and, with advance, set step.pos to that
position and step.n_tokens to 1.
"""
from __future__ import annotations

BLOCK = 1024
KC = 64           # the largest top_k served on the GPU; top_k = 0 means KC


def scratch_bytes(vocab: int, block: int = BLOCK, kc: int = KC) -> int:
    """Size of the candidate buffer (enough for either path)."""
    return -(-vocab // block) * kc * 8


def sample(cl, dev, step, logits, cand, tokens, *, vocab: int, greedy: bool, penalty: bool = False,
           n_draws: int = 1, advance: bool = True, wg: int = 256, block: int = BLOCK, kc: int = KC) -> None:
    n_blocks = -(-vocab // block)
    if n_blocks > 1024:
        raise ValueError("sample: vocab / BLOCK must be <= 1024")
    spec = dict(WG=wg, BLOCK=block, KC=kc)
    kind = "argmax" if greedy else "topk"
    blk = dev.pipeline(f"sample_{kind}_block_f32", **spec)
    fin = dev.pipeline(f"sample_{kind}_final", **spec)
    push = blk.push.pack(vocab=vocab, n_blocks=n_blocks, n_draws=n_draws, advance=int(advance))
    if penalty:
        pen = dev.pipeline("sample_penalty_f32", **spec)
        cl.dispatch(pen, [step, logits, tokens], groups=(1, 1, 1), push=push)
        cl.barrier()
    cl.dispatch(blk, [logits, cand], groups=(n_blocks, 1, 1), push=push)
    cl.barrier()
    cl.dispatch(fin, [step, cand, tokens], groups=(1, 1, 1), push=push)
