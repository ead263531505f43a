"""What lives on the device for a loaded model: its weights, uploaded once in their target
types (`upload_weights`), and the KV caches, activations and scratch every recording binds
(`allocate_buffers`), sized by the memory plan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType as QType

from phoenix_chat.engine.backends.vulkan import ops_attention, ops_sample
from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.matvec import SUPPORTED, WeightMatrix, q8_1_bytes
from phoenix_chat.engine.backends.vulkan.memory import Buffer, Tensor
from phoenix_chat.engine.backends.vulkan.ops_common import STEP_BYTES, STEP_ROW_BYTES
from phoenix_chat.engine.backends.vulkan.ops_quantize_weights import SOURCE_KINDS, quantize_tensor
from phoenix_chat.engine.backends.vulkan.plan import (
    LOGITS_CHUNK,
    PREFILL_CHUNK,
    MemoryPlan,
    batch_logits_stride,
    row_stride,
)
from phoenix_chat.engine.config import ModelConfig
from phoenix_chat.engine.errors import UnsupportedModelError
from phoenix_chat.engine.weights.base import WeightSource

MATRICES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
    "self_attn.q_norm",
    "self_attn.k_norm",
)


@dataclass
class Layer:
    qkv: list[WeightMatrix]  # [q, k, v]
    o: WeightMatrix
    gate: WeightMatrix
    up: WeightMatrix
    down: WeightMatrix
    norms: dict[str, Buffer]  # name -> f32 multipliers
    k_cache: Buffer
    v_cache: Buffer
    slots: int
    is_global: bool


@dataclass
class DeviceWeights:
    embed_table: Tensor
    embed_type: QType
    lm_head: WeightMatrix  # the embedding's matrix where tied
    final_norm: Buffer
    layers: list[Layer]


def upload_weights(
    dev: Device, weights: WeightSource, plan: MemoryPlan, progress: Callable[[float, str], None] | None = None
) -> DeviceWeights:
    """Every tensor on the device (and each layer's KV cache beside its weights)."""
    cfg = weights.config
    total = len(weights.tensors)
    done = 0

    def tick(name: str) -> None:
        """`name` is on the device: its file pages go (one copy of the weights in RAM at a time)."""
        nonlocal done
        weights.release_pages(name)
        done += 1
        if progress:
            progress(done / total, f"uploading {name}")

    def matrix(name: str) -> WeightMatrix:
        with dev.allocating_in(plan.weights_heap):
            return _weight(dev, weights, name, plan.target_type(weights.tensors[name].qtype))

    et = weights.tensors["embed_tokens"]
    with dev.allocating_in(plan.weights_heap):
        emb = _weight(dev, weights, "embed_tokens", plan.embed_type(et.qtype))
    tick("embed_tokens")
    if plan.tied:
        lm_head = emb
    else:
        lm_head = matrix("lm_head")
        tick("lm_head")
    final_norm = _norm(dev, weights, "norm")
    tick("norm")
    layers: list[Layer] = []
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        mats: dict[str, WeightMatrix] = {}
        for short in MATRICES:
            mats[short] = matrix(p + short)
            tick(p + short)
        norms: dict[str, Buffer] = {}
        for short in NORMS:
            norms[short] = _norm(dev, weights, p + short)
            tick(p + short)
        if mats["mlp.gate_proj"].qtype != mats["mlp.up_proj"].qtype:
            raise UnsupportedModelError(
                weights.path,
                f"layer {i}: gate and up projections differ in type "
                "(the fused GEGLU kernel needs one type): load with --quant",
            )
        kv_bytes = plan.n_slots * cfg.num_kv_heads * plan.slots[i] * cfg.head_dim * 2  # [slot][kv head][pos][dim]
        layers.append(
            Layer(
                qkv=[mats["self_attn.q_proj"], mats["self_attn.k_proj"], mats["self_attn.v_proj"]],
                o=mats["self_attn.o_proj"],
                gate=mats["mlp.gate_proj"],
                up=mats["mlp.up_proj"],
                down=mats["mlp.down_proj"],
                norms=norms,
                k_cache=dev.buffer(kv_bytes, name=f"k_cache.{i}"),
                v_cache=dev.buffer(kv_bytes, name=f"v_cache.{i}"),
                slots=plan.slots[i],
                is_global=cfg.is_global_layer(i),
            )
        )
    return DeviceWeights(emb.tensor, emb.qtype, lm_head, final_norm, layers)


def _weight(dev: Device, weights: WeightSource, name: str, target: QType) -> WeightMatrix:
    """The tensor on the device as `target`: its own bytes when the types agree, else
    re-quantized by the device from the file's f32/f16/bf16 values (other types are
    dequantized to f32 by the host first)."""
    t = weights.tensors[name]
    if target not in SUPPORTED:
        raise UnsupportedModelError(
            weights.path,
            f"{t.source_name or name}: type {target.name} has no Vulkan kernel: run it on the CPU "
            "(--backend cpu) or re-quantize it for the GPU on load (--quant q4_0 or q8_0)",
        )
    if len(t.shape) != 2:
        raise UnsupportedModelError(weights.path, f"{t.source_name or name}: shape {t.shape} is not a matrix")
    rows, cols = t.shape
    if t.qtype == target:
        return WeightMatrix.upload(dev, weights.raw(name), target, (rows, cols), name=name)
    source: npt.NDArray[np.uint8] | npt.NDArray[np.float32]
    if t.qtype in SOURCE_KINDS:
        source, kind = weights.raw(name), t.qtype
    else:
        source, kind = np.ascontiguousarray(weights.dequantize(name), dtype=np.float32), QType.F32
    try:
        tensor = quantize_tensor(dev, source, kind, target, (rows, cols), name=name)
    except ValueError as e:
        raise UnsupportedModelError(weights.path, f"{t.source_name or name}: {e}") from None
    return WeightMatrix(tensor, target, rows, cols, name)


def _norm(dev: Device, weights: WeightSource, name: str) -> Buffer:
    w = np.ascontiguousarray(weights.dequantize(name), dtype=np.float32)
    buf = dev.buffer(w.nbytes, name=name)
    dev.upload(buf, w)
    return buf


@dataclass
class Buffers:
    """The per-forward buffers: f32 rows for up to PREFILL_CHUNK tokens, q8_1 blocks for the
    int8 matvecs, the step/token buffers the host writes, and the kernels' arrival counters."""

    step: Buffer  # one Step (ops_common.STEP), host-mapped
    tokens: Buffer  # uint id per position, host-mapped
    tokens_view: npt.NDArray[np.uint32]
    x: Buffer  # the residual stream
    x_alt: Buffer  # decode's split norm_add reads the residual from one buffer and writes the other
    h: Buffer
    o: Buffer
    qkv: Buffer
    attn: Buffer
    mlp: Buffer
    xq: Buffer  # q8_1 of whatever a quantize dispatch quantized
    hq: Buffer  # q8_1 of h, from the norms
    attnq: Buffer  # q8_1 of attn, from decode attention
    mlpq: Buffer  # q8_1 of mlp, from the GEGLU
    block_arrival: Buffer
    mv_arrival: Buffer
    logits: Buffer
    partial: Buffer
    cand: Buffer
    counters: Buffer
    tok_stride: int = 0  # uint ids per KV slot in `tokens` (slot s's start at s * tok_stride)
    rows: BatchRows | None = None  # the batched decode step's per-row scratch (n_slots > 1)


@dataclass
class BatchRows:
    """Per-row scratch of the batched decode step (batch.py): row r binds `stride` bytes at
    r * stride of each, so the rows' attention and sampler never share a counter or a partial."""

    steps: Buffer  # one Step per row, host-mapped
    partial: Buffer
    counters: Buffer
    cand: Buffer
    step_stride: int
    partial_stride: int
    counters_stride: int
    cand_stride: int


def allocate_buffers(
    dev: Device, cfg: ModelConfig, plan: MemoryPlan, context_length: int, layers: list[Layer]
) -> Buffers:
    """Every buffer a recording binds besides the weights; zeroes the KV caches and counters."""
    T = PREFILL_CHUNK
    f = 4
    qkv_dim = cfg.q_dim + 2 * cfg.kv_dim
    step = dev.buffer(STEP_BYTES, host=True, name="step")
    tok_stride = context_length + 2
    # every slot's ids, then a pad row's (a batched step's unused rows draw into it)
    tokens = dev.buffer((plan.n_slots + 1) * tok_stride * 4, host=True, name="tokens")
    x = dev.buffer(T * cfg.hidden_size * f, name="x")
    x_alt = dev.buffer(cfg.hidden_size * f, name="x_alt")
    h = dev.buffer(T * cfg.hidden_size * f, name="h")
    o = dev.buffer(T * cfg.hidden_size * f, name="o")
    qkv = dev.buffer(T * qkv_dim * f, name="qkv")
    attn = dev.buffer(T * cfg.q_dim * f, name="attn")
    mlp = dev.buffer(T * cfg.intermediate_size * f, name="mlp")
    xq = dev.buffer(q8_1_bytes(T * max(cfg.intermediate_size, cfg.q_dim, cfg.hidden_size)), name="xq")
    hq = dev.buffer(T * q8_1_bytes(cfg.hidden_size), name="hq")
    attnq = dev.buffer(q8_1_bytes(cfg.q_dim), name="attnq")
    mlpq = dev.buffer(q8_1_bytes(cfg.intermediate_size), name="mlpq")
    # arrival counters (left at 0) of the GEGLU's q8_1 blocks (workgroups sharing a block) and
    # of the QKV matvec's heads (rope epilogue); barriers separate the two uses
    block_arrival = dev.buffer(
        4 * max(-(-cfg.intermediate_size // 32), cfg.num_heads + 2 * cfg.num_kv_heads), name="block_arrival"
    )
    # arrival counter of the decode o-proj/down matvecs with the norm tail (they leave it 0)
    mv_arrival = dev.buffer(16, name="matvec_arrival")
    dev.upload(mv_arrival, np.zeros(4, np.uint32))
    batch_logits = plan.batch_rows * batch_logits_stride(cfg.vocab_size)  # batched rows, each aligned
    logits = dev.buffer(max(LOGITS_CHUNK * cfg.vocab_size, batch_logits) * f, name="logits")
    partial = dev.buffer(
        ops_attention.partial_floats(cfg.num_heads, cfg.head_dim, plan.n_splits) * f, name="attn_partial"
    )
    cand = dev.buffer(ops_sample.scratch_bytes(cfg.vocab_size), name="sample_candidates")
    # arrival counters of the one-dispatch attention and sampler, shared: each leaves them 0
    counters = dev.buffer(4 * ops_attention.counter_words(cfg.num_kv_heads), name="arrival_counters")
    # zero the KV caches: attention never reads unwritten slots, but NaN garbage * 0 is NaN
    rows = _batch_rows(dev, cfg, plan) if plan.batch_rows else None
    cl = dev.commands()
    if rows is not None:
        cl.fill(rows.counters, 0)
    for L in layers:
        cl.fill(L.k_cache, 0)
        cl.fill(L.v_cache, 0)
    cl.fill(counters, 0)  # once: the kernels return them to 0
    cl.fill(block_arrival, 0)
    cl.submit()
    cl.destroy()
    return Buffers(
        step,
        tokens,
        tokens.view(np.uint32),
        x,
        x_alt,
        h,
        o,
        qkv,
        attn,
        mlp,
        xq,
        hq,
        attnq,
        mlpq,
        block_arrival,
        mv_arrival,
        logits,
        partial,
        cand,
        counters,
        tok_stride,
        rows,
    )


def _batch_rows(dev: Device, cfg: ModelConfig, plan: MemoryPlan) -> BatchRows:
    n = plan.batch_rows
    strides = (
        STEP_ROW_BYTES,  # the _rows kernels index the Steps as an array of this stride
        row_stride(ops_attention.partial_floats(cfg.num_heads, cfg.head_dim, plan.n_splits) * 4),
        row_stride(4 * ops_attention.counter_words(cfg.num_kv_heads)),
        row_stride(ops_sample.scratch_bytes(cfg.vocab_size)),
    )
    return BatchRows(
        dev.buffer(n * strides[0], host=True, name="batch_steps"),
        dev.buffer(n * strides[1], name="batch_attn_partial"),
        dev.buffer(n * strides[2], name="batch_arrival_counters"),
        dev.buffer(n * strides[3], name="batch_sample_candidates"),
        *strides,
    )
