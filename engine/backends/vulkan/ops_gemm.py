"""Prefill GEMM (shaders/gemm.comp): y[m, :] = x[m, :] @ W.T for a chunk of tokens, W quantized."""
from __future__ import annotations

from engine.backends.vulkan.ops_table import GEMM_TYPES

TILE = 64


def _ranges(w):
    """A memory.Tensor's row ranges, or one whole-buffer range for a plain binding."""
    return [(r.binding, r.row_start, r.rows) for r in w.ranges] if hasattr(w, "ranges") else None


def gemm(cl, dev, x, w, y, *, wtype: str, m: int, n: int, k: int, x_stride: int | None = None,
         y_stride: int | None = None, w_up=None) -> None:
    """y = x @ W.T (or gelu_tanh(x @ Wg.T) * (x @ Wu.T) when `w_up` is given: `w` is then the gate).

    `w` / `w_up`: a memory.Tensor (one dispatch per bound row range) or a plain binding of all n rows.
    """
    wt = wtype.upper()
    if wt not in GEMM_TYPES:
        raise ValueError(f"gemm: weight type {wtype} unsupported (have {', '.join(GEMM_TYPES)})")
    p = dev.pipeline(f"gemm_{wt.lower()}_f32_f32" + ("_geglu" if w_up is not None else ""))
    xs = k if x_stride is None else x_stride
    ys = n if y_stride is None else y_stride
    gate = _ranges(w) or [(w, 0, n)]
    up = (_ranges(w_up) or [(w_up, 0, n)]) if w_up is not None else None
    if up is not None and [(s, r) for _, s, r in up] != [(s, r) for _, s, r in gate]:
        raise ValueError("gemm: gate and up must be bound in the same row ranges")
    for i, (binding, row_start, rows) in enumerate(gate):
        push = p.push.pack(m=m, n=rows, k=k, x_stride=xs, y_stride=ys, y_off=row_start)
        binds = [x, y, binding] + ([up[i][0]] if up is not None else [])
        cl.dispatch(p, binds, groups=(-(-rows // TILE), -(-m // TILE), 1), push=push)
