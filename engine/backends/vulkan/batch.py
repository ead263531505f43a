"""The batched decode step: B sequences, each in its own KV slot at its own position, advance one
token in one pass over every weight matrix (engine/scheduler.py drives it through
`VulkanBackend.decode_batch` / `decode_batch_sampled`).

The matrices run as a forward of B token rows (the int8 or f32 multi-column matvecs or the GEMMs,
whichever the load-time timing chose for B tokens, as for a prefill chunk; `stats()["few_token_paths"]`
says which ran); the work that depends on a
sequence reads its row's Step in `BatchRows.steps` (slot, position, seed, sampling values):
QK-norm + RoPE + KV write into its slot at its position and decode attention over its slot up
to its position are one dispatch each for all rows (the `_rows` kernels: a workgroup index is
the row), and so is each sampler the rows need (argmax, top-k, full), over every row: a row draws
in the one its Step selects and the others' workgroups of that row return at once, each row with
its own logits and sampler scratch; the embedding and the repetition penalty are one dispatch per
row. The sampler draws with the row's seed and the Philox counter
of the drawn token's position, so a sequence's ids do not depend on who shares the step. One
barrier separates each phase.

Recorded once per (bucket, set of samplers) and replayed: the host writes the rows' Steps and
submits, so a batch whose rows move between greedy and sampled requests replays one recording
(keyed by the split of its rows between the samplers, it was recorded again inside the
scheduler's step whenever the split moved). A bucket is a power of two; its unused rows carry
n_tokens 0 (the embedding, the KV write and every sampler skip them), so they change no slot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, TypeAlias

import numpy as np

from phoenix_chat.engine.backends.vulkan import ops_attention, ops_embed, ops_norm, ops_sample
from phoenix_chat.engine.backends.vulkan.gemma3_graph import Gemma3Graph
from phoenix_chat.engine.backends.vulkan.memory import Binding, Buffer
from phoenix_chat.engine.backends.vulkan.ops_common import STEP_BYTES
from phoenix_chat.engine.backends.vulkan.plan import batch_buckets, batch_logits_stride
from phoenix_chat.engine.backends.vulkan.profiling import mark
from phoenix_chat.engine.backends.vulkan.recorder import CommandList
from phoenix_chat.engine.backends.vulkan.resident import BatchRows

# what a recorded batched step leaves: every row's logits, or every row's sampled id in `tokens`
BatchMode: TypeAlias = Literal["logits", "sample"]
# the samplers a step's rows draw with, in SAMPLER_ORDER, each once: ("argmax",), ("argmax", "topk"), ...
SamplerSet: TypeAlias = tuple[ops_sample.SamplerKind, ...]
SAMPLER_ORDER: SamplerSet = ("argmax", "topk", "full")


def sampler_set(kinds: Sequence[ops_sample.SamplerKind]) -> SamplerSet:
    """The samplers a step of rows with these kinds records (ops_sample.sampler_for's), in order."""
    return tuple(k for k in SAMPLER_ORDER if k in kinds)


def bucket_for(n: int, max_rows: int) -> int:
    """The smallest recorded batch size holding n sequences: a bucket, or max_rows itself (the
    backend's slots, where they are fewer than the next bucket: its per-row scratch ends there)."""
    if not 2 <= n <= max_rows:
        raise ValueError(f"a batched step holds 2..{max_rows} sequences, not {n}")
    return min(b for b in batch_buckets(max_rows) if b >= n)


# a bigger bucket runs a batch only when its step timed at least this much faster (the pad rows
# still sample and read their row of logits)
PROMOTE_MARGIN = 0.97


def fastest_bucket(n: int, max_rows: int, step_us: Mapping[int, float]) -> int:
    """The recorded batch size n sequences run in: `bucket_for`'s, or a bigger bucket whose whole
    step timed faster at load (`step_us`: GPU µs per step by bucket; on the H100 the 27B's
    8-row step, on the int8 matvecs, took 21.7 ms and its 16-row one, on the GEMMs, 19.8)."""
    best = bucket_for(n, max_rows)
    if best not in step_us:
        return best
    for b in sorted(b for b in step_us if b > best):
        if step_us[b] < PROMOTE_MARGIN * step_us[best]:
            best = b
    return best


def record_batch(
    graph: Gemma3Graph,
    rows: BatchRows,
    B: int,
    mode: BatchMode,
    samplers: SamplerSet = (),
    penalty: bool = False,
    profile: bool = False,
) -> CommandList:
    """One decode step of B rows. mode 'sample': each sampler of `samplers` over every row, a row
    drawing in the one its Step's settings select (ops_sample.sampler_for; shaders/sample.comp);
    penalty: every row's repetition penalty first (a no-op where its rep_penalty is 1).
    profile: a timestamp at every barrier (profiling.profile_batch), never replayed by the engine."""
    cfg, dev, b, w = graph.config, graph.dev, graph.buffers, graph.weights
    H, V, Q, qkv_dim = cfg.hidden_size, cfg.vocab_size, cfg.q_dim, graph.qkv_dim
    f = 4
    busy_ts = 2 if dev.caps.timestamp_bits else 0
    cl = dev.commands(name=f"decode_batch[{B},{mode}]", timestamps=(24 * cfg.num_layers + 32) if profile else busy_ts)
    if profile:
        cl.profile_labels = []
    if profile or busy_ts:
        cl.timestamp(0)

    def step(r: int) -> Binding:
        return (rows.steps, r * rows.step_stride, STEP_BYTES)

    def row(buf: Buffer, r: int, nbytes: int) -> Binding:
        return (buf, r * nbytes, nbytes)

    for r in range(B):
        ops_embed.embed(
            cl,
            dev,
            step(r),
            b.tokens,
            w.embed_table,
            row(b.x, r, H * f),
            wtype=w.embed_type.name,
            hidden=H,
            scale=float(np.float32(cfg.embed_scale)),
        )
    mark(cl, "embed")
    # where the matrices reading h take the int8 multi-column matvec, the norms writing h also
    # write its q8_1 blocks (hq: row r's at block r * H / 32), so those matvecs need no quantize
    # dispatch; the o-proj and down matvecs quantize their input in a dispatch of their own
    L0 = w.layers[0]
    int8_h = all(graph.few_token_path(m, B) == "int8" for m in (L0.qkv, [L0.gate, L0.up], [w.lm_head]))
    hq = b.hq if int8_h else None
    ops_norm.norm(cl, dev, b.x, L0.norms["input_layernorm"], b.h, rows=B, n=H, eps=cfg.rms_norm_eps, q=hq)
    for i, L in enumerate(w.layers):
        mark(cl, "norm")
        graph.mv(cl, L.qkv, b.h, b.qkv, T=B, x_cols=H, y_cols=qkv_dim, xq=hq, key="qkv")
        mark(cl, "qkv")
        graph.rope_kv(cl, i, B, step=rows.steps, rows=B)
        mark(cl, "rope_kv")
        ops_attention.attention_decode(
            cl,
            dev,
            rows.steps,
            b.qkv,
            L.k_cache,
            L.v_cache,
            rows.partial,
            rows.counters,
            b.attn,
            head_dim=cfg.head_dim,
            n_heads=cfg.num_heads,
            n_kv_heads=cfg.num_kv_heads,
            cache_slots=L.slots,
            window=0 if L.is_global else cfg.sliding_window,
            scale=cfg.attn_scale,
            n_splits=ops_attention.batch_splits(graph.n_splits, B, cfg.num_kv_heads),
            rows=B,
            q_row_stride=qkv_dim,
        )
        mark(cl, "attention")
        graph.mv(cl, [L.o], b.attn, b.o, T=B, x_cols=Q, y_cols=H, key="o")
        mark(cl, "o_proj")
        ops_norm.norm_add(
            cl,
            dev,
            b.o,
            L.norms["post_attention_layernorm"],
            b.x,
            L.norms["pre_feedforward_layernorm"],
            b.h,
            rows=B,
            n=H,
            eps=cfg.rms_norm_eps,
            q=hq,
        )
        mark(cl, "norm_add")
        graph.mv(
            cl,
            [L.gate, L.up],
            b.h,
            b.mlp,
            T=B,
            x_cols=H,
            y_cols=cfg.intermediate_size,
            epilogue="geglu",
            xq=hq,
            key="geglu",
        )
        mark(cl, "gate_up_geglu")
        graph.mv(cl, [L.down], b.mlp, b.o, T=B, x_cols=cfg.intermediate_size, y_cols=H, key="down")
        mark(cl, "down")
        nxt = w.layers[i + 1].norms["input_layernorm"] if i + 1 < len(w.layers) else w.final_norm
        ops_norm.norm_add(
            cl,
            dev,
            b.o,
            L.norms["post_feedforward_layernorm"],
            b.x,
            nxt,
            b.h,
            rows=B,
            n=H,
            eps=cfg.rms_norm_eps,
            q=hq,
        )
    mark(cl, "norm_add")
    Vs = batch_logits_stride(V)  # row r's logits at r * Vs floats
    graph.mv(cl, [w.lm_head], b.h, b.logits, T=B, x_cols=H, y_cols=Vs, xq=hq, key="lm")
    if mode == "sample":
        mark(cl, "lm_head")
        if penalty:
            for r in range(B):
                ops_sample.repetition_penalty(cl, dev, step(r), (b.logits, r * Vs * f, V * f), b.tokens, vocab=V)
            mark(cl, "penalty")
        if not samplers:
            raise ValueError("a sampled batched step needs its rows' samplers")
        # each sampler in one dispatch over every row (no barrier between: a row is written by
        # one of them only), each row with its own Step and scratch
        for kind in samplers:
            ops_sample.sample(
                cl,
                dev,
                (rows.steps, 0, B * rows.step_stride),
                (b.logits, 0, (B - 1) * Vs * f + V * f),
                (rows.cand, 0, B * rows.cand_stride),
                (rows.counters, 0, B * rows.counters_stride),
                b.tokens,
                vocab=V,
                greedy=kind == "argmax",
                full=kind == "full",
                rows=B,
                row_strides=(Vs * f, rows.cand_stride, rows.counters_stride),
            )
    if profile:  # close the last op: the sampler, or the LM head
        mark(cl, "sample" if mode == "sample" else "lm_head")
    elif busy_ts:
        cl.timestamp(1)
        cl.busy_timed = True
    return cl.end()
