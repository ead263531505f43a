"""Matvec kernels vs numpy over every weight type, odd shapes, fused variants and the int8 path.

Quantized data is real: `gguf.quants.quantize` where gguf-py can quantize the type, random
blocks with sane scales for the K-quants (gguf-py only dequantizes those); the reference is
always `gguf.quants.dequantize` of the exact bytes the kernel reads.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q

from phoenix_chat.engine.backends.vulkan.matvec import WeightMatrix, q8_1_bytes, record_matvec, record_quantize
from tools.make_synthetic_gguf import random_blocks

F32_NMSE = 1e-9
INT8_NMSE = 2e-4
CODEBOOK_TYPES = [Q.IQ3_XXS, Q.IQ3_S, Q.IQ2_XS, Q.IQ2_S]  # the grid is the start of the matrix's buffer
QUANT_TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.IQ4_NL, Q.IQ4_XS, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
QUANT_TYPES += CODEBOOK_TYPES
TYPES = [Q.F32, Q.F16, Q.BF16, *QUANT_TYPES]
# gguf-py cannot quantize these: random valid blocks (every bit pattern, sane f16 scales)
RANDOM_BLOCK_TYPES = {Q.IQ4_NL, Q.IQ4_XS, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, *CODEBOOK_TYPES}


def make_weights(qtype: Q, rows: int, cols: int, seed: int = 0):
    """(raw bytes as stored, f32 dequantized reference)."""
    rng = np.random.default_rng(seed)
    if qtype in RANDOM_BLOCK_TYPES:
        block, _size = GGML_QUANT_SIZES[qtype]
        raw = random_blocks(qtype, rows * cols // block, rng).reshape(rows, -1)
    else:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        raw = w if qtype == Q.F32 else quants.quantize(w, qtype)
    ref = w if qtype == Q.F32 else quants.dequantize(raw, qtype).reshape(rows, cols)
    return np.ascontiguousarray(raw), ref.astype(np.float64)


def nmse(y, ref) -> float:
    return float(np.sum((y - ref) ** 2) / max(np.sum(ref**2), 1e-30))


# every kernel shape: rows shared by a workgroup, rows owned by a subgroup (GPUs), whole rows
# per invocation (CPU Vulkan)
COOPERATIVE = {"WG": 32, "ROWS": 2, "THREAD_ROWS": 0}
THREAD_ROWS = {"WG": 8, "ROWS": 2, "THREAD_ROWS": 1}
SUBGROUP_ROWS = {"WG": 32, "ROWS": 2, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4}  # rows per subgroup
SPECS = pytest.mark.parametrize(
    "spec", [COOPERATIVE, THREAD_ROWS, SUBGROUP_ROWS], ids=["coop", "thread_rows", "subgroup_rows"]
)


def run(dev, mats, x, *, epilogue=None, res=None, int_dot=False, n_out=None, spec=None):
    xb = dev.buffer(x.nbytes)
    dev.upload(xb, x.astype(np.float32))
    n_out = n_out or sum(m.rows for m in mats)
    yb = dev.buffer(n_out * 4)
    rb = None
    if res is not None:
        rb = dev.buffer(res.nbytes)
        dev.upload(rb, res.astype(np.float32))
    cl = dev.commands()
    if int_dot == "regs":
        record_matvec(cl, dev, mats, xb, yb, epilogue=epilogue, res=rb, int_dot="regs", spec=spec)
    elif int_dot:
        xq = dev.buffer(q8_1_bytes(x.size))
        record_quantize(cl, dev, xb, xq, x.size)
        cl.barrier()
        record_matvec(cl, dev, mats, xq, yb, epilogue=epilogue, res=rb, int_dot=True, spec=spec)
    else:
        record_matvec(cl, dev, mats, xb, yb, epilogue=epilogue, res=rb, spec=spec)
    cl.submit()
    out = dev.download(yb, np.float32, (n_out,)).astype(np.float64)
    cl.destroy()
    return out


def shapes_for(qtype):
    if GGML_QUANT_SIZES[qtype][0] == 256:
        return [(1, 256), (37, 1024), (130, 2048)]
    if qtype in (Q.F32, Q.F16, Q.BF16):
        return [(1, 32), (19, 1000), (65, 640)]
    return [(1, 32), (37, 640), (130, 2048)]


@SPECS
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_matvec_every_type(vk_device, qtype, spec):
    for i, (rows, cols) in enumerate(shapes_for(qtype)):
        raw, ref = make_weights(qtype, rows, cols, seed=i)
        x = np.random.default_rng(100 + i).standard_normal(cols).astype(np.float32)
        m = WeightMatrix.upload(vk_device, raw, qtype, (rows, cols))
        y = run(vk_device, [m], x, spec=spec)
        err = nmse(y, ref @ x.astype(np.float64))
        assert err < F32_NMSE, f"{qtype.name} {rows}x{cols}: NMSE {err:.2e}"
        m.tensor.buffer.destroy()


@SPECS
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda q: q.name)
def test_matvec_int8_dot_path(vk_device, qtype, spec):
    if not vk_device.caps.int_dot:
        pytest.skip(f"{vk_device.name} has no shaderIntegerDotProduct")
    rows, cols = 75, 2048
    raw, ref = make_weights(qtype, rows, cols, seed=3)
    x = np.random.default_rng(4).standard_normal(cols).astype(np.float32)
    m = WeightMatrix.upload(vk_device, raw, qtype, (rows, cols))
    y = run(vk_device, [m], x, int_dot=True, spec=spec)
    err = nmse(y, ref @ x.astype(np.float64))
    assert err < INT8_NMSE, f"{qtype.name} int8: NMSE {err:.2e}"


@SPECS
def test_fused_qkv_and_residual_add(vk_device, spec):
    cols = 640
    parts = [make_weights(Q.Q5_0, r, cols, seed=s) for r, s in ((96, 1), (32, 2), (32, 3))]
    mats = [WeightMatrix.upload(vk_device, raw, Q.Q5_0, ref.shape) for raw, ref in parts]
    x = np.random.default_rng(5).standard_normal(cols).astype(np.float32)
    ref = np.concatenate([r @ x.astype(np.float64) for _, r in parts])
    assert nmse(run(vk_device, mats, x, spec=spec), ref) < F32_NMSE
    res = np.random.default_rng(6).standard_normal(96).astype(np.float32)
    y = run(vk_device, mats[:1], x, epilogue="add", res=res, spec=spec)
    assert nmse(y, res + parts[0][1] @ x.astype(np.float64)) < F32_NMSE


MIXED_QKV = [(Q.Q5_0, Q.Q8_0), (Q.Q4_K, Q.Q6_K), (Q.Q5_K, Q.Q6_K)]  # pipelines.MIXED_QKV_TYPES


@SPECS
@pytest.mark.parametrize("int_dot", [False, True], ids=["f32", "int8"])
@pytest.mark.parametrize("types", MIXED_QKV, ids=lambda t: f"{t[0].name}-v{t[1].name}")
def test_fused_qkv_with_v_of_another_type(vk_device, types, int_dot, spec):
    """llama.cpp's Q4_K_M gives Gemma's v another type than q/k: one dispatch still computes all
    three (binding 2 decodes its own type), on the f32 and the int8 path."""
    if int_dot and not vk_device.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    qk, v = types
    cols = 512
    parts = [make_weights(t, r, cols, seed=s) for t, r, s in ((qk, 96, 41), (qk, 32, 42), (v, 32, 43))]
    mats = [WeightMatrix.upload(vk_device, raw, t, ref.shape) for t, (raw, ref) in zip((qk, qk, v), parts)]
    x = np.random.default_rng(44).standard_normal(cols).astype(np.float32)
    ref = np.concatenate([r @ x.astype(np.float64) for _, r in parts])
    y = run(vk_device, mats, x, int_dot=int_dot, spec=spec)
    for name, sl in (("q", slice(0, 96)), ("k", slice(96, 128)), ("v", slice(128, 160))):
        err = nmse(y[sl], ref[sl])
        assert err < (INT8_NMSE if int_dot else F32_NMSE), f"{name}: NMSE {err:.2e}"
    for m in mats:
        m.tensor.buffer.destroy()


def test_fused_matvec_refuses_type_mixes_without_a_kernel(vk_device):
    from phoenix_chat.engine.backends.vulkan.matvec import fusable

    cols = 256
    q4, q6, q8 = (
        WeightMatrix.upload(vk_device, make_weights(t, 32, cols)[0], t, (32, cols)) for t in (Q.Q4_0, Q.Q6_K, Q.Q8_0)
    )
    assert not fusable([q4, q4, q6])  # no (Q4_0, Q6_K) kernel
    assert not fusable([q6, q4, q4])  # only v may differ
    assert not fusable([q4, q8])  # gate/up pairs share one type
    b = vk_device.buffer(4096)
    cl = vk_device.commands()
    with pytest.raises(ValueError, match="share column count and type"):
        record_matvec(cl, vk_device, [q4, q4, q6], b, b)
    cl.destroy()
    for m in (q4, q6, q8):
        m.tensor.buffer.destroy()


@SPECS
@pytest.mark.parametrize("int_dot", [False, True], ids=["f32", "int8"])
def test_geglu_gate_up(vk_device, int_dot, spec):
    if int_dot and not vk_device.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    rows, cols = 70, 640
    (gr, g), (ur, u) = make_weights(Q.Q8_0, rows, cols, 7), make_weights(Q.Q8_0, rows, cols, 8)
    mats = [WeightMatrix.upload(vk_device, gr, Q.Q8_0, g.shape), WeightMatrix.upload(vk_device, ur, Q.Q8_0, u.shape)]
    x = np.random.default_rng(9).standard_normal(cols).astype(np.float32) * 0.3
    gx, ux = g @ x.astype(np.float64), u @ x.astype(np.float64)
    ref = 0.5 * gx * (1 + np.tanh(np.sqrt(2 / np.pi) * (gx + 0.044715 * gx**3))) * ux
    y = run(vk_device, mats, x, epilogue="geglu", int_dot=int_dot, n_out=rows, spec=spec)
    assert nmse(y, ref) < (INT8_NMSE * 4 if int_dot else F32_NMSE)


# workgroup shapes whose row groups make whole q8_1 blocks (32 rows): 32 = 2 x 16 per subgroup,
# 4 x 8 per workgroup, 8 x 4 per invocation; and shapes where several workgroups share a block
# (8 rows: 4 per block, 2 rows: 16 per block), which count in the block's arrival counter
OUT_Q8_SPECS = pytest.mark.parametrize(
    "spec",
    [
        {"WG": 32, "ROWS": 2, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 16},
        {"WG": 64, "ROWS": 4, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 8},
        {"WG": 8, "ROWS": 4, "THREAD_ROWS": 1},
        {"WG": 32, "ROWS": 2, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4},
        {"WG": 32, "ROWS": 2, "THREAD_ROWS": 0},
        {"WG": 8, "ROWS": 1, "THREAD_ROWS": 1},
    ],
    ids=["subgroup_rows", "subgroup_rows_wide", "thread_rows", "shared_8", "coop_shared_2", "thread_rows_shared_8"],
)


@OUT_Q8_SPECS
@pytest.mark.parametrize("int_dot", [False, True, "regs"], ids=["f32", "int8", "regs"])
def test_geglu_writes_q8_1_bit_identical(vk_device, int_dot, spec):
    """The decode GEGLU's q8_1 output (for the int8 down matvec) is exactly quantize_q8_1 of its
    own y, over more workgroups than rows divide evenly (the last group is partly empty)."""
    if int_dot and not vk_device.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    dev = vk_device
    rows, cols = 224, 640  # 7 blocks of rows: not a multiple of 2 or 4 row groups of 32
    (gr, g), (ur, u) = make_weights(Q.Q4_0, rows, cols, 17), make_weights(Q.Q4_0, rows, cols, 18)
    mats = [WeightMatrix.upload(dev, gr, Q.Q4_0, g.shape), WeightMatrix.upload(dev, ur, Q.Q4_0, u.shape)]
    x = np.random.default_rng(19).standard_normal(cols).astype(np.float32) * 0.3
    xb, yb, yq, ref_q = (
        dev.buffer(x.nbytes),
        dev.buffer(rows * 4),
        dev.buffer(q8_1_bytes(rows)),
        dev.buffer(q8_1_bytes(rows)),
    )
    dev.upload(xb, x)
    cl = dev.commands()
    src = xb
    if int_dot is True:
        src = dev.buffer(q8_1_bytes(cols))
        record_quantize(cl, dev, xb, src, cols)
        cl.barrier()
    arrival = dev.buffer(4 * rows // 32)
    dev.upload(arrival, np.zeros(rows // 32, np.uint32))
    for _ in range(2):  # twice: the counters must be back at 0 after the first
        record_matvec(
            cl, dev, mats, src, yb, epilogue="geglu_q8_1", int_dot=int_dot, spec=spec, y_q8_1=yq, arrival=arrival
        )
        cl.barrier()
    record_quantize(cl, dev, yb, ref_q, rows)
    cl.submit()
    assert not dev.download(arrival, np.uint32, (rows // 32,)).any()
    y = dev.download(yb, np.float32, (rows,)).astype(np.float64)
    got, want = dev.download(yq, np.uint32, (rows // 32 * 10,)), dev.download(ref_q, np.uint32, (rows // 32 * 10,))
    cl.destroy()
    gx, ux = g @ x.astype(np.float64), u @ x.astype(np.float64)
    ref = 0.5 * gx * (1 + np.tanh(np.sqrt(2 / np.pi) * (gx + 0.044715 * gx**3))) * ux
    assert nmse(y, ref) < (INT8_NMSE * 4 if int_dot else F32_NMSE)
    assert np.count_nonzero(want) > want.size // 2, "the reference blocks are not empty"
    np.testing.assert_array_equal(got, want)


def test_geglu_q8_1_refuses_row_groups_that_split_blocks(vk_device):
    """12 rows per workgroup: neither whole blocks nor a whole number of workgroups per block."""
    rows, cols = 64, 64
    (gr, g), (ur, u) = make_weights(Q.Q8_0, rows, cols, 1), make_weights(Q.Q8_0, rows, cols, 2)
    mats = [WeightMatrix.upload(vk_device, gr, Q.Q8_0, g.shape), WeightMatrix.upload(vk_device, ur, Q.Q8_0, u.shape)]
    cl = vk_device.commands()
    buf = vk_device.buffer(1024)
    with pytest.raises(ValueError, match="whole q8_1 blocks"):
        record_matvec(
            cl,
            vk_device,
            mats,
            buf,
            buf,
            epilogue="geglu_q8_1",
            y_q8_1=buf,
            spec={"WG": 32, "ROWS": 3, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4},
        )
    cl.destroy()


def test_matrix_bound_in_row_ranges(vk_device, monkeypatch):
    """A tensor above maxStorageBufferRange is bound in aligned pieces, one dispatch each."""
    rows, cols = 300, 640
    raw, ref = make_weights(Q.Q8_0, rows, cols, seed=11)
    monkeypatch.setattr(vk_device.caps, "max_storage_buffer_range", 64 * 680)
    m = WeightMatrix.upload(vk_device, raw, Q.Q8_0, (rows, cols))
    assert len(m.tensor.ranges) >= 4
    x = np.random.default_rng(12).standard_normal(cols).astype(np.float32)
    assert nmse(run(vk_device, [m], x), ref @ x.astype(np.float64)) < F32_NMSE


def test_many_rows_use_2d_dispatch(vk_device):
    rows, cols = 140_000, 32  # > 2 * 65535 rows: needs the second grid dimension
    raw, ref = make_weights(Q.Q8_0, rows, cols, seed=13)
    m = WeightMatrix.upload(vk_device, raw, Q.Q8_0, (rows, cols))
    x = np.random.default_rng(14).standard_normal(cols).astype(np.float32)
    assert nmse(run(vk_device, [m], x), ref @ x.astype(np.float64)) < F32_NMSE


@SPECS
def test_several_tokens_in_one_dispatch(vk_device, spec):
    """Prefill without a GEMM: workgroup z walks the tokens, x/y/residual advance by their strides."""
    rows, cols, n = 48, 640, 3
    raw, ref = make_weights(Q.Q4_0, rows, cols, seed=15)
    m = WeightMatrix.upload(vk_device, raw, Q.Q4_0, (rows, cols))
    x = np.random.default_rng(16).standard_normal((n, cols)).astype(np.float32)
    res = np.random.default_rng(17).standard_normal((n, rows)).astype(np.float32)
    dev = vk_device
    xb, yb, rb = dev.buffer(x.nbytes), dev.buffer(n * rows * 4), dev.buffer(res.nbytes)
    dev.upload(xb, x)
    dev.upload(rb, res)
    cl = dev.commands()
    record_matvec(cl, dev, [m], xb, yb, epilogue="add", res=rb, tokens=n, x_stride=cols, y_stride=rows, spec=spec)
    cl.submit()
    y = dev.download(yb, np.float32, (n, rows)).astype(np.float64)
    assert nmse(y, res + x.astype(np.float64) @ ref.T) < F32_NMSE


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_several_vectors_in_one_pass_over_the_weights(vk_device, qtype):
    """columns=n (NCOLS): n vectors against each weight chunk read once — plain, fused QKV of
    odd row counts and GEGLU, every weight type, y written at an offset with a row stride."""
    dev, cols = vk_device, 256
    rng = np.random.default_rng(40)
    (rq, fq), (rk, fk), (rv, fv) = (make_weights(qtype, r, cols, seed=41 + i) for i, r in enumerate((70, 34, 34)))
    mats = [WeightMatrix.upload(dev, raw, qtype, raw_ref.shape) for raw, raw_ref in ((rq, fq), (rk, fk), (rv, fv))]
    ref_all = np.concatenate([fq, fk, fv])
    for n in (2, 5, 8) if qtype == Q.Q4_0 else (5,):  # each count is a pipeline to compile
        x = rng.standard_normal((n, cols)).astype(np.float32)
        xb, yb = dev.buffer(x.nbytes), dev.buffer((n * 140 + 3) * 4)
        dev.upload(xb, x)
        dev.upload(yb, np.zeros(n * 140 + 3, np.float32))
        cl = dev.commands()
        record_matvec(cl, dev, mats, xb, yb, y_off=3, x_stride=cols, y_stride=140, columns=n)
        cl.submit()
        out = dev.download(yb, np.float32)
        y = out[3 : 3 + n * 140].reshape(n, 140).astype(np.float64)
        assert nmse(y[:, :138], x.astype(np.float64) @ ref_all.T) < F32_NMSE, n  # 138 rows, stride 140
        assert not out[:3].any() and not y[:, 138:].any()  # nothing outside them
    gate, up = (make_weights(qtype, 96, cols, seed=50 + i) for i in range(2))
    gu = [WeightMatrix.upload(dev, raw, qtype, (96, cols)) for raw, _ in (gate, up)]
    x = rng.standard_normal((3, cols)).astype(np.float32)
    xb, yb = dev.buffer(x.nbytes), dev.buffer(3 * 96 * 4)
    dev.upload(xb, x)
    cl = dev.commands()
    record_matvec(cl, dev, gu, xb, yb, epilogue="geglu", x_stride=cols, y_stride=96, columns=3)
    cl.submit()
    g, u = x.astype(np.float64) @ gate[1].T, x.astype(np.float64) @ up[1].T
    want = 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g**3))) * u
    assert nmse(dev.download(yb, np.float32, (3, 96)).astype(np.float64), want) < F32_NMSE
    with pytest.raises(ValueError, match="columns"):
        record_matvec(cl, dev, gu, xb, yb, epilogue="geglu", int_dot=True, columns=3)


@SPECS
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0], ids=lambda q: q.name)
def test_matvec_int8_quantized_in_registers(vk_device, qtype, spec):
    """f32 x quantized by each lane in registers (no quantize dispatch): plain, add and GEGLU."""
    if not vk_device.caps.int_dot:
        pytest.skip(f"{vk_device.name} has no shaderIntegerDotProduct")
    rows, cols = 70, 1024
    (gr, g), (ur, u) = make_weights(qtype, rows, cols, 20), make_weights(qtype, rows, cols, 21)
    mats = [WeightMatrix.upload(vk_device, gr, qtype, g.shape), WeightMatrix.upload(vk_device, ur, qtype, u.shape)]
    x = np.random.default_rng(22).standard_normal(cols).astype(np.float32) * 0.3
    gx, ux = g @ x.astype(np.float64), u @ x.astype(np.float64)
    assert nmse(run(vk_device, mats[:1], x, int_dot="regs", spec=spec), gx) < INT8_NMSE
    res = np.random.default_rng(23).standard_normal(rows).astype(np.float32)
    assert nmse(run(vk_device, mats[:1], x, int_dot="regs", epilogue="add", res=res, spec=spec), res + gx) < INT8_NMSE
    ref = 0.5 * gx * (1 + np.tanh(np.sqrt(2 / np.pi) * (gx + 0.044715 * gx**3))) * ux
    y = run(vk_device, mats, x, epilogue="geglu", int_dot="regs", n_out=rows, spec=spec)
    assert nmse(y, ref) < INT8_NMSE * 4


def _rmsnorm(v, w, eps):
    return v / np.sqrt(np.mean(v * v) + eps) * w


@pytest.mark.parametrize("int_dot", [False, True, "regs"], ids=["f32", "q8_1", "regs"])
@SPECS
def test_norm_tail_epilogue(vk_device, spec, int_dot):
    """Decode o-proj/down + norm_add in one dispatch: every workgroup writes its rows of y, the
    last to arrive runs residual += rmsnorm(y) * w_post; h = rmsnorm(residual) * w_next (+ q8_1
    of h). Replayed 3 times: the tail must run every time (the arrival counter is back at 0)."""
    from phoenix_chat.engine.backends.vulkan.matvec import NormTail
    from phoenix_chat.engine.backends.vulkan.ops_norm import norm_add

    dev = vk_device
    if int_dot and not dev.caps.int_dot:
        pytest.skip(f"{dev.name} has no shaderIntegerDotProduct")
    rows, cols, eps = 200, 1024, 1e-6  # several workgroups in every shape
    raw, ref = make_weights(Q.Q8_0, rows, cols, seed=30)
    m = WeightMatrix.upload(dev, raw, Q.Q8_0, (rows, cols))
    rng = np.random.default_rng(31)
    x = rng.standard_normal(cols).astype(np.float32)
    res0 = (rng.standard_normal(rows) * 300).astype(np.float32)
    w_post = (1 + rng.standard_normal(rows) * 0.1).astype(np.float32)
    w_next = (1 + rng.standard_normal(rows) * 0.1).astype(np.float32)

    def buf(a):
        b = dev.buffer(a.nbytes)
        dev.upload(b, a)
        return b

    xb, rb, wpb, wnb = buf(x), buf(res0), buf(w_post), buf(w_next)
    yb, hb, hqb = dev.buffer(rows * 4), dev.buffer(rows * 4), dev.buffer(q8_1_bytes(rows))
    arrival = buf(np.zeros(4, np.uint32))
    cl = dev.commands()
    xin = xb
    if int_dot is True:
        xin = dev.buffer(q8_1_bytes(cols))
        record_quantize(cl, dev, xb, xin, cols)
        cl.barrier()
    record_matvec(
        cl,
        dev,
        [m],
        xin,
        yb,
        epilogue="norm",
        int_dot=int_dot,
        spec=spec,
        tail=NormTail(wpb, rb, wnb, hb, arrival, eps, q=hqb),
    )
    cl.end()
    y_ref = ref @ x.astype(np.float64)
    res = res0.astype(np.float64)
    for _ in range(3):
        cl.submit(wait=True)
        res = res + _rmsnorm(y_ref, w_post, eps)
    tol = INT8_NMSE if int_dot else F32_NMSE
    y = dev.download(yb, np.float32, (rows,))
    assert nmse(y.astype(np.float64), y_ref) < tol
    got_res = dev.download(rb, np.float32, (rows,)).astype(np.float64)
    assert nmse(got_res, res) < tol
    h = dev.download(hb, np.float32, (rows,))
    assert nmse(h.astype(np.float64), _rmsnorm(res, w_next, eps)) < tol
    assert dev.download(arrival, np.uint32, (4,)).tolist() == [0, 0, 0, 0]
    # the q8_1 blocks of h: bit-identical to quantize_q8_1 of the h just written
    want_q = dev.buffer(q8_1_bytes(rows))
    cl2 = dev.commands()
    record_quantize(cl2, dev, hb, want_q, rows)
    cl2.submit(wait=True)
    np.testing.assert_array_equal(dev.download(hqb, np.uint32), dev.download(want_q, np.uint32))
    # and the tail matches the separate norm_add dispatch on the same y (f32 reassociation only)
    r2, h2 = buf(got_res.astype(np.float32)), dev.buffer(rows * 4)
    cl3 = dev.commands()
    norm_add(cl3, dev, yb, wpb, r2, wnb, h2, rows=1, n=rows, eps=eps)
    cl3.submit(wait=True)
    want_res = got_res + _rmsnorm(y.astype(np.float64), w_post, eps)
    assert nmse(dev.download(r2, np.float32, (rows,)).astype(np.float64), want_res) < F32_NMSE
    for c in (cl, cl2, cl3):
        c.destroy()


def test_norm_tail_refuses_what_one_dispatch_cannot_finish(vk_device, monkeypatch):
    """A matrix bound in several row ranges needs several dispatches: no single last workgroup."""
    from phoenix_chat.engine.backends.vulkan.matvec import NormTail

    dev = vk_device
    raw, _ref = make_weights(Q.Q8_0, 300, 640, seed=32)
    monkeypatch.setattr(dev.caps, "max_storage_buffer_range", 64 * 680)
    m = WeightMatrix.upload(dev, raw, Q.Q8_0, (300, 640))
    assert len(m.tensor.ranges) > 1
    b = dev.buffer(4096)
    cl = dev.commands()
    with pytest.raises(ValueError, match="one binding"):
        record_matvec(cl, dev, [m], b, b, epilogue="norm", tail=NormTail(b, b, b, b, b, 1e-6))
    cl.destroy()


@pytest.mark.parametrize(
    "spec", [THREAD_ROWS, SUBGROUP_ROWS, COOPERATIVE], ids=["thread_rows", "subgroup_rows", "coop"]
)
@pytest.mark.parametrize("int_dot", [False, True], ids=["f32", "int8"])
@pytest.mark.parametrize("qk_type", [Q.Q8_0, Q.Q5_0], ids=["q8_0", "q5_0-vq8_0"])
def test_qkv_rope_epilogue_matches_matvec_then_rope(vk_device, spec, int_dot, qk_type):
    """The decode QKV matvec whose last workgroup per head runs QK-norm + RoPE + the KV-cache
    write gives what the plain fused matvec followed by rope_kv gives: q rotated in place, k and v
    in their cache slots (ring position pos % slots), and leaves its arrival counters at 0."""
    from phoenix_chat.engine.backends.vulkan.matvec import RopeTail
    from phoenix_chat.engine.backends.vulkan.ops_rope import rope_kv
    from tests.vulkan.ops_helpers import Bufs

    dev = vk_device
    if int_dot and not dev.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    D, H, KV, cols, slots, pos = 64, 4, 2, 640, 24, 29
    types = (qk_type, qk_type, Q.Q8_0)
    parts = [make_weights(t, r, cols, seed=s) for t, r, s in zip(types, (H * D, KV * D, KV * D), (21, 22, 23))]
    mats = [WeightMatrix.upload(dev, raw, t, ref.shape) for t, (raw, ref) in zip(types, parts)]
    rng = np.random.default_rng(24)
    x = rng.standard_normal(cols).astype(np.float32)
    qw, kw = (
        (1 + 0.1 * rng.standard_normal(D)).astype(np.float32),
        (1 + 0.1 * rng.standard_normal(D)).astype(np.float32),
    )
    n = (H + 2 * KV) * D
    with Bufs(dev) as b:
        step, bx, bqw, bkw = b.step(pos=pos, n_tokens=1), b.of(x), b.of(qw), b.of(kw)
        src = bx
        if int_dot:
            src = b.zeros(q8_1_bytes(cols))
            cl = dev.commands()
            record_quantize(cl, dev, bx, src, cols)
            cl.submit()
            cl.destroy()
        out = []
        for fused in (False, True):
            qkv, kc, vc = b.zeros(n * 4), b.zeros(KV * slots * D * 2), b.zeros(KV * slots * D * 2)
            arrival = b.zeros(4 * (H + 2 * KV))
            cl = dev.commands()
            if fused:
                tail = RopeTail(
                    step,
                    bqw,
                    bkw,
                    kc,
                    vc,
                    arrival,
                    head_dim=D,
                    n_heads=H,
                    n_kv_heads=KV,
                    cache_slots=slots,
                    theta=10000.0,
                    scale_factor=1.0,
                    eps=1e-6,
                )
                record_matvec(cl, dev, mats, src, qkv, epilogue="rope", rope=tail, int_dot=int_dot, spec=spec)
            else:
                record_matvec(cl, dev, mats, src, qkv, int_dot=int_dot, spec=spec)
                cl.barrier()
                rope_kv(
                    cl,
                    dev,
                    step,
                    qkv,
                    qkv,
                    qkv,
                    bqw,
                    bkw,
                    kc,
                    vc,
                    head_dim=D,
                    n_heads=H,
                    n_kv_heads=KV,
                    cache_slots=slots,
                    theta=10000.0,
                    eps=1e-6,
                    q_stride=n,
                    kv_stride=n,
                    q_offset=0,
                    k_offset=H * D,
                    v_offset=(H + KV) * D,
                )
            cl.submit()
            cl.destroy()
            out.append((b.read(qkv)[: H * D], b.read(kc, np.float16), b.read(vc, np.float16)))
            if fused:
                assert not b.read(arrival, np.uint32).any()
    (q0, k0, v0), (q1, k1, v1) = out
    assert np.abs(k0).max() > 0.1 and np.abs(v0).max() > 0.1  # the slot was written
    np.testing.assert_allclose(q1, q0, rtol=1e-5, atol=1e-5)  # the norm's sum order may differ
    np.testing.assert_allclose(k1.astype(np.float32), k0.astype(np.float32), rtol=2e-3, atol=1e-3)
    np.testing.assert_array_equal(v1, v0)
    for m in mats:
        m.tensor.buffer.destroy()


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0, Q.Q4_K], ids=lambda q: q.name)
def test_subgroup_rows_in_a_partial_subgroup(vk_device, qtype):
    """A workgroup of half a subgroup holds one partial subgroup (RADV's wave64 running the
    32-wide REGS_SPEC; every subgroup of lavapipe at 32 or 64 lanes, which runs at most 16):
    its lanes must stride over the row by the lanes present, not gl_SubgroupSize, or the chunks
    of the absent lanes go unread (issue 23: NMSE 0.2-1.1 before). Rows of 2048 columns give
    every lane several chunks; f32 x and, for Q8_0, int8 x (q8_1 blocks and in registers)."""
    dev = vk_device
    half = max(1, dev.caps.subgroup_size // 2)
    spec = {"WG": half, "ROWS": 2, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 1}
    rows, cols = 9, 2048
    raw, ref = make_weights(qtype, rows, cols, seed=60)
    x = np.random.default_rng(61).standard_normal(cols).astype(np.float32)
    m = WeightMatrix.upload(dev, raw, qtype, (rows, cols))
    want = ref @ x.astype(np.float64)
    assert nmse(run(dev, [m], x, spec=spec), want) < F32_NMSE
    if qtype == Q.Q8_0 and dev.caps.int_dot:
        for int_dot in (True, "regs"):
            assert nmse(run(dev, [m], x, int_dot=int_dot, spec=spec), want) < INT8_NMSE, int_dot


def test_several_vectors_on_long_rows(vk_device, qtype=Q.Q8_0):
    """The multi-column matvec on rows of 2048 columns: more block pairs (and chunks) than a
    subgroup has lanes, so each lane strides; plain and GEGLU."""
    dev, cols, n = vk_device, 2048, 3
    rng = np.random.default_rng(62)
    (raw, ref), (raw_u, ref_u) = (make_weights(qtype, 40, cols, seed=63 + i) for i in range(2))
    w, u = (WeightMatrix.upload(dev, r, qtype, (40, cols)) for r in (raw, raw_u))
    x = rng.standard_normal((n, cols)).astype(np.float32)
    xb, yb = dev.buffer(x.nbytes), dev.buffer(n * 40 * 4)
    dev.upload(xb, x)
    cl = dev.commands()
    record_matvec(cl, dev, [w], xb, yb, x_stride=cols, y_stride=40, columns=n)
    cl.submit()
    cl.destroy()
    assert nmse(dev.download(yb, np.float32, (n, 40)).astype(np.float64), x.astype(np.float64) @ ref.T) < F32_NMSE
    cl = dev.commands()
    record_matvec(cl, dev, [w, u], xb, yb, epilogue="geglu", x_stride=cols, y_stride=40, columns=n)
    cl.submit()
    cl.destroy()
    g, up = x.astype(np.float64) @ ref.T, x.astype(np.float64) @ ref_u.T
    want = 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g**3))) * up
    assert nmse(dev.download(yb, np.float32, (n, 40)).astype(np.float64), want) < F32_NMSE


@pytest.mark.parametrize("groups", [0, 1, 3], ids=["one_per_group", "one_workgroup", "three"])
@SPECS
@pytest.mark.parametrize(
    "kind,epilogue,qtype",
    [
        ("norm_add", None, Q.Q8_0),
        ("norm_add", "geglu", Q.Q4_0),
        ("norm_add", None, Q.Q4_K),
        ("quant", None, Q.Q6_K),
    ],
    ids=["norm_add-q8_0", "norm_add-geglu-q4_0", "norm_add-q4_k", "quant-q6_k"],
)
def test_prologue_matches_the_dispatch_it_replaces(vk_device, spec, groups, kind, epilogue, qtype):
    """A decode matvec whose workgroups make their q8_1 x themselves (matvec.Prologue): the split
    norm_add (res_out = res_in + rmsnorm(pin) * w_post, x = rmsnorm(res_out) * w_next) or the
    quantize of pin, then the product, with the row groups strided over `groups` workgroups,
    gives what the separate dispatch, a barrier and the int8 matvec give: y, and the new residual
    written once (res_in untouched)."""
    from phoenix_chat.engine.backends.vulkan.matvec import Prologue
    from phoenix_chat.engine.backends.vulkan.ops_norm import norm_add_split

    dev = vk_device
    if not dev.caps.int_dot:
        pytest.skip(f"{dev.name} has no shaderIntegerDotProduct")
    rows, cols, eps = 70, 1280, 1e-6  # 1280: whole K-quant super-blocks, not a multiple of 64 blocks
    n_mats = 2 if epilogue == "geglu" else 1
    parts = [make_weights(qtype, rows, cols, seed=40 + i) for i in range(n_mats)]
    mats = [WeightMatrix.upload(dev, raw, qtype, ref.shape) for raw, ref in parts]
    rng = np.random.default_rng(41)
    pin = (rng.standard_normal(cols) * 5).astype(np.float32)
    res_in = (rng.standard_normal(cols) * 300).astype(np.float32)
    w_post = (1 + rng.standard_normal(cols) * 0.1).astype(np.float32)
    w_next = (1 + rng.standard_normal(cols) * 0.1).astype(np.float32)

    def buf(a):
        b = dev.buffer(a.nbytes)
        dev.upload(b, a)
        return b

    bp, bri, bwp, bwn = buf(pin), buf(res_in), buf(w_post), buf(w_next)
    y_sep, y_pro = dev.buffer(rows * 4), dev.buffer(rows * 4)
    h, hq, ro_sep, ro_pro = (
        dev.buffer(cols * 4),
        dev.buffer(q8_1_bytes(cols)),
        dev.buffer(cols * 4),
        dev.buffer(cols * 4),
    )
    cl = dev.commands()
    if kind == "norm_add":
        norm_add_split(cl, dev, bp, bwp, bri, bwn, h, ro_sep, n=cols, eps=eps, q=hq)
    else:
        record_quantize(cl, dev, bp, hq, cols)
    cl.barrier()
    record_matvec(cl, dev, mats, hq, y_sep, epilogue=epilogue, int_dot=True, spec=spec)
    cl.barrier()
    pro = Prologue(kind, bp, groups, bri, bwp, bwn, ro_pro, eps) if kind == "norm_add" else Prologue(kind, bp, groups)
    record_matvec(cl, dev, mats, dummy_x := dev.buffer(16), y_pro, epilogue=epilogue, int_dot=True, spec=spec, pro=pro)
    cl.submit()
    want, got = dev.download(y_sep, np.float32, (rows,)), dev.download(y_pro, np.float32, (rows,))
    # the prologue's sums run in another order than norm.comp's: the blocks may differ by a
    # rounding step here and there, so close (int8 rounding) rather than equal
    assert nmse(got.astype(np.float64), want.astype(np.float64)) < INT8_NMSE / 20
    assert np.abs(want).max() > 1.0
    # against numpy too
    if kind == "norm_add":
        r = res_in.astype(np.float64) + _rmsnorm(pin.astype(np.float64), w_post, eps)
        x = _rmsnorm(r, w_next, eps)
        np.testing.assert_allclose(dev.download(ro_pro, np.float32, (cols,)), r, rtol=1e-5, atol=1e-3)
        np.testing.assert_array_equal(dev.download(bri, np.float32, (cols,)), res_in)
    else:
        x = pin.astype(np.float64)
    ref = [p[1] @ x for p in parts]
    if epilogue == "geglu":
        g, u = ref
        ref_y = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) * u
    else:
        ref_y = ref[0]
    assert nmse(got.astype(np.float64), ref_y) < INT8_NMSE * 4
    cl.destroy()
    dummy_x.destroy()
    for m in mats:
        m.tensor.buffer.destroy()
