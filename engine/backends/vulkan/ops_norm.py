"""RMSNorm dispatches (shaders/norm.comp): one workgroup per row, f32."""
from __future__ import annotations


def norm(cl, dev, x, w, out, *, rows: int, n: int, eps: float, wg: int = 256) -> None:
    """out[r] = rmsnorm(x[r]) * w  (w is Gemma's (1 + weight) multiplier)."""
    p = dev.pipeline("norm_f32", WG=wg)
    cl.dispatch(p, [x, w, out], groups=(rows, 1, 1), push=p.push.pack(n=n, eps=eps))


def norm_add(cl, dev, x, w_post, residual, w_next, out, *, rows: int, n: int, eps: float,
             wg: int = 256) -> None:
    """residual += rmsnorm(x) * w_post;  out = rmsnorm(residual) * w_next  (one dispatch)."""
    p = dev.pipeline("norm_add_f32", WG=wg)
    cl.dispatch(p, [x, w_post, residual, w_next, out], groups=(rows, 1, 1), push=p.push.pack(n=n, eps=eps))
