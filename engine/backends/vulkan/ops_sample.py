"""Sampling on the GPU (shaders/sample.comp); the id lands in the token buffer.

greedy:  argmax                                  (1 dispatch)
sampled: [penalty -> barrier ->] top-k           (1 dispatch, 2 with the penalty; temperature,
         top-k <= KC, top-p over the K, min-p, Philox RNG keyed by step.seed and the drawn
         token's position)
         or, for every other top_k (0 = off, or > KC), `full`: the same cuts as thresholds
         found by bisection over each block's whole sorted list (shaders/sample.comp, SAMPLE_FULL)
`sampler_for(params)` says which of the three a setting needs: every setting has one.
Each sampler dispatch reduces blocks of BLOCK logits to candidates; the last block to finish
(an arrival counter) does the final pass. Both write tokens[step.pos + step.n_tokens (+ d)] and,
with advance, set step.pos to that position and step.n_tokens to 1 (a batched step's pad row,
n_tokens 0, stays put).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeAlias

from phoenix_chat.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.memory import Binding
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList

BLOCK = 1024  # logits per workgroup of the argmax and full samplers
KC = 64  # the largest top_k the top-k sampler serves; others (0 = off, > KC) take the full sampler
TOPK_KEYS = 4  # logits an invocation of the top-k sampler holds (RMAX in shaders/sample.comp)
TOPK_MAX_WG = 1024  # its widest workgroup: blocks of 4,096 logits
FULL_MAX_BLOCKS = 512  # the full sampler's shared arrays (NBMAX in shaders/sample.comp)

SamplerKind: TypeAlias = Literal["argmax", "topk", "full"]


def sampler_for(params: SamplingParams) -> SamplerKind:
    """The GPU sampler a setting runs on: argmax (greedy), top-k (1 <= top_k <= KC) or full."""
    if params.greedy:
        return "argmax"
    return "topk" if 1 <= params.top_k <= KC else "full"


def topk_shape(dev: Device) -> tuple[int, int]:
    """(WG, BLOCK) of the top-k sampler on `dev`: TOPK_KEYS logits an invocation, the widest
    workgroup the device runs up to TOPK_MAX_WG. Why wide: a block's fixed costs (its reductions,
    its arrival, its few barriers) outweighed its 1,024 logits; on an H100 32 rows of 262,144
    logits took 553 us in blocks of 1,024, 287 in blocks of 2,048 and 191 in blocks of 4,096."""
    wg = TOPK_MAX_WG
    while wg > 256 and wg > dev.caps.max_workgroup_invocations:
        wg //= 2
    return wg, TOPK_KEYS * wg


def scratch_bytes(vocab: int, block: int = BLOCK, kc: int = KC) -> int:
    """Size of the candidate buffer (enough for every sampler: the full one keeps every entry,
    8 bytes, and its running weight sum, 4)."""
    n_blocks = -(-vocab // block)
    return max(n_blocks * kc * 8, n_blocks * block * 12)


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
    full: bool = False,
    penalty: bool = False,
    n_draws: int = 1,
    advance: bool = True,
    wg: int | None = None,
    block: int | None = None,
    kc: int = KC,
    rows: int = 0,
    row_strides: tuple[int, int, int] = (0, 0, 0),
) -> None:
    """Draw n_draws ids from `logits` into `tokens`: the argmax (greedy), else the top-k sampler,
    or with `full` the sampler for every top_k. cand: scratch_bytes(vocab) bytes; counters: one
    uint32, 0 (the kernel leaves it 0 again, so a recording replays as is).
    rows > 0: that many rows of a batched step in one dispatch, each drawing here only where its
    Step's settings select this sampler (a pad row, n_tokens 0, nowhere): `step` binds
    their Steps (STEP_ROW_BYTES apart), and row r's logits, candidates and counter sit
    row_strides = (bytes of logits, of candidates, of counters) after row r - 1's: one dispatch
    and one recording entry for the rows, not one per row (no faster on the H100: a row's top-k
    costs the same GPU-wide throughput either way).
    wg / block: the workgroup and the logits it takes (None: 256 / BLOCK for argmax and full,
    `topk_shape` for top-k, whose blocks rank their best instead of sorting them)."""
    topk = not greedy and not full
    if wg is None or block is None:
        wg, block = topk_shape(dev) if topk else (256, BLOCK)
    n_blocks = -(-vocab // block)
    if n_blocks > 1024:
        raise ValueError("sample: vocab / BLOCK must be <= 1024")
    if block & (block - 1) or block > (TOPK_KEYS * wg if topk else 1024):
        raise ValueError(
            f"sample: BLOCK must be a power of 2 up to {TOPK_KEYS} x WG (top-k) or 1024 (argmax, full), not {block}"
        )
    if topk and block > 1024 and (wg < kc or wg % kc or block < wg):
        raise ValueError(f"sample: a top-k block of {block} needs a workgroup of a multiple of {kc} <= BLOCK, not {wg}")
    if full and not greedy and (n_blocks > FULL_MAX_BLOCKS or (block // wg) % 2):
        raise ValueError(
            f"sample: the GPU sampler for top_k 0 or > {kc} serves vocabularies up to "
            f"{FULL_MAX_BLOCKS * block} tokens with an even BLOCK / WG (vocab {vocab}, BLOCK {block}, WG {wg})"
        )
    spec = dict(WG=wg, BLOCK=block, KC=kc)
    name = "sample_argmax_f32" if greedy else ("sample_full_f32" if full else "sample_topk_f32")
    if rows:
        if penalty or n_draws != 1:
            raise ValueError("sample: a batched step's rows draw one id each, their penalties recorded before")
        lrow, crow, arow = row_strides
        if lrow % 4 or crow % 8 or arow % 4:
            raise ValueError(f"sample: row strides {row_strides} are not whole floats, entries and counters")
        name, spec = name + "_rows", {**spec, "LROW": lrow // 4, "CROW": crow // 8, "AROW": arow // 4}
    p = dev.pipeline(name, **spec)
    push = p.push.pack(vocab=vocab, n_blocks=n_blocks, n_draws=n_draws, advance=int(advance))
    if penalty:
        repetition_penalty(cl, dev, step, logits, tokens, vocab=vocab, wg=wg, block=block, kc=kc)
        cl.barrier()
    cl.dispatch(p, [step, logits, cand, tokens, counters], groups=(n_blocks, max(rows, 1), 1), push=push)


def repetition_penalty(
    cl: CommandList,
    dev: Device,
    step: Binding,
    logits: Binding,
    tokens: Binding,
    *,
    vocab: int,
    wg: int = 256,
    block: int = BLOCK,
    kc: int = KC,
) -> None:
    """The penalty pass `sample(penalty=True)` runs before its sampler (a no-op where the step's
    rep_penalty is 1): its own call so a batched step records every row's before one barrier."""
    pen = dev.pipeline("sample_penalty_f32", WG=wg, BLOCK=block, KC=kc)
    push = pen.push.pack(vocab=vocab, n_blocks=-(-vocab // block), n_draws=1, advance=1)
    cl.dispatch(pen, [step, logits, tokens], groups=(1, 1, 1), push=push)
