"""RMSNorm dispatches (shaders/norm.comp): one workgroup per row, f32.

`q`: a buffer for the q8_1 blocks of `out` (ceil(n/32) blocks of 40 bytes per row, the layout
`matvec.record_quantize` writes), filled by the same dispatch, for an int8 matvec that reads
`out` next; None writes only the f32 output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.memory import Binding
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList


def norm(
    cl: CommandList,
    dev: Device,
    x: Binding,
    w: Binding,
    out: Binding,
    *,
    rows: int,
    n: int,
    eps: float,
    q: Binding | None = None,
    wg: int = 256,
) -> None:
    """out[r] = rmsnorm(x[r]) * w  (w is Gemma's (1 + weight) multiplier)."""
    name, binds = "norm_f32", [x, w, out]
    if q is not None:
        name, binds = name + "_q8_1", binds + [q]
    p = dev.pipeline(name, WG=wg)
    cl.dispatch(p, binds, groups=(rows, 1, 1), push=p.push.pack(n=n, eps=eps))


NORM_MAXE = 8  # elements per invocation norm_row.glsl's register path holds


def add_workgroup(dev: Device, n: int) -> int:
    """Invocations for norm_add over rows of n: enough that the row fits the register path."""
    return min(dev.caps.max_workgroup_invocations, max(256, 1 << (-(-n // NORM_MAXE) - 1).bit_length()))


def norm_add(
    cl: CommandList,
    dev: Device,
    x: Binding,
    w_post: Binding,
    residual: Binding,
    w_next: Binding,
    out: Binding,
    *,
    rows: int,
    n: int,
    eps: float,
    q: Binding | None = None,
    wg: int | None = None,
) -> None:
    """residual += rmsnorm(x) * w_post;  out = rmsnorm(residual) * w_next  (one dispatch)."""
    wg = add_workgroup(dev, n) if wg is None else wg
    name, binds = "norm_add_f32", [x, w_post, residual, w_next, out]
    if q is not None:
        name, binds = name + "_q8_1", binds + [q]
    p = dev.pipeline(name, WG=wg)
    cl.dispatch(p, binds, groups=(rows, 1, 1), push=p.push.pack(n=n, eps=eps))


def norm_add_split(
    cl: CommandList,
    dev: Device,
    x: Binding,
    w_post: Binding,
    res_in: Binding,
    w_next: Binding,
    out: Binding,
    res_out: Binding,
    *,
    n: int,
    eps: float,
    q: Binding | None = None,
    wg: int | None = None,
) -> None:
    """One row (decode): res_out = res_in + rmsnorm(x) * w_post;  out = rmsnorm(res_out) * w_next,
    over ceil(n / wg) workgroups instead of one (norm.comp's NORM_ADD_SPLIT says how). res_in and
    res_out must be different buffers."""
    if res_in is res_out:
        raise ValueError("norm_add_split reads the residual from one buffer and writes another")
    wg = add_workgroup(dev, n) if wg is None else wg
    name, binds = "norm_add_split_f32", [x, w_post, res_in, w_next, out, res_out]
    if q is not None:
        name, binds = name + "_q8_1", binds + [q]
    p = dev.pipeline(name, WG=wg)
    cl.dispatch(p, binds, groups=(-(-n // wg), 1, 1), push=p.push.pack(n=n, eps=eps))
