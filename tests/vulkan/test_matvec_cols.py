"""The multi-column int8 matvec (shaders/matvec_cols.comp) vs numpy: every int8 weight type, every
vector count 1..16 and beyond one column tile, odd row counts, rows that take the block-pair path
and rows that do not, fused QKV (one type and mixed), GEGLU, offsets and strides.

The reference is exact up to f32 rounding: `gguf.quants.dequantize` of the weight bytes the
kernel reads, times the q8_1 blocks of x as the quantize dispatch wrote them (decoded here), in
f64; so any error beyond accumulation order is the kernel's.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from phoenix_chat.engine.backends.vulkan.matvec import WeightMatrix, q8_1_bytes, record_quantize
from phoenix_chat.engine.backends.vulkan.matvec_cols import COLS_TILES, cols_ok, cols_spec, record_matvec_cols
from tests.vulkan.test_matvec import CODEBOOK_TYPES, QUANT_TYPES, make_weights, nmse

# the int8 multi-column kernel reads every block type but the codebook ones (pipelines.COLS_TYPES):
# for those the f32 multi-column matvec runs (test_matvec's test_several_vectors_in_one_pass)
COLS_TYPES = [q for q in QUANT_TYPES if q not in CODEBOOK_TYPES]

EXACT_NMSE = 1e-10  # f32 accumulation of exact int8 products against the f64 sum


@pytest.fixture(autouse=True)
def _int_dot(vk_device):
    if not vk_device.caps.int_dot:
        pytest.skip(f"{vk_device.name} has no shaderIntegerDotProduct: the f32 multi-column matvec runs there")


def decode_q8_1(raw: np.ndarray, n: int) -> np.ndarray:
    """f64 values of n q8_1-encoded elements (include/q8_1_block.glsl: 8 words of int8, f32 d, f32 d*sum)."""
    words = raw.view(np.uint32).reshape(-1, 10)
    q = words[:, :8].copy().view(np.int8).reshape(-1, 32).astype(np.float64)
    d = words[:, 8].copy().view(np.float32).astype(np.float64)
    return (q * d[:, None]).reshape(-1)[:n]


def quantized_x(dev, x: np.ndarray):
    """(q8_1 buffer of the rows of x, their exact f64 values)."""
    xb = dev.buffer(x.nbytes)
    dev.upload(xb, x.astype(np.float32))
    xq = dev.buffer(q8_1_bytes(x.size))
    cl = dev.commands()
    record_quantize(cl, dev, xb, xq, x.size)
    cl.submit()
    cl.destroy()
    vals = decode_q8_1(dev.download(xq, np.uint8), x.size).reshape(x.shape)
    return xq, vals


def run_cols(dev, mats, x, *, epilogue=None, spec=None, y_off=0, y_stride=None, x_pad_blocks=0):
    """Y for the n rows of x (n, cols); x_pad_blocks: q8_1 blocks before the first vector (x_off)."""
    n, cols = x.shape
    total = mats[0].rows if epilogue == "geglu" else sum(m.rows for m in mats)
    y_stride = y_stride or total
    padded = np.concatenate([np.zeros(32 * x_pad_blocks, np.float32), x.reshape(-1)])
    xq, xv = quantized_x(dev, padded)
    yb = dev.buffer((y_off + n * y_stride) * 4)
    dev.upload(yb, np.full(y_off + n * y_stride, 7.0, np.float32))
    cl = dev.commands()
    record_matvec_cols(
        cl,
        dev,
        mats,
        xq,
        yb,
        n_vecs=n,
        x_off=x_pad_blocks,
        x_stride=cols // 32,
        y_off=y_off,
        y_stride=y_stride,
        epilogue=epilogue,
        spec=spec,
    )
    cl.submit()
    cl.destroy()
    out = dev.download(yb, np.float32).astype(np.float64)
    assert (out[:y_off] == 7.0).all()  # nothing before y_off
    y = out[y_off:].reshape(n, y_stride)
    assert (y[:, total:] == 7.0).all()  # nothing between the rows of one vector and the next
    return y[:, :total], xv[32 * x_pad_blocks :].reshape(n, cols)


def gelu(g):
    return 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g**3)))


def shape_for(qtype):
    """(rows, cols): odd rows; cols of whole block pairs for Q4_0 / Q8_0 (their pair path)."""
    return (37, 512) if GGML_QUANT_SIZES[qtype][0] == 256 else (37, 640)


@pytest.mark.parametrize("qtype", CODEBOOK_TYPES, ids=lambda q: q.name)
def test_codebook_types_are_left_to_the_f32_multi_column_matvec(vk_device, qtype):
    raw, _ = make_weights(qtype, 8, 256)
    m = WeightMatrix.upload(vk_device, raw, qtype, (8, 256))
    try:
        assert not cols_ok(vk_device, [m])
    finally:
        m.tensor.buffer.destroy()


@pytest.mark.parametrize("qtype", COLS_TYPES, ids=lambda q: q.name)
def test_every_type_every_small_count(vk_device, qtype):
    """1..8 vectors (one tile of the default shape) and 13 (one tile of 16), every int8 type."""
    dev = vk_device
    rows, cols = shape_for(qtype)
    raw, ref = make_weights(qtype, rows, cols, seed=60 + int(qtype))
    m = WeightMatrix.upload(dev, raw, qtype, (rows, cols))
    rng = np.random.default_rng(61)
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 13):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        y, xv = run_cols(dev, [m], x)
        err = nmse(y, xv @ ref.T)
        assert err < EXACT_NMSE, f"{qtype.name} n={n}: NMSE {err:.2e}"
    m.tensor.buffer.destroy()


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("tile", COLS_TILES)
@pytest.mark.parametrize("rows_per_subgroup", [1, 2])
def test_tiles_and_row_shapes(vk_device, qtype, tile, rows_per_subgroup):
    """Every column tile and rows-per-subgroup shape the timing may pick, with more vectors than
    one tile (the tiles of a row group), geglu and plain, y at an offset with a row stride."""
    dev = vk_device
    rows, cols = shape_for(qtype)
    spec = cols_spec(dev, 0, rows=rows_per_subgroup, tile=tile)
    gate, up = (make_weights(qtype, rows, cols, seed=70 + i) for i in range(2))
    gu = [WeightMatrix.upload(dev, raw, qtype, (rows, cols)) for raw, _ in (gate, up)]
    n = 2 * tile + 3
    x = np.random.default_rng(71).standard_normal((n, cols)).astype(np.float32)
    y, xv = run_cols(dev, gu, x, epilogue="geglu", spec=spec, y_off=5, y_stride=rows + 3)
    want = gelu(xv @ gate[1].T) * (xv @ up[1].T)
    assert nmse(y, want) < EXACT_NMSE
    y, xv = run_cols(dev, gu[:1], x, spec=spec)
    assert nmse(y, xv @ gate[1].T) < EXACT_NMSE


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q8_0], ids=lambda q: q.name)
def test_rows_off_the_block_pair_path(vk_device, qtype):
    """Q4_0 / Q8_0 rows of an odd block count (96 columns) and x at an odd block offset take the
    chunk path; long rows (2048 columns) the pair path with many pairs per lane."""
    dev = vk_device
    rng = np.random.default_rng(80)
    for rows, cols, pad in ((21, 96, 0), (21, 640, 1), (9, 2048, 0)):
        raw, ref = make_weights(qtype, rows, cols, seed=81 + cols)
        m = WeightMatrix.upload(dev, raw, qtype, (rows, cols))
        x = rng.standard_normal((3, cols)).astype(np.float32)
        y, xv = run_cols(dev, [m], x, x_pad_blocks=pad)
        assert nmse(y, xv @ ref.T) < EXACT_NMSE, (rows, cols, pad)


@pytest.mark.parametrize(
    "types", [(Q.Q4_0, Q.Q4_0), (Q.Q5_0, Q.Q8_0), (Q.Q4_K, Q.Q6_K)], ids=["q4_0", "q5_0+q8_0", "q4_k+q6_k"]
)
def test_fused_qkv(vk_device, types):
    """[q, k, v] in one dispatch, rows of each written one after the other; v of its own type."""
    dev = vk_device
    qk, vt = types
    cols = 512
    parts = [make_weights(t, r, cols, seed=90 + i) for i, (t, r) in enumerate(((qk, 64), (qk, 32), (vt, 34)))]
    mats = [WeightMatrix.upload(dev, raw, t, ref.shape) for (raw, ref), t in zip(parts, (qk, qk, vt))]
    x = np.random.default_rng(91).standard_normal((6, cols)).astype(np.float32)
    y, xv = run_cols(dev, mats, x)
    want = xv @ np.concatenate([ref for _, ref in parts]).T
    assert nmse(y, want) < EXACT_NMSE


def test_refuses_what_it_cannot_run(vk_device):
    dev = vk_device
    raw, ref = make_weights(Q.F16, 8, 64)
    m = WeightMatrix.upload(dev, raw, Q.F16, (8, 64))
    buf = dev.buffer(4096)
    with pytest.raises(ValueError, match="f32 one"):
        record_matvec_cols(dev.commands(), dev, [m], buf, buf, n_vecs=2, x_stride=2, y_stride=8)
    raw, _ = make_weights(Q.Q4_0, 8, 64)
    q = WeightMatrix.upload(dev, raw, Q.Q4_0, (8, 64))
    with pytest.raises(ValueError, match="epilogues"):
        record_matvec_cols(dev.commands(), dev, [q], buf, buf, n_vecs=2, x_stride=2, y_stride=8, epilogue="add")
