"""Attention dispatches (shaders/attention.comp, attention_prefill.comp) over the f16 KV cache.

Decode: `attention_decode` is one dispatch (n_splits x n_kv_heads workgroups): each workgroup
scores a split of the positions, writes its partial (o, m, l), and the last workgroup of each kv
head to finish (an arrival counter) combines the splits into the output rows. The split count is
fixed at record time; the visible positions (step.pos and the window) are read at run time, so
one recording serves every position. With `q`, the combining workgroups also write the q8_1
blocks of the output rows (`attention_decode_f16_f32_q8_1`), bit-identical to
`matvec.record_quantize` of `out`, so an int8 o-proj matvec needs no quantize dispatch.

Prefill: `attention_prefill` runs a chunk's queries against the cache, on matrix cores
(attention_prefill_coopmat.comp: S = Q K^T and O += P V as 16x16x16 f16 -> f32 cooperative
matrices, the online softmax in f32) where `prefill_kernel(dev, head_dim)` says "coopmat", else
the scalar f32 kernel (attention_prefill.comp). PHOENIX_VULKAN_ATTN_COOPMAT=0 forces the scalar
one (for comparisons); `prefill_path` is what the backend reports in stats()["prefill_attention"].
Where a chunk's query blocks are too few to fill the GPU (the 4B's 512-token chunk: 64
workgroups), `prefill_splits` splits each block's keys between several workgroups, whose partial
records attention_prefill_combine.comp merges (flash-decoding's split, for prefill).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from phoenix_chat.engine.backends.vulkan.ops_table import ATTN_CM_HEAD_DIMS

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.memory import Binding
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList


def partial_floats(n_heads: int, head_dim: int, n_splits: int) -> int:
    """Size (in floats) of the scratch buffer of per-split partials: (o[head_dim], m, l, pad, pad)."""
    return n_heads * n_splits * (head_dim + 4)


def counter_words(n_kv_heads: int) -> int:
    """Arrival counters (uint32) attention_decode needs: one per kv head, zeroed once at allocation."""
    return n_kv_heads


def default_splits(max_positions: int, n_kv_heads: int = 1) -> int:
    """Split count for a cache of `max_positions`: one split per 16 positions (a split walks its
    chunk serially: at a 648-position cache, 16 per split decoded the 270M shape 19% faster on
    an H100 than 64, and the 27B shape 4% faster), at most ~128 workgroups' worth per layer."""
    want = min(128, max(32, 1024 // max(1, n_kv_heads)))
    return max(1, min(want, -(-max_positions // 16)))


# a batched decode step's attention (rows x kv heads x splits workgroups) aims at about this many
# workgroups: with the single stream's splits, 32 rows of the 27B were 16,384 workgroups of a few
# positions each, 7.6 ms of a 36.9 ms step on an H100 (bench.batched_decode --profile)
BATCH_TARGET_GROUPS = 1024


def batch_splits(n_splits: int, rows: int, n_kv_heads: int) -> int:
    """Splits of the context for a batched decode step of `rows` rows: a power of two giving
    about BATCH_TARGET_GROUPS workgroups, at most the single stream's n_splits (the scratch's
    size) and at least 1. PHOENIX_VULKAN_BATCH_ATTN_SPLITS=N forces N (capped the same way),
    for comparisons."""
    forced = os.environ.get("PHOENIX_VULKAN_BATCH_ATTN_SPLITS")
    if forced:
        if not forced.isdigit() or not 1 <= int(forced) <= 256:
            raise ValueError(f"PHOENIX_VULKAN_BATCH_ATTN_SPLITS={forced!r}: a number from 1 to 256")
        return min(n_splits, int(forced))
    want = max(1, BATCH_TARGET_GROUPS // max(1, rows * n_kv_heads))
    return min(n_splits, 1 << (want.bit_length() - 1))


def attention_decode(
    cl: CommandList,
    dev: Device,
    step: Binding,
    query: Binding,
    k_cache: Binding,
    v_cache: Binding,
    partial: Binding,
    counters: Binding,
    out: Binding,
    *,
    head_dim: int,
    n_heads: int,
    n_kv_heads: int,
    cache_slots: int,
    window: int,
    scale: float,
    n_splits: int,
    q_offset: int = 0,
    q: Binding | None = None,
    wg: int = 128,
    rows: int = 0,
    q_row_stride: int = 0,
) -> None:
    """out[h*D:(h+1)*D] = softmax(q_h K^T * scale) V over positions visible from step.pos
    (q_h: row h of `query`, from q_offset). partial: partial_floats(...) * 4 bytes of scratch;
    counters: counter_words(n_kv_heads) uint32s, all 0 (the kernel leaves them 0 again, so a
    recording replays as is). q: None, or q8_1_bytes(n_heads * head_dim) bytes that receive the
    q8_1 blocks of out (the layout matvec.record_quantize writes).
    rows > 0: a batched decode step (batch.py): `step` binds that many Step rows, row r's query at
    q_offset + r * q_row_stride floats; partial, counters and out hold `rows` times as much,
    row after row."""
    if head_dim % 64 or head_dim > 2 * wg:
        raise ValueError(f"attention_decode: head_dim {head_dim} unsupported (multiple of 64, <= 2*WG)")
    if n_heads % n_kv_heads or n_heads // n_kv_heads > 8:
        raise ValueError("attention_decode: n_heads must be n_kv_heads * G with G <= 8")
    if not 1 <= n_splits <= 256:
        raise ValueError("attention_decode: 1 <= n_splits <= 256")
    name, binds = "attention_decode_f16_f32", [step, query, k_cache, v_cache, partial, counters, out]
    spec = dict(WG=wg, HD=head_dim, G=n_heads // n_kv_heads)
    if q is not None:
        assert not rows, "attention_decode: no q8_1 output for a batched step"
        name, binds = name + "_q8_1", binds + [q]
    elif rows:
        name, spec = name + "_rows", {**spec, "QROW": q_row_stride}
    p = dev.pipeline(name, **spec)
    push = p.push.pack(
        head_dim=head_dim,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        q_offset=q_offset,
        cache_slots=cache_slots,
        window=window,
        scale=scale,
        n_splits=n_splits,
    )
    cl.dispatch(p, binds, groups=(n_splits, n_kv_heads, max(rows, 1)), push=push)


CM_ROWS = 64  # attention_prefill_coopmat.comp: query rows (tokens x heads of one kv head) per workgroup
CM_SUBGROUPS = 8
CM_MAX_GW = 8  # query heads of one kv head per workgroup, at most (so at least 8 tokens a block)
MAX_PREFILL_SPLITS = 8  # attention_prefill_combine.comp's weights array
# a dispatch of fewer query blocks than this splits their keys to reach it: about one workgroup per
# SM of an H100 (132; one coopmat workgroup fits an SM): 2 ways beat 4 on the 4B, 4 beat 8 on the 270M
SPLIT_TARGET_GROUPS = 128
ATTN_SPLIT_BYTES = 32 << 20  # the partial records' scratch (device.scratch), one size for every model


def cm_shared_bytes(head_dim: int) -> int:
    """Shared memory attention_prefill_coopmat.comp declares for `head_dim` (its arrays: one K/V
    tile of BC keys in f16, S in f32 and P in f16 for 64 rows, a float per row)."""
    bc = ATTN_CM_HEAD_DIMS[head_dim]
    return bc * (head_dim + 8) * 2 + CM_ROWS * (bc + 4) * 4 + CM_ROWS * (bc + 8) * 2 + CM_ROWS * 4


def prefill_refusal(dev: Device, head_dim: int) -> str | None:
    """Why the prefill attention does not run on matrix cores here (None: it does)."""
    c = dev.caps
    if not c.cooperative_matrix:
        return c.refused.get("cooperative_matrix_f16", "no cooperative matrices")
    if os.environ.get("PHOENIX_VULKAN_ATTN_COOPMAT", "1") == "0":
        return "disabled by PHOENIX_VULKAN_ATTN_COOPMAT=0"
    if head_dim not in ATTN_CM_HEAD_DIMS:
        return f"head_dim {head_dim}: the coopmat kernel is built for {sorted(ATTN_CM_HEAD_DIMS)}"
    if CM_SUBGROUPS * c.subgroup_size > c.max_workgroup_invocations:
        return (
            f"{CM_SUBGROUPS} subgroups of {c.subgroup_size} exceed maxComputeWorkGroupInvocations "
            f"{c.max_workgroup_invocations}"
        )
    if c.subgroup_size < 8:
        return f"subgroup size {c.subgroup_size} (the softmax needs 8 x subgroup size >= 64 threads)"
    need = cm_shared_bytes(head_dim)
    if c.shared_memory < need:
        return f"{c.shared_memory} B of shared memory, the coopmat attention needs {need} B at head_dim {head_dim}"
    return None


def split_record_bytes(max_tokens: int, n_heads: int, head_dim: int, splits: int) -> int:
    """Bytes of a split prefill attention's partial records: (head_dim + 4) floats per split,
    token and head."""
    return max_tokens * n_heads * splits * (head_dim + 4) * 4


def prefill_splits(max_tokens: int, n_heads: int, n_kv_heads: int, head_dim: int) -> int:
    """How many workgroups share each query block's keys (1: no split). A chunk of fewer than
    SPLIT_TARGET_GROUPS blocks is split up to that count, as far as the records fit
    ATTN_SPLIT_BYTES. PHOENIX_VULKAN_ATTN_SPLITS=N (1..8) forces N, for comparisons."""
    forced = os.environ.get("PHOENIX_VULKAN_ATTN_SPLITS")
    if forced:
        if not forced.isdigit() or not 1 <= int(forced) <= MAX_PREFILL_SPLITS:
            raise ValueError(f"PHOENIX_VULKAN_ATTN_SPLITS={forced!r}: a number from 1 to {MAX_PREFILL_SPLITS}")
        want = int(forced)
    else:
        blocks, head_groups = query_blocks(max_tokens, n_heads, n_kv_heads)
        want = min(MAX_PREFILL_SPLITS, -(-SPLIT_TARGET_GROUPS // (blocks * head_groups)))
    while want > 1 and split_record_bytes(max_tokens, n_heads, head_dim, want) > ATTN_SPLIT_BYTES:
        want -= 1
    return want


def split_scratch_bytes(dev: Device, head_dim: int) -> int:
    """Device memory the split prefill attention's records may take here (allocated on first use):
    ATTN_SPLIT_BYTES where the coopmat kernel runs, else 0 — for the memory plan."""
    return ATTN_SPLIT_BYTES if prefill_refusal(dev, head_dim) is None else 0


def prefill_kernel(dev: Device, head_dim: int) -> str:
    """The prefill attention kernel a device gets for `head_dim`: "coopmat" or "scalar"."""
    return "coopmat" if prefill_refusal(dev, head_dim) is None else "scalar"


def prefill_path(dev: Device, head_dim: int, splits: int = 1) -> str:
    """The prefill attention path in words (with the key split of a chunk, `prefill_splits`),
    with the reason where it is the scalar kernel."""
    why = prefill_refusal(dev, head_dim)
    if why is not None:
        return f"scalar f32 ({why})"
    return "coopmat f16 x f16 -> f32 (flash)" + (f", keys split {splits} ways" if splits > 1 else "")


def heads_per_group(n_heads: int, n_kv_heads: int) -> int:
    """Query heads a coopmat workgroup takes (all of one kv head's where they fit): the largest
    power of two <= CM_MAX_GW dividing n_heads / n_kv_heads."""
    g, gw = n_heads // n_kv_heads, 1
    while gw * 2 <= CM_MAX_GW and g % (gw * 2) == 0:
        gw *= 2
    return gw


def query_blocks(max_tokens: int, n_heads: int, n_kv_heads: int) -> tuple[int, int]:
    """The coopmat kernel's workgroups per key run: (blocks of CM_ROWS / GW tokens, head groups of
    GW query heads), GW = heads_per_group."""
    gw = heads_per_group(n_heads, n_kv_heads)
    return -(-max_tokens // (CM_ROWS // gw)), n_heads // gw


def combine_splits(
    cl: CommandList,
    dev: Device,
    step: Binding,
    records: Binding,
    out: Binding,
    *,
    head_dim: int,
    n_heads: int,
    splits: int,
    max_tokens: int,
) -> None:
    """out[t][h] = the merge of the `splits` partial records of (token t < step.n_tokens, head h)
    (attention_prefill_combine.comp; records as attention_prefill_coopmat.comp writes them)."""
    if not 2 <= splits <= MAX_PREFILL_SPLITS:
        raise ValueError(f"combine_splits: splits {splits} outside 2..{MAX_PREFILL_SPLITS}")
    p = dev.pipeline("attention_prefill_combine_f32", WG=64, NSPLIT=splits)
    push = p.push.pack(head_dim=head_dim, n_heads=n_heads)
    cl.dispatch(p, [step, records, out], groups=(max_tokens, n_heads, 1), push=push)


def attention_prefill(
    cl: CommandList,
    dev: Device,
    step: Binding,
    q: Binding,
    k_cache: Binding,
    v_cache: Binding,
    out: Binding,
    *,
    head_dim: int,
    n_heads: int,
    n_kv_heads: int,
    cache_slots: int,
    window: int,
    scale: float,
    max_tokens: int,
    q_stride: int | None = None,
    q_offset: int = 0,
    wg: int = 128,
    bq: int = 8,
    bc: int = 32,
    vis: Binding | None = None,
    kernel: str | None = None,
    splits: int | None = None,
) -> None:
    """Causal attention of the step's n_tokens queries (positions step.pos + t) against the cache
    (which already holds this chunk's keys). out: [tokens][n_heads * head_dim] f32.
    vis (a prompt with pictures): u32 [tokens], the last position each query sees (its own, or
    its picture's last: a picture's tokens attend to each other both ways).
    kernel: "coopmat" or "scalar"; None takes prefill_kernel(dev, head_dim). "coopmat" where the
    device refuses it raises (no silent fallback). wg, bq, bc tune the scalar kernel only.
    splits (coopmat): workgroups per query block, each over a run of its keys, merged by a
    second dispatch behind a barrier; None takes prefill_splits(...)."""
    if n_heads % n_kv_heads:
        raise ValueError("attention_prefill: n_heads must be a multiple of n_kv_heads")
    kernel = prefill_kernel(dev, head_dim) if kernel is None else kernel
    push_values = dict(
        head_dim=head_dim,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        q_stride=n_heads * head_dim if q_stride is None else q_stride,
        q_offset=q_offset,
        cache_slots=cache_slots,
        window=window,
        scale=scale,
    )
    binds = [step, q, k_cache, v_cache, out] + ([vis] if vis is not None else [])
    spans = "_spans" if vis is not None else ""
    if kernel == "coopmat":
        why = prefill_refusal(dev, head_dim)
        if why is not None:
            raise ValueError(f"attention_prefill: no coopmat kernel here: {why}")
        gw = heads_per_group(n_heads, n_kv_heads)
        splits = prefill_splits(max_tokens, n_heads, n_kv_heads, head_dim) if splits is None else splits
        if not 1 <= splits <= MAX_PREFILL_SPLITS:
            raise ValueError(f"attention_prefill: splits {splits} outside 1..{MAX_PREFILL_SPLITS}")
        need = split_record_bytes(max_tokens, n_heads, head_dim, splits)
        if splits > 1 and need > ATTN_SPLIT_BYTES:
            raise ValueError(f"attention_prefill: {splits} splits need {need} B of records, over {ATTN_SPLIT_BYTES}")
        p = dev.pipeline(
            f"attention_prefill_f16_f32{spans}_coopmat_d{head_dim}",
            WG=CM_SUBGROUPS * dev.caps.subgroup_size,
            GW=gw,
            NSPLIT=splits,
        )
        groups = (*query_blocks(max_tokens, n_heads, n_kv_heads), splits)
        if splits == 1:
            cl.dispatch(p, binds, groups=groups, push=p.push.pack(**push_values))
            return
        # the records go to a scratch every split attention shares: the barrier first, in case an
        # earlier combine recorded without one between still reads it
        cl.barrier()
        records = dev.scratch("split prefill attention records", ATTN_SPLIT_BYTES)
        binds[4] = (records, 0, need)
        cl.dispatch(p, binds, groups=groups, push=p.push.pack(**push_values))
        cl.barrier()
        combine_splits(
            cl,
            dev,
            step,
            (records, 0, need),
            out,
            head_dim=head_dim,
            n_heads=n_heads,
            splits=splits,
            max_tokens=max_tokens,
        )
        return
    if kernel != "scalar":
        raise ValueError(f"attention_prefill: unknown kernel {kernel!r} (coopmat, scalar)")
    if head_dim > 256 or head_dim % 8 or head_dim % (2 * wg // bq) or bc % 4:
        raise ValueError(f"attention_prefill: head_dim {head_dim} unsupported with WG={wg}, BQ={bq}, BC={bc}")
    p = dev.pipeline("attention_prefill_f16_f32" + spans, WG=wg, BQ=bq, BC=bc, HD=head_dim)
    cl.dispatch(p, binds, groups=(-(-max_tokens // bq), n_heads, 1), push=p.push.pack(**push_values))
