"""QK-norm + RoPE + KV-cache write (shaders/rope.comp).

Reads step.pos / step.n_tokens at run time; `max_tokens` only sizes the dispatch.
Cache layout: [n_kv_heads][cache_slots][head_dim] f16; position p lands in slot p % cache_slots
(global layers: cache_slots >= context; local layers: a ring of >= window + prefill chunk).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.memory import Binding
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList


def rope_kv(
    cl: CommandList,
    dev: Device,
    step: Binding,
    q: Binding,
    k: Binding,
    v: Binding,
    q_norm_w: Binding,
    k_norm_w: Binding,
    k_cache: Binding,
    v_cache: Binding,
    *,
    head_dim: int,
    n_heads: int,
    n_kv_heads: int,
    cache_slots: int,
    theta: float,
    scale_factor: float = 1.0,
    eps: float = 1e-6,
    max_tokens: int = 1,
    q_stride: int | None = None,
    kv_stride: int | None = None,
    q_offset: int = 0,
    k_offset: int = 0,
    v_offset: int = 0,
    wg: int = 64,
    rows: int = 0,
) -> None:
    """Normalize + rotate q in place (f32), k into k_cache, copy v into v_cache (f16).

    q, k, v may be the same fused QKV buffer with different offsets (floats) and strides.
    rows > 0: a batched decode step (batch.py): `step` binds that many Step rows
    (ops_common.STEP_ROW_BYTES apart), token t of the buffers is row t, at its row's position and slot.
    """
    if head_dim % 8:
        raise ValueError("rope_kv: head_dim must be a multiple of 8")
    p = dev.pipeline("rope_f32_f16_rows" if rows else "rope_f32_f16", WG=wg)
    push = p.push.pack(
        head_dim=head_dim,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        q_stride=n_heads * head_dim if q_stride is None else q_stride,
        kv_stride=n_kv_heads * head_dim if kv_stride is None else kv_stride,
        q_offset=q_offset,
        k_offset=k_offset,
        v_offset=v_offset,
        cache_slots=cache_slots,
        theta=theta,
        pos_scale=1.0 / scale_factor,
        eps=eps,
    )
    cl.dispatch(
        p,
        [step, q, k, v, q_norm_w, k_norm_w, k_cache, v_cache],
        groups=(n_heads + n_kv_heads, rows or max_tokens, 1),
        push=push,
    )
