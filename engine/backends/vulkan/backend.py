"""The Vulkan backend: Gemma 3 on any Vulkan 1.2+ GPU (lavapipe in CI).

Weights are uploaded once in their file types and dequantized inside the kernels. Every
forward pass is a recorded command list, recorded once per (token count, output kind) and
replayed; the per-step values live in the step buffer (shaders/include/step.glsl), the token
ids in the `tokens` buffer. The decode step samples on the GPU, writes the id into `tokens`
and advances the position itself, so a decode token costs the host one submit, one fence wait
and one 4-byte read. Small models record several token steps per command buffer
(`steps_per_submit`) and keep three submissions queued, so the GPU never waits for the host.
On GPUs the matvec path (f32 / int8 / int8 quantized in registers) and workgroup shape are
chosen per matrix shape by timing them at load (`tuning`); `profile_decode()` times every op.

One decode layer, as recorded (B = barrier; 5 dispatches, 6 where down takes the q8_1 int8 path
and the GEGLU does not write its q8_1 blocks itself):
  QKV matvec (fused) B  QK-norm+RoPE+KV write B  attention B
  o matvec + norm_add (x += norm(o); h = norm(x)) B  gate/up GEGLU matvec [+ q8_1 of its output] B
  [quantize B] down matvec + norm_add (next layer's h) B
The matvec's last workgroup to finish runs the norm_add (`NormTail`) where timing says so; else
the matvec is followed by a norm_add spread over many workgroups (`ops_norm.norm_add_split`),
which moves the residual between `x` and `x_alt`. Where the matvec reading h
(QKV, gate/up, LM head) takes the q8_1 int8 path, that norm_add (or the first norm) also writes
h's q8_1 blocks into `hq`, so those matvecs need no quantize dispatch; likewise attention writes
its output's q8_1 blocks into `attnq` for an int8 o matvec, and the GEGLU its output's into
`mlpq` for an int8 down matvec (`geglu_q8_1`, where timing says it pays). Prefill (T > 1) runs GEMMs and
separate norm_add dispatches.
"""
from __future__ import annotations

import itertools
import os
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as QType

from engine.backends.base import Backend, LiveStats
from engine.backends.vulkan import (kv_handoff, ops_attention, ops_embed, ops_gemm, ops_norm, ops_rope,
                                    ops_sample, timing)
from engine.backends.vulkan.device import Device
from engine.backends.vulkan.matvec import (MAX_COLUMNS, SUPPORTED, NormTail, RopeTail, WeightMatrix, default_spec, fusable,
                                           out_q8_1_ok, q8_1_bytes, record_matvec, record_quantize, regs_ok, rope_tail_ok)
from engine.backends.vulkan.memory import Tensor
from engine.backends.vulkan.ops_common import pack_step
from engine.backends.vulkan.ops_quantize_weights import SOURCE_KINDS, quantize_tensor
from engine.backends.vulkan.ops_table import EMBED_TYPES
from engine.backends.vulkan.pipelines import INT_DOT_TYPES
from engine.errors import OutOfMemoryError, UnsupportedModelError
from engine.sampling import SamplingParams
from engine.weights.base import WeightSource

QUANT_TYPES = {"q4_0": QType.Q4_0, "q8_0": QType.Q8_0, "f16": QType.F16}
PREFILL_CHUNK = 512       # tokens per prefill submission (GEMM rows: more reuse of each dequantized weight tile); local KV rings hold window + this
LOGITS_CHUNK = 32         # tokens per submission when every position's logits come back
MAX_RECORDINGS = 8
TUNE_LAYERS = 8           # layers the load-time timing cycles through (`_tuning_layers`)
IN_FLIGHT = 3             # decode steps queued ahead: hides submit-to-start latency on the GPU
REGS_SPEC = {"WG": 32, "ROWS": 2, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4}


@dataclass
class _Layer:
    qkv: list             # [q, k, v] WeightMatrix
    o: WeightMatrix
    gate: WeightMatrix
    up: WeightMatrix
    down: WeightMatrix
    norms: dict           # name -> Buffer (f32 multipliers)
    k_cache: object
    v_cache: object
    slots: int
    is_global: bool


class VulkanBackend(Backend):
    name = "vulkan"

    def __init__(self, weights: WeightSource, context_length: int, *, device_index: int | None = None,
                 allow_software: bool = False, quant: str | None = None, progress=None,
                 int_dot: bool | None = None, device: Device | None = None, autotune: bool | None = None,
                 few_token_matvec: bool | None = None):
        super().__init__(weights.config, context_length)
        cfg = self.config
        if quant is not None and quant not in QUANT_TYPES:
            raise ValueError(f"quant must be one of {sorted(QUANT_TYPES)}, got {quant!r}")
        self.quant = quant
        self.weights_source = weights
        self._own_device = device is None
        self.dev = dev = device or Device.open(device_index, allow_software=allow_software)
        self.device_name = dev.name
        caps = dev.caps
        # int8 activations only where the dot instruction is real hardware (unless forced)
        self.int_dot = bool(caps.int_dot and (caps.int_dot_accelerated if int_dot is None else int_dot))
        # forwards of 2..MAX_COLUMNS tokens (speculative verify, short prompts) through matvecs
        # that read each weight once for all of them, or through the GEMMs, which dequantize a
        # whole weight tile for a handful of rows (H100, 27B shape: a 2-token GEMM pass cost 14
        # decode tokens, the matvecs 4; on the 270M shape the GEMMs win at some counts). The
        # token counts that take the matvecs: all (True), none (False), or None: timed both ways
        # at load on GPUs (`_choose_few_token_path`); CPU devices keep their register-tiled GEMM.
        self.few_token_matvec: frozenset = (frozenset(range(2, MAX_COLUMNS + 1)) if few_token_matvec
                                            else frozenset())
        self.few_token_timing: dict = {}
        self._progress = progress
        try:
            self._plan_and_check(weights)
            self._upload(weights)
            self._allocate()
        except BaseException:
            self.close()
            raise
        self._recordings: OrderedDict = OrderedDict()
        self._busy: deque = deque()      # (host time at completion, GPU seconds) per command list
        self._decode_lists: dict = {}
        self.tuning: dict = {}
        self.norm_tail: dict = {}     # key -> run the following norm_add in the matvec's last workgroup (tuned)
        if autotune if autotune is not None else not caps.is_software:
            self._autotune()
        # (int_dot, spec) of a decode GEGLU that also writes mlp's q8_1 blocks for the int8 down
        # matvec (no quantize dispatch between them), or None
        self.geglu_q8_1 = self._choose_geglu_q8_1()
        # (int_dot, spec) of a decode QKV matvec whose last workgroup per head runs QK-norm +
        # RoPE + the KV write (no rope dispatch), or None
        self.qkv_rope = self._choose_qkv_rope()
        self._py_time = 0.0
        self._py_tokens = 0
        if few_token_matvec is None and not caps.is_software:
            self.few_token_matvec = self._choose_few_token_path()

    # ---- loading -------------------------------------------------------------------------

    def _target_type(self, name: str, qtype: QType) -> QType:
        if self.quant is None:
            return qtype
        return QUANT_TYPES[self.quant]

    def _plan_and_check(self, weights: WeightSource) -> None:
        """Bytes of weights + KV cache + scratch vs the device heap, before allocating anything."""
        cfg, dev = self.config, self.dev
        self._tied = "lm_head" not in weights.tensors
        w_bytes = 0
        for name, t in weights.tensors.items():
            if t.is_norm:
                w_bytes += int(np.prod(t.shape)) * 4
                continue
            qt = self._embed_type(t.qtype) if name == "embed_tokens" else self._target_type(name, t.qtype)
            block, size = _quant_size(qt)
            w_bytes += int(np.prod(t.shape)) // block * size
        self.slots = [self.context_length if cfg.is_global_layer(i)
                      else min(self.context_length, cfg.sliding_window + PREFILL_CHUNK)
                      for i in range(cfg.num_layers)]
        kv_bytes = sum(self.slots) * cfg.kv_dim * 2 * 2
        T = PREFILL_CHUNK
        acts = (T * (3 * cfg.hidden_size + cfg.q_dim + 2 * cfg.kv_dim + cfg.q_dim + cfg.intermediate_size)
                + cfg.hidden_size) * 4          # + x_alt
        self.n_splits = ops_attention.default_splits(self.context_length)
        scratch = (acts + LOGITS_CHUNK * cfg.vocab_size * 4 + ops_sample.scratch_bytes(cfg.vocab_size)
                   + ops_attention.partial_floats(cfg.num_heads, cfg.head_dim, self.n_splits) * 4
                   + q8_1_bytes(T * max(cfg.intermediate_size, cfg.q_dim, cfg.hidden_size))
                   + T * q8_1_bytes(cfg.hidden_size) + q8_1_bytes(cfg.q_dim)
                   + (self.context_length + 2) * 4 + Device.STAGING_BYTES)
        self.budget = {"weights": w_bytes, "kv_cache": kv_bytes, "scratch": scratch}
        need = w_bytes + kv_bytes + scratch
        heap = dev.caps.device_local_bytes
        usable = int(heap * (0.8 if dev.caps.uma else 0.92))
        if need > usable:
            gib = 2 ** 30
            raise OutOfMemoryError(
                f"{cfg.name} needs {need / gib:.2f} GiB on {dev.name} (weights {w_bytes / gib:.2f}, KV cache "
                f"{kv_bytes / gib:.2f} for {self.context_length} tokens, scratch {scratch / gib:.2f}) but "
                f"{usable / gib:.2f} GiB of its {heap / gib:.2f} GiB can be used: pick a smaller quant "
                f"(--quant q4_0) or a shorter context (--ctx)")

    def _embed_type(self, qtype: QType) -> QType:
        want = self._target_type("embed_tokens", qtype)
        if self.quant == "q4_0":
            want = QType.Q8_0     # llama.cpp keeps embeddings at 8 bits in Q4_0 files too
        return want if want.name in EMBED_TYPES else QType.Q8_0

    def _report(self, done: float, what: str) -> None:
        if self._progress:
            self._progress(done, what)

    def _weight(self, weights: WeightSource, name: str, target: QType) -> WeightMatrix:
        """The tensor on the device as `target`: its own bytes when the types agree, else
        re-quantized by the device from the file's f32/f16/bf16 values (other types are
        dequantized to f32 by the host first)."""
        t = weights.tensors[name]
        if target not in SUPPORTED:
            raise UnsupportedModelError(weights.path, f"{t.source_name or name}: type {target.name} has no Vulkan kernel")
        if t.qtype == target:
            return WeightMatrix.upload(self.dev, weights.raw(name), target, t.shape, name=name)
        if t.qtype in SOURCE_KINDS:
            source, kind = weights.raw(name), t.qtype
        else:
            source, kind = np.ascontiguousarray(weights.dequantize(name), dtype=np.float32), QType.F32
        try:
            tensor = quantize_tensor(self.dev, source, kind, target, t.shape, name=name)
        except ValueError as e:
            raise UnsupportedModelError(weights.path, f"{t.source_name or name}: {e}") from None
        return WeightMatrix(tensor, target, t.shape[0], t.shape[1], name)

    def _matrix(self, weights, name) -> WeightMatrix:
        return self._weight(weights, name, self._target_type(name, weights.tensors[name].qtype))

    def _norm(self, weights, name):
        w = np.ascontiguousarray(weights.dequantize(name), dtype=np.float32)
        buf = self.dev.buffer(w.nbytes, name=name)
        self.dev.upload(buf, w)
        return buf

    def _upload(self, weights: WeightSource) -> None:
        cfg, dev = self.config, self.dev
        total = len(weights.tensors)
        done = 0

        def tick(name):
            nonlocal done
            done += 1
            self._report(done / total, f"uploading {name}")

        et = weights.tensors["embed_tokens"]
        emb = self._weight(weights, "embed_tokens", self._embed_type(et.qtype))
        self.embed_type = emb.qtype
        self.embed_table: Tensor = emb.tensor
        tick("embed_tokens")
        if self._tied:
            self.lm_head = emb
        else:
            self.lm_head = self._matrix(weights, "lm_head")
            tick("lm_head")
        self.final_norm = self._norm(weights, "norm")
        tick("norm")
        self.layers: list[_Layer] = []
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            mats = {}
            for short in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
                mats[short] = self._matrix(weights, p + short)
                tick(p + short)
            norms = {}
            for short in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                          "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
                norms[short] = self._norm(weights, p + short)
                tick(p + short)
            if mats["mlp.gate_proj"].qtype != mats["mlp.up_proj"].qtype:
                raise UnsupportedModelError(weights.path, f"layer {i}: gate and up projections differ in type "
                                            "(the fused GEGLU kernel needs one type): load with --quant")
            kv_bytes = cfg.num_kv_heads * self.slots[i] * cfg.head_dim * 2
            self.layers.append(_Layer(
                qkv=[mats["self_attn.q_proj"], mats["self_attn.k_proj"], mats["self_attn.v_proj"]],
                o=mats["self_attn.o_proj"], gate=mats["mlp.gate_proj"], up=mats["mlp.up_proj"],
                down=mats["mlp.down_proj"], norms=norms,
                k_cache=dev.buffer(kv_bytes, name=f"k_cache.{i}"), v_cache=dev.buffer(kv_bytes, name=f"v_cache.{i}"),
                slots=self.slots[i], is_global=cfg.is_global_layer(i)))
        self.weight_bytes = sum(b.alloc_size for b in dev._buffers)

    def _allocate(self) -> None:
        cfg, dev = self.config, self.dev
        T = PREFILL_CHUNK
        f = 4
        self.qkv_dim = cfg.q_dim + 2 * cfg.kv_dim
        self.step = dev.buffer(64, host=True, name="step")
        self.tokens = dev.buffer((self.context_length + 2) * 4, host=True, name="tokens")
        self.tokens_view = self.tokens.view(np.uint32)
        self.x = dev.buffer(T * cfg.hidden_size * f, name="x")
        # decode's split norm_add reads the residual from one buffer and writes the other
        self.x_alt = dev.buffer(cfg.hidden_size * f, name="x_alt")
        self.h = dev.buffer(T * cfg.hidden_size * f, name="h")
        self.o = dev.buffer(T * cfg.hidden_size * f, name="o")
        self.qkv = dev.buffer(T * self.qkv_dim * f, name="qkv")
        self.attn = dev.buffer(T * cfg.q_dim * f, name="attn")
        self.mlp = dev.buffer(T * cfg.intermediate_size * f, name="mlp")
        self.xq = dev.buffer(q8_1_bytes(T * max(cfg.intermediate_size, cfg.q_dim, cfg.hidden_size)), name="xq")
        self.hq = dev.buffer(T * q8_1_bytes(cfg.hidden_size), name="hq")    # q8_1 of h, from the norms
        self.attnq = dev.buffer(q8_1_bytes(cfg.q_dim), name="attnq")   # q8_1 of attn, from decode attention
        self.mlpq = dev.buffer(q8_1_bytes(cfg.intermediate_size), name="mlpq")   # q8_1 of mlp, from the GEGLU
        # arrival counters (left at 0) of the GEGLU's q8_1 blocks (workgroups sharing a block) and
        # of the QKV matvec's heads (rope epilogue); barriers separate the two uses
        self.block_arrival = dev.buffer(4 * max(-(-cfg.intermediate_size // 32), cfg.num_heads + 2 * cfg.num_kv_heads),
                                        name="block_arrival")
        # arrival counter of the decode o-proj/down matvecs with the norm tail (they leave it 0)
        self.mv_arrival = dev.buffer(16, name="matvec_arrival")
        dev.upload(self.mv_arrival, np.zeros(4, np.uint32))
        self.logits = dev.buffer(LOGITS_CHUNK * cfg.vocab_size * f, name="logits")
        self.partial = dev.buffer(ops_attention.partial_floats(cfg.num_heads, cfg.head_dim, self.n_splits) * f,
                                  name="attn_partial")
        self.cand = dev.buffer(ops_sample.scratch_bytes(cfg.vocab_size), name="sample_candidates")
        # arrival counters of the one-dispatch attention and sampler, shared: each leaves them 0
        self.counters = dev.buffer(4 * ops_attention.counter_words(cfg.num_kv_heads), name="arrival_counters")
        # zero the KV caches: attention never reads unwritten slots, but NaN garbage * 0 is NaN
        cl = dev.commands()
        for L in self.layers:
            cl.fill(L.k_cache, 0)
            cl.fill(L.v_cache, 0)
        cl.fill(self.counters, 0)              # once: the kernels return them to 0
        cl.fill(self.block_arrival, 0)
        cl.submit()
        cl.destroy()

    # ---- recording -----------------------------------------------------------------------

    def _path(self, mats, key=None):
        """(int_dot, spec) the matvec of `mats` takes: the tuned choice for `key`, else the
        default; int8 only where every matrix has an int8 kernel (layers may differ in type)."""
        int_dot = self.int_dot and all(m.qtype.name in INT_DOT_TYPES for m in mats)
        spec = None
        if key in self.tuning:
            _us, tuned, spec = self.tuning[key]
            int_dot = tuned if int_dot else False
        return int_dot, spec

    def _h_q8_1(self, mats, key):
        """`hq` when the matvec of `mats` reading h runs the int8 path on q8_1 input: the norm that
        writes h then writes h's q8_1 blocks into it, and the matvec needs no quantize dispatch.
        A buffer of its own (not the shared `xq`): no later quantize can overwrite it first."""
        return self.hq if self._path(mats, key)[0] is True else None

    def _attn_q8_1(self, L: _Layer):
        """`attnq` when L's decode o-proj runs the int8 path on q8_1 input: attention then writes
        its output's q8_1 blocks into it (as `_h_q8_1` for h), and the o matvec needs no quantize."""
        return self.attnq if self._path([L.o], "o")[0] is True else None

    def _qkv_fused(self, L: _Layer) -> bool:
        """The decode QKV is one matvec (key "qkv"): one type (or v alone of another type with a
        kernel, as in llama.cpp's Q4_K_M), each matrix in one binding."""
        return all(len(m.tensor.ranges) == 1 for m in L.qkv) and fusable(L.qkv)

    def _mv(self, cl, mats, x, y, *, T, x_cols, y_cols, epilogue=None, x_off=0, y_off=0, key=None,
            force=None, xq=None, tail=None, y_q8_1=None, rope=None):
        """One (possibly fused) matvec over T tokens, through the int8 path where it applies;
        several tokens go through the tiled GEMM (weights read once per 64 tokens).
        xq: the q8_1 blocks of x already exist there (written by the norm that produced x; same
        offsets): the int8 path reads them instead of recording a quantize dispatch.
        tail: a NormTail run by the matvec's last workgroup (T == 1, one matrix in one binding).
        y_q8_1: with epilogue "geglu_q8_1", where the GEGLU writes y's q8_1 blocks.
        rope: a RopeTail run per head after the fused decode QKV (epilogue "rope")."""
        arrival = self.block_arrival if epilogue == "geglu_q8_1" else None
        if tail is not None:
            assert T == 1 and epilogue is None
            epilogue = "norm"
        if rope is not None:
            assert T == 1 and epilogue is None
            epilogue = "rope"
        if T in self.few_token_matvec and x_off == 0:
            assert epilogue in (None, "geglu")
            off = 0
            for group in ([mats] if epilogue or fusable(mats) else [[m] for m in mats]):
                record_matvec(cl, self.dev, group, x, y, epilogue=epilogue, x_stride=x_cols, y_stride=y_cols,
                              y_off=y_off + off, columns=T)
                off += sum(m.rows for m in group)
            return
        if T > 1 and x_off == 0:
            if y_off:
                y = (y, y_off * 4, y.size - y_off * 4)
            if epilogue == "geglu":
                ops_gemm.gemm(cl, self.dev, x, mats[0].tensor, y, wtype=mats[0].qtype.name, m=T, n=mats[0].rows,
                              k=x_cols, x_stride=x_cols, y_stride=y_cols, w_up=mats[1].tensor)
                return
            assert epilogue is None
            off = 0
            for m in mats:       # fused QKV: one GEMM per matrix into its columns of y
                yb = y if off == 0 else ((y, off * 4, y.size - off * 4) if not isinstance(y, tuple)
                                         else (y[0], y[1] + off * 4, y[2] - off * 4))
                ops_gemm.gemm(cl, self.dev, x, m.tensor, yb, wtype=m.qtype.name, m=T, n=m.rows, k=x_cols,
                              x_stride=x_cols, y_stride=y_cols)
                off += m.rows
            return
        int_dot, spec = force if force is not None else self._path(mats, key)
        if int_dot == "regs":
            if spec is None or spec.get("THREAD_ROWS"):
                spec = REGS_SPEC          # the block-pair path lives in the cooperative kernels
            record_matvec(cl, self.dev, mats, x, y, epilogue=epilogue, int_dot="regs", tokens=T, x_off=x_off,
                          x_stride=x_cols, y_stride=y_cols, y_off=y_off, spec=spec, tail=tail, y_q8_1=y_q8_1, arrival=arrival, rope=rope)
        elif int_dot and xq is not None:
            record_matvec(cl, self.dev, mats, xq, y, epilogue=epilogue, int_dot=True, tokens=T,
                          x_off=x_off // 32, x_stride=x_cols // 32, y_stride=y_cols, y_off=y_off, spec=spec,
                          tail=tail, y_q8_1=y_q8_1, arrival=arrival, rope=rope)
        elif int_dot:
            record_quantize(cl, self.dev, x, self.xq, T * x_cols, x_off=x_off)
            self._mark(cl, "quantize")
            record_matvec(cl, self.dev, mats, self.xq, y, epilogue=epilogue, int_dot=True, tokens=T,
                          x_stride=x_cols // 32, y_stride=y_cols, y_off=y_off, spec=spec, tail=tail, y_q8_1=y_q8_1, arrival=arrival, rope=rope)
        else:
            record_matvec(cl, self.dev, mats, x, y, epilogue=epilogue, tokens=T, x_off=x_off,
                          x_stride=x_cols, y_stride=y_cols, y_off=y_off, spec=spec, tail=tail, y_q8_1=y_q8_1, arrival=arrival, rope=rope)

    def _other_residual(self, res):
        return self.x_alt if res is self.x else self.x

    def _mv_norm_add(self, cl, m: WeightMatrix, x, *, T: int, x_cols: int, key: str, label: str,
                     w_post, w_next, res, hq=None, xq=None) -> tuple[str, object]:
        """o = m x, then res += rmsnorm(o) * w_post; h = rmsnorm(res) * w_next (+ q8_1 of h into
        hq). Decode: one dispatch where tuned so (the matvec's last workgroup runs the norm), else
        the matvec, a barrier and the split norm_add, which writes the residual to the other of
        x / x_alt; prefill: the matvec and a norm_add per row, in place. xq: x's q8_1 blocks, as
        for `_mv`. Returns the profile label of what is still open (no barrier after) and the
        buffer that now holds the residual."""
        cfg = self.config
        H = cfg.hidden_size
        if T == 1 and len(m.tensor.ranges) == 1 and self.norm_tail.get(key, True):
            self._mv(cl, [m], x, self.o, T=1, x_cols=x_cols, y_cols=H, key=key, xq=xq,
                     tail=NormTail(w_post, res, w_next, self.h, self.mv_arrival, cfg.rms_norm_eps, q=hq))
            return label + "+norm_add", res
        self._mv(cl, [m], x, self.o, T=T, x_cols=x_cols, y_cols=H, key=key, xq=xq)
        self._mark(cl, label)
        if T == 1:
            out = self._other_residual(res)
            ops_norm.norm_add_split(cl, self.dev, self.o, w_post, res, w_next, self.h, out, n=H,
                                    eps=cfg.rms_norm_eps, q=hq)
            return "norm_add", out
        ops_norm.norm_add(cl, self.dev, self.o, w_post, res, w_next, self.h, rows=T, n=H, eps=cfg.rms_norm_eps,
                          q=hq)
        return "norm_add", res

    def _rope_tail(self, i: int) -> RopeTail:
        cfg, L = self.config, self.layers[i]
        return RopeTail(self.step, L.norms["self_attn.q_norm"], L.norms["self_attn.k_norm"], L.k_cache, L.v_cache,
                        self.block_arrival, head_dim=cfg.head_dim, n_heads=cfg.num_heads,
                        n_kv_heads=cfg.num_kv_heads, cache_slots=L.slots, theta=cfg.rope_base(i),
                        scale_factor=cfg.rope_scale(i), eps=cfg.rms_norm_eps)

    def _rope_kv(self, cl, i: int, T: int) -> None:
        """QK-norm + RoPE of q in place, k and v into layer i's cache (its own dispatch)."""
        cfg, L = self.config, self.layers[i]
        ops_rope.rope_kv(cl, self.dev, self.step, self.qkv, self.qkv, self.qkv, L.norms["self_attn.q_norm"],
                         L.norms["self_attn.k_norm"], L.k_cache, L.v_cache, head_dim=cfg.head_dim,
                         n_heads=cfg.num_heads, n_kv_heads=cfg.num_kv_heads, cache_slots=L.slots,
                         theta=cfg.rope_base(i), scale_factor=cfg.rope_scale(i), eps=cfg.rms_norm_eps,
                         max_tokens=T, q_stride=self.qkv_dim, kv_stride=self.qkv_dim, q_offset=0,
                         k_offset=cfg.q_dim, v_offset=cfg.q_dim + cfg.kv_dim)

    def _choose_qkv_rope(self):
        """The decode QKV matvec can run each head's rope in its last workgroup (per-head arrival
        counters) where its workgroups' rows lie within one head. Tuned devices keep it only if
        timing says so (the fused kernel in the QKV's tuned shape and in subgroup-row shapes,
        whose workgroups hold more of a head, against the tuned matvec, a barrier and the rope
        dispatch); untuned ones take it whenever it applies."""
        L, H = self.layers[0], self.config.hidden_size
        if not self._qkv_fused(L):
            return None
        int_dot, spec = self._path(L.qkv, "qkv")
        if int_dot == "regs" and spec is None:
            spec = REGS_SPEC
        spec = spec or default_spec(self.dev)
        if "qkv" not in self.tuning:
            return (int_dot, spec) if rope_tail_ok(spec, self.config.head_dim) else None
        hq = self.hq if int_dot is True else None
        sg = max(8, min(64, self.dev.caps.subgroup_size))
        fused_specs = []
        for cand in ([spec] if int_dot == "regs" else
                     [spec, default_spec(self.dev), {"WG": 4 * sg, "ROWS": 1, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4}]):
            if rope_tail_ok(cand, self.config.head_dim) and cand not in fused_specs:
                fused_specs.append(cand)
        if not fused_specs:
            return None

        tuning_layers = self._tuning_layers(lambda L: L.qkv)

        def separate(cl, layers=itertools.cycle(tuning_layers)):
            i = next(layers)
            self._mv(cl, self.layers[i].qkv, self.h, self.qkv, T=1, x_cols=H, y_cols=self.qkv_dim,
                     force=(int_dot, spec), xq=hq)
            cl.barrier()
            self._rope_kv(cl, i, 1)

        records = {"separate": separate}
        for k, fs in enumerate(fused_specs):
            def fused(cl, fs=fs, layers=itertools.cycle(tuning_layers)):
                i = next(layers)
                self._mv(cl, self.layers[i].qkv, self.h, self.qkv, T=1, x_cols=H, y_cols=self.qkv_dim,
                         force=(int_dot, fs), xq=hq, rope=self._rope_tail(i))
            records[k] = fused
        self._write_step(pos=min(self.context_length - 1, 512), n_tokens=1)
        times = timing.time_many(self.dev, records, reps=10)
        sep = times.pop("separate")
        k = min(times, key=times.get)
        self.qkv_rope_timing = {"fused_us": round(times[k], 1), "qkv_and_rope_us": round(sep, 1)}
        return (int_dot, fused_specs[k]) if times[k] < sep else None

    def _choose_few_token_path(self, counts=range(2, MAX_COLUMNS + 1), repeats: int = 2) -> frozenset:
        """Time forwards of a few tokens (all logits back, as a speculative verify pass asks)
        through the multi-column matvecs and through the GEMMs; return the counts where the
        matvecs were faster. The smallest and largest count first: where both agree (big models:
        the matvecs win throughout), the rest follow without timing (each 27B trial is ~0.1 s)."""
        counts = list(counts)
        ms: dict = {}

        def trial(todo):
            for path in ("matvec", "gemm"):
                self.few_token_matvec = frozenset(counts) if path == "matvec" else frozenset()
                self._drop_recordings()
                for T in todo:
                    ids = [self.config.bos_token_id] * T
                    self.forward(ids, 0, all_logits=True)      # records it, builds the pipelines
                    times = []
                    for _ in range(repeats):
                        t = time.perf_counter()
                        self.forward(ids, 0, all_logits=True)
                        times.append(time.perf_counter() - t)
                    ms.setdefault(T, {})[path + "_ms"] = round(1e3 * min(times), 2)
            return {T: t["matvec_ms"] < t["gemm_ms"] for T, t in ms.items()}

        wins = trial(sorted({counts[0], counts[-1]}))
        if wins[counts[0]] != wins[counts[-1]]:
            wins = trial([T for T in counts if T not in ms])
        self._drop_recordings()
        self.few_token_timing = dict(sorted(ms.items()))
        return frozenset(T for T in counts if wins.get(T, wins[counts[0]]))

    def _geglu_q8_1_applies(self, L: _Layer) -> bool:
        """L's decode GEGLU can write its output's q8_1 blocks for L's down matvec: down reads q8_1
        blocks (int8 path, not quantized in registers) and gate/up take the path `geglu_q8_1` was
        chosen for (layers may differ in type)."""
        idot = self._path([L.gate, L.up], "geglu")[0]
        return self._path([L.down], "down")[0] is True and idot == self.geglu_q8_1[0] and \
            self.config.intermediate_size % 32 == 0

    def _geglu_q8_1_specs(self) -> list[dict]:
        """Workgroup shapes that make whole q8_1 blocks (matvec.out_q8_1_ok): the GEGLU's tuned
        shape where it qualifies (its workgroups then share blocks through arrival counters),
        and shapes of 32 rows per workgroup (no counters, but fewer workgroups)."""
        I, caps = self.config.intermediate_size, self.dev.caps
        tuned = self.tuning.get("geglu")
        if caps.is_software:
            wg = caps.subgroup_size
            specs = [{"WG": wg, "ROWS": max(1, 32 // wg), "THREAD_ROWS": 1, "SUBGROUP_ROWS": 0}]
        else:
            sg = max(8, min(64, caps.subgroup_size))
            specs = ([tuned[2]] if tuned and tuned[2] else []) + [default_spec(self.dev)]
            specs += [{"WG": 4 * sg, "ROWS": r, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 32 // r} for r in (2, 4, 8)]
        out = []
        for s in specs:
            if out_q8_1_ok(s, I) and s not in out:
                out.append(s)
        return out

    def _choose_geglu_q8_1(self):
        """Where the down matvec reads q8_1 blocks, the GEGLU before it can write them (a
        quantize dispatch and a barrier fewer per layer). Tuned devices keep it only if timing
        says so (block arrival counting, or 32-row workgroups that stream worse, can cost more
        than the dispatch saved); untuned ones (CPU Vulkan) take it whenever it applies."""
        L = self.layers[0]
        specs = self._geglu_q8_1_specs()
        if not specs or self._path([L.down], "down")[0] is not True:
            return None
        int_dot, tuned_spec = self._path([L.gate, L.up], "geglu")
        if int_dot == "regs" and self.dev.caps.is_software:
            return None
        if "geglu" not in self.tuning:
            return (int_dot, specs[0])
        cfg = self.config
        H, I = cfg.hidden_size, cfg.intermediate_size

        tuning_layers = self._tuning_layers(lambda L: [L.gate, L.up])

        def separate(cl, layers=itertools.cycle(tuning_layers)):
            L = self.layers[next(layers)]
            self._mv(cl, [L.gate, L.up], self.h, self.mlp, T=1, x_cols=H, y_cols=I, epilogue="geglu",
                     force=(int_dot, tuned_spec), xq=self.hq)
            cl.barrier()
            record_quantize(cl, self.dev, self.mlp, self.xq, I)
        records = {"separate": separate}
        for i, spec in enumerate(specs):
            def fused(cl, spec=spec, layers=itertools.cycle(tuning_layers)):
                L = self.layers[next(layers)]
                self._mv(cl, [L.gate, L.up], self.h, self.mlp, T=1, x_cols=H, y_cols=I, epilogue="geglu_q8_1",
                         force=(int_dot, spec), xq=self.hq, y_q8_1=self.mlpq)
            records[i] = fused
        times = timing.time_many(self.dev, records, reps=10)
        sep_us = times.pop("separate")
        i = min(times, key=times.get)
        best = (times[i], specs[i])
        self.geglu_q8_1_timing = {"fused_us": round(best[0], 1), "geglu_and_quantize_us": round(sep_us, 1)}
        return (int_dot, best[1]) if best[0] < sep_us else None

    # ---- tuning and profiling ------------------------------------------------------------------

    def _mark(self, cl, label: str) -> None:
        """A barrier; when profiling, also a timestamp that closes the op named `label`."""
        cl.barrier()
        prof = getattr(cl, "profile_labels", None)
        if prof is not None and len(prof) + 1 < cl.n_timestamps:
            prof.append(label)
            cl.timestamp(len(prof))

    def _tuning_layers(self, pick) -> list[int]:
        """Layers whose matrices `pick(L)` match layer 0's in type and shape, up to TUNE_LAYERS:
        the timed candidates cycle through them, so each repeat reads its weights from memory
        as a decode step does (one matrix repeated stays partly in a big GPU's L2: an H100 read
        a 27B QKV at 2.6 TB/s that way against 1.8 from memory, and ranked shapes differently)."""
        sig = [(m.qtype, m.rows, m.cols) for m in pick(self.layers[0])]
        return [i for i, L in enumerate(self.layers)
                if [(m.qtype, m.rows, m.cols) for m in pick(L)] == sig][:TUNE_LAYERS]

    def _matvec_cases(self):
        """key -> (matrix lists, one per tuning layer, x, y, x_cols, y_cols, epilogue)."""
        cfg, L = self.config, self.layers[0]
        H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
        picks = {"o": lambda L: [L.o], "geglu": lambda L: [L.gate, L.up], "down": lambda L: [L.down]}
        if fusable(L.qkv):
            picks["qkv"] = lambda L: L.qkv
        shapes = {"o": (self.attn, self.o, cfg.q_dim, H, None), "geglu": (self.h, self.mlp, H, I, "geglu"),
                  "down": (self.mlp, self.o, I, H, None), "qkv": (self.h, self.qkv, H, self.qkv_dim, None)}
        cases = {k: ([pick(self.layers[i]) for i in self._tuning_layers(pick)], *shapes[k])
                 for k, pick in picks.items()}
        if len(self.lm_head.tensor.ranges) == 1:
            cases["lm"] = ([[self.lm_head]], self.h, self.logits, H, V, None)
        return cases

    def _autotune(self) -> None:
        """Pick, per matvec shape of this model, the fastest kernel path (f32 / int8 activations)
        and workgroup shape on this device, by timing candidates on the real weights (~1 s)."""
        sg = max(8, min(64, self.dev.caps.subgroup_size))
        specs = [{"WG": 32, "ROWS": 4, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 0},
                 {"WG": 128, "ROWS": 2, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 0},
                 {"WG": 4 * sg, "ROWS": 2, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4},
                 {"WG": 4 * sg, "ROWS": 1, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 4},
                 {"WG": 2 * sg, "ROWS": 4, "THREAD_ROWS": 0, "SUBGROUP_ROWS": 2}]
        if self.dev.caps.is_software:
            specs = [{"WG": self.dev.caps.subgroup_size, "ROWS": 4, "THREAD_ROWS": 1, "SUBGROUP_ROWS": 0}]
        cases = self._matvec_cases()
        reps = 2 if self.dev.caps.is_software else 10
        # The matvecs reading h get its q8_1 blocks from the norm that writes h, the o-proj its
        # input's from attention (no quantize dispatch in decode), so their int8 path is timed
        # without one; hq and attnq hold real blocks.
        cl = self.dev.commands()
        record_quantize(cl, self.dev, self.h, self.hq, self.config.hidden_size)
        record_quantize(cl, self.dev, self.attn, self.attnq, self.config.q_dim)
        cl.submit()
        cl.destroy()
        # o-proj and down can run the following norm_add in their last workgroup (one dispatch and
        # barrier fewer, but one workgroup of the matvec's shape does the whole norm): timed both
        # ways, the tail with each workgroup shape, the plain matvec plus a norm_add dispatch.
        L0 = self.layers[0]
        tails = {"o": ("post_attention_layernorm", "pre_feedforward_layernorm"),
                 "down": ("post_feedforward_layernorm", "input_layernorm")}
        # every candidate of every matrix recorded first, then timed in one go (timing.time_many)
        candidates: dict = {}
        for key, (rotation, x, y, xc, yc, epi) in cases.items():
            mats = rotation[0]
            xq = self.hq if key in ("qkv", "geglu", "lm") else (self.attnq if key == "o" else None)
            tail = None
            if key in tails and len(mats[0].tensor.ranges) == 1:
                w_post, w_next = (L0.norms[n] for n in tails[key])
                tail = NormTail(w_post, self.x, w_next, self.h, self.mv_arrival, self.config.rms_norm_eps,
                                q=self.hq)
            paths = [False]
            if self.int_dot and all(m.qtype.name in INT_DOT_TYPES for m in mats):
                paths.append(True)
                if all(regs_ok(m) for m in mats):
                    paths.append("regs")
            for use_tail in ([True, False] if tail is not None else [False]):
                for int_dot in paths:
                    for si, spec in enumerate(specs if int_dot != "regs" or not self.dev.caps.is_software
                                              else [REGS_SPEC]):
                        def record(cl, layers=itertools.cycle(rotation), x=x, y=y, xc=xc, yc=yc, epi=epi, xq=xq,
                                   tail=tail, int_dot=int_dot, spec=spec, use_tail=use_tail):
                            # each repeat on the next tuning layer's matrices (_tuning_layers)
                            self._mv(cl, next(layers), x, y, T=1, x_cols=xc, y_cols=yc, epilogue=epi,
                                     force=(int_dot, spec), xq=xq, tail=tail if use_tail else None)
                            if tail is not None and not use_tail:
                                cl.barrier()
                                ops_norm.norm_add_split(cl, self.dev, y, tail.w_post, self.x, tail.w_next, self.h,
                                                        self.x_alt, n=yc, eps=self.config.rms_norm_eps, q=self.hq)
                        candidates[(key, use_tail, str(int_dot), si)] = (record, (int_dot, spec))
        times = timing.time_many(self.dev, {k: rec for k, (rec, _) in candidates.items()}, reps=reps)
        for (key, use_tail, _i, _s), us in sorted(times.items(), key=lambda kv: kv[1]):
            if key not in self.tuning:
                self.tuning[key] = (us, *candidates[(key, use_tail, _i, _s)][1])
                if key in tails and len(cases[key][0][0][0].tensor.ranges) == 1:
                    self.norm_tail[key] = use_tail

    def profile_decode(self) -> dict:
        """GPU time of one decode step by op kind (us), from timestamps after every barrier."""
        return self.profile_step(1)

    def profile_step(self, tokens: int = 1) -> dict:
        """GPU time by op kind (us) of one decode step (tokens = 1) or one prefill chunk of
        `tokens` (<= PREFILL_CHUNK, last-position logits), from timestamps after every barrier."""
        if not 1 <= tokens <= PREFILL_CHUNK:
            raise ValueError(f"profile_step: 1 <= tokens <= {PREFILL_CHUNK}")
        mode = "sample" if tokens == 1 else "last"
        cl = self._record(tokens, mode, greedy=True, penalty=False, profile=True)
        self.tokens_view[:tokens] = self.config.bos_token_id
        for _ in range(3):        # the first runs warm clocks and caches
            self._write_step(pos=0, n_tokens=tokens)
            cl.submit()
        ts = np.diff(cl.timestamps_ns(len(cl.profile_labels) + 1)) / 1e3
        out: dict = {}
        for label, us in zip(cl.profile_labels, ts):
            out[label] = out.get(label, 0.0) + float(us)
        out["total"] = float(sum(ts))
        out["dispatches"] = cl.dispatches
        out["barriers"] = cl.barriers
        cl.destroy()
        return out

    def _qkv(self, cl, L: _Layer, T: int, hq=None, rope: RopeTail | None = None) -> None:
        """qkv = [q; k; v] h. rope (decode): the fused matvec also runs each head's rope."""
        cfg = self.config
        q, k, v = L.qkv
        if rope is not None:
            self._mv(cl, L.qkv, self.h, self.qkv, T=1, x_cols=cfg.hidden_size, y_cols=self.qkv_dim,
                     force=self.qkv_rope, xq=hq if self.qkv_rope[0] is True else None, rope=rope)
            return
        if self._qkv_fused(L):
            self._mv(cl, L.qkv, self.h, self.qkv, T=T, x_cols=cfg.hidden_size, y_cols=self.qkv_dim, key="qkv",
                     xq=hq)
            return
        if T > 1:
            self._mv(cl, L.qkv, self.h, self.qkv, T=T, x_cols=cfg.hidden_size, y_cols=self.qkv_dim)
            return
        # types no fused kernel covers (MIXED_QKV_TYPES): three dispatches, no barrier between them
        for m, off in ((q, 0), (k, cfg.q_dim), (v, cfg.q_dim + cfg.kv_dim)):
            record_matvec(cl, self.dev, [m], self.h, self.qkv, y_off=off, tokens=T,
                          x_stride=cfg.hidden_size, y_stride=self.qkv_dim)

    def _record(self, T: int, mode: str, greedy: bool = True, penalty: bool = False, profile: bool = False,
                steps: int = 1):
        """mode: 'none' (fill the cache only), 'last' / 'all' (logits), 'sample' (decode step).
        steps > 1 (decode only): that many token steps back to back in one command buffer; each
        step's sampler advances step.pos, so the next one embeds the token just drawn."""
        cfg, dev = self.config, self.dev
        # Without profiling, two timestamps bracket the whole list: its GPU time feeds the busy gauge.
        busy_ts = 2 if dev.caps.timestamp_bits else 0
        cl = dev.commands(name=f"forward[{T},{mode}]", timestamps=(24 * cfg.num_layers + 32) if profile else busy_ts)
        assert steps == 1 or mode == "sample"
        if profile:
            cl.profile_labels = []
        if profile or busy_ts:
            cl.timestamp(0)
        for i in range(steps):
            if i:
                self._mark(cl, "sample")
            self._record_body(cl, T, mode, greedy, penalty)
        if profile:               # close the last op: the sampler (decode) or the LM head (prefill)
            self._mark(cl, "sample" if mode == "sample" else "lm_head")
        if busy_ts and not profile:
            cl.timestamp(1)
            cl.busy_timed = True
        return cl.end()

    def _account_busy(self, cl) -> None:
        """After a wait: remember how long the GPU worked on `cl` (timestamp queries)."""
        if getattr(cl, "busy_timed", False):
            gpu_s = float(cl.timestamps_ns(2)[1]) * 1e-9
            self._busy.append((time.perf_counter(), gpu_s))

    def busy_fraction(self, window_s: float = 1.0) -> float | None:
        """Share of the last `window_s` seconds the GPU spent on this engine's work (None: the
        device has no timestamps). An engine-side figure, so NVIDIA, Intel and lavapipe have one too."""
        if not self.dev.caps.timestamp_bits:
            return None
        now = time.perf_counter()
        while self._busy and self._busy[0][0] < now - window_s:
            self._busy.popleft()
        return min(1.0, sum(gpu for _, gpu in self._busy) / window_s)

    def _record_body(self, cl, T: int, mode: str, greedy: bool, penalty: bool) -> None:
        cfg, dev = self.config, self.dev
        eps = cfg.rms_norm_eps
        H = cfg.hidden_size
        ops_embed.embed(cl, dev, self.step, self.tokens, self.embed_table, self.x, wtype=self.embed_type.name,
                        hidden=H, scale=float(np.float32(cfg.embed_scale)), max_tokens=T)
        self._mark(cl, "embed")
        # Decode: where the matvec reading h takes the int8 path, the norm writing h also writes
        # its q8_1 blocks (hq), so that matvec needs no quantize dispatch; attention does the
        # same for the o matvec (attnq).
        dec = T == 1

        def qkv_hq(L):
            return self._h_q8_1(L.qkv, "qkv") if dec and self._qkv_fused(L) else None

        hq = qkv_hq(self.layers[0])
        ops_norm.norm(cl, dev, self.x, self.layers[0].norms["input_layernorm"], self.h, rows=T, n=H, eps=eps,
                      q=hq)
        open_op = "norm"           # the op the next barrier closes (profile label)
        res = self.x               # the buffer holding the residual stream (decode alternates)
        for i, L in enumerate(self.layers):
            self._mark(cl, open_op)
            if dec and self.qkv_rope is not None and self._qkv_fused(L) and \
                    self._path(L.qkv, "qkv")[0] == self.qkv_rope[0]:
                self._qkv(cl, L, T, hq=hq, rope=self._rope_tail(i))
                self._mark(cl, "qkv+rope_kv")
            else:
                self._qkv(cl, L, T, hq=hq)
                self._mark(cl, "qkv")
                self._rope_kv(cl, i, T)
                self._mark(cl, "rope_kv")
            window = 0 if L.is_global else cfg.sliding_window
            attnq = self._attn_q8_1(L) if dec else None      # the int8 o matvec's input blocks
            if T == 1:
                ops_attention.attention_decode(cl, dev, self.step, self.qkv, L.k_cache, L.v_cache, self.partial,
                                               self.counters, self.attn, head_dim=cfg.head_dim,
                                               n_heads=cfg.num_heads, n_kv_heads=cfg.num_kv_heads,
                                               cache_slots=L.slots, window=window, scale=cfg.attn_scale,
                                               n_splits=self.n_splits, q_offset=0, q=attnq)
            else:
                ops_attention.attention_prefill(cl, dev, self.step, self.qkv, L.k_cache, L.v_cache, self.attn,
                                                head_dim=cfg.head_dim, n_heads=cfg.num_heads,
                                                n_kv_heads=cfg.num_kv_heads, cache_slots=L.slots, window=window,
                                                scale=cfg.attn_scale, max_tokens=T, q_stride=self.qkv_dim,
                                                q_offset=0)
            self._mark(cl, "attention")
            # o-proj + (x += norm(o); h = norm(x)): one dispatch in decode
            hq = self._h_q8_1([L.gate, L.up], "geglu") if dec else None
            open_op, res = self._mv_norm_add(cl, L.o, self.attn, T=T, x_cols=cfg.q_dim, key="o", label="o_proj",
                                             w_post=L.norms["post_attention_layernorm"],
                                             w_next=L.norms["pre_feedforward_layernorm"], res=res, hq=hq, xq=attnq)
            self._mark(cl, open_op)
            mlpq = None
            if dec and self.geglu_q8_1 is not None and self._geglu_q8_1_applies(L):
                mlpq = self.mlpq          # the int8 down matvec's input blocks, from the GEGLU itself
                self._mv(cl, [L.gate, L.up], self.h, self.mlp, T=1, x_cols=H, y_cols=cfg.intermediate_size,
                         epilogue="geglu_q8_1", force=self.geglu_q8_1, xq=hq, y_q8_1=mlpq)
            else:
                self._mv(cl, [L.gate, L.up], self.h, self.mlp, T=T, x_cols=H, y_cols=cfg.intermediate_size,
                         epilogue="geglu", key="geglu", xq=hq)
            self._mark(cl, "gate_up_geglu")
            if i + 1 < len(self.layers):
                nxt, hq = self.layers[i + 1].norms["input_layernorm"], qkv_hq(self.layers[i + 1])
            else:      # the lm head reads one row of h (the last token's), through the int8 path or not
                nxt, hq = self.final_norm, (self._h_q8_1([self.lm_head], "lm") if mode in ("last", "sample")
                                            else None)
            open_op, res = self._mv_norm_add(cl, L.down, self.mlp, T=T, x_cols=cfg.intermediate_size, key="down",
                                             label="down", w_post=L.norms["post_feedforward_layernorm"], w_next=nxt,
                                             res=res, hq=hq, xq=mlpq)
        self._mark(cl, open_op)
        V = cfg.vocab_size
        if mode == "all":
            self._mv(cl, [self.lm_head], self.h, self.logits, T=T, x_cols=H, y_cols=V)
        elif mode in ("last", "sample"):
            self._mv(cl, [self.lm_head], self.h, self.logits, T=1, x_cols=H, y_cols=V, x_off=(T - 1) * H, key="lm",
                     xq=hq)
        if mode == "sample":
            self._mark(cl, "lm_head")
            ops_sample.sample(cl, dev, self.step, self.logits, self.cand, self.counters, self.tokens, vocab=V,
                              greedy=greedy, penalty=penalty)

    def _recording(self, T: int, mode: str):
        key = (T, mode)
        cl = self._recordings.get(key)
        if cl is None:
            cl = self._recordings[key] = self._record(T, mode)
            while len(self._recordings) > MAX_RECORDINGS:
                _, old = self._recordings.popitem(last=False)
                old.destroy()
        else:
            self._recordings.move_to_end(key)
        return cl

    # ---- running ---------------------------------------------------------------------------

    def _write_step(self, **kw) -> None:
        self.step.mapped[:48] = np.frombuffer(pack_step(**kw), np.uint8)

    def forward(self, token_ids, start_pos: int, *, all_logits: bool = False) -> np.ndarray:
        ids = [int(t) for t in token_ids]
        n = len(ids)
        if n == 0:
            raise ValueError("forward needs at least one token")
        if start_pos < 0 or start_pos + n > self.context_length:
            raise ValueError(f"positions {start_pos}..{start_pos + n - 1} exceed the context of {self.context_length}")
        V = self.config.vocab_size
        chunk = LOGITS_CHUNK if all_logits else PREFILL_CHUNK
        outs = []
        for s in range(0, n, chunk):
            part = ids[s:s + chunk]
            m = len(part)
            last = s + chunk >= n
            mode = "all" if all_logits else ("last" if last else "none")
            cl = self._recording(m, mode)
            self.tokens_view[start_pos + s:start_pos + s + m] = part
            self._write_step(pos=start_pos + s, n_tokens=m)
            cl.submit(wait=True)
            self._account_busy(cl)
            if mode == "all":
                outs.append(self.dev.download(self.logits, np.float32, (m, V)))
            elif mode == "last":
                outs.append(self.dev.download(self.logits, np.float32, (V,)))
        return np.concatenate(outs) if all_logits else outs[-1]

    def decode_tokens(self, first_token: int, start_pos: int, params: SamplingParams, max_tokens: int):
        if not params.greedy and (params.top_k <= 0 or params.top_k > ops_sample.KC):
            return None      # the GPU sampler keeps at most KC candidates: sample on the CPU instead
        return self._decode(int(first_token), int(start_pos), params, int(max_tokens))

    @property
    def steps_per_submit(self) -> int:
        """Token steps per submission: small models are launch-bound (a submission costs ~0.3 ms
        between steps on an H100), large ones stream so long that one step per submit is free."""
        w = self.budget["weights"]
        return 4 if w < (1 << 30) else (2 if w < (4 << 30) else 1)

    def _decode_lists_for(self, greedy: bool, penalty: bool, steps: int):
        key = (greedy, penalty, steps)
        if key not in self._decode_lists:
            # identical recordings: the GPU runs the queued ones while the host reads ids
            self._decode_lists[key] = [self._record(1, "sample", greedy, penalty, steps=steps)
                                       for _ in range(IN_FLIGHT)]
        return self._decode_lists[key]

    def _decode(self, first_token, start_pos, params, max_tokens):
        limit = min(max_tokens, self.context_length - start_pos - 1)
        if limit <= 0:
            return
        penalty = params.repetition_penalty != 1.0
        K = self.steps_per_submit
        if start_pos + -(-limit // K) * K >= self.context_length:
            K = 1                         # the GPU must not step past the context
        lists = self._decode_lists_for(params.greedy, penalty, K)
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little")
        self.tokens_view[start_pos] = first_token
        self._write_step(pos=start_pos, n_tokens=1, seed=seed, top_k=max(0, params.top_k),
                         temperature=params.temperature, top_p=params.top_p, min_p=params.min_p,
                         rep_penalty=params.repetition_penalty, rep_window=params.repetition_window)
        inflight = deque()
        submitted = 0
        tokens = self.tokens_view
        n_sub = -(-limit // K)
        done = 0
        try:
            for _ in range(n_sub):
                t0 = time.perf_counter()
                while len(inflight) < IN_FLIGHT and submitted < n_sub:
                    cl = lists[submitted % IN_FLIGHT]
                    cl.submit(wait=False)
                    inflight.append((cl, start_pos + submitted * K + 1))
                    submitted += 1
                cl, pos = inflight.popleft()
                t1 = time.perf_counter()
                cl.wait()
                t2 = time.perf_counter()
                self._account_busy(cl)
                ids = [int(t) for t in tokens[pos:pos + K]]
                self._py_time += (t1 - t0) + (time.perf_counter() - t2)
                self._py_tokens += K
                for tid in ids:
                    if done == limit:
                        break
                    done += 1
                    yield tid
        finally:
            for cl, _ in inflight:
                cl.wait()

    # ---- reporting ----------------------------------------------------------------------------

    def export_kv(self, lo: int, hi: int) -> list:
        """K/V rows of positions [lo, hi) as f32 (hand-off to another device; kv_handoff.py)."""
        return kv_handoff.export_kv(self, lo, hi)

    def import_kv(self, rows) -> int:
        """Write K/V rows computed elsewhere (e.g. an NPU prefill) into this cache."""
        return kv_handoff.import_kv(self, rows)

    def live_stats(self) -> LiveStats:
        return LiveStats(device=self.dev.name, gpu_busy=self.busy_fraction(),
                         kv_cache_bytes=self.budget["kv_cache"])

    def stats(self) -> dict:
        out = {
            "device": self.dev.name,
            "weights_bytes": self.budget["weights"],
            "kv_cache_bytes": self.budget["kv_cache"],
            "scratch_bytes": self.budget["scratch"],
            "allocated_bytes": self.dev.allocated_bytes,
            "int_dot": self.int_dot,
            "prefill_gemm": ops_gemm.path(self.dev),
            "matvec_tuning": {k: {"us": round(v[0], 1), "int8": v[1], **v[2],
                                  **({"norm_tail": self.norm_tail[k]} if k in self.norm_tail else {})}
                              for k, v in self.tuning.items()},
        }
        out["qkv_rope"] = None if self.qkv_rope is None else {"int8": self.qkv_rope[0], **self.qkv_rope[1]}
        if getattr(self, "qkv_rope_timing", None):
            out["qkv_rope_timing"] = self.qkv_rope_timing
        out["geglu_q8_1"] = (None if self.geglu_q8_1 is None else
                             {"int8": self.geglu_q8_1[0], **self.geglu_q8_1[1]})
        if getattr(self, "geglu_q8_1_timing", None):
            out["geglu_q8_1_timing"] = self.geglu_q8_1_timing
        out["few_token_matvec"] = sorted(self.few_token_matvec)
        if self.few_token_timing:
            out["few_token_timing"] = self.few_token_timing
        if self._py_tokens:
            out["python_ms_per_token"] = 1000 * self._py_time / self._py_tokens
        busy = self.busy_fraction()
        if busy is not None:
            out["gpu_busy_fraction"] = busy
        return out

    def _drop_recordings(self) -> None:
        for cl in getattr(self, "_recordings", {}).values():
            cl.destroy()
        for pair in getattr(self, "_decode_lists", {}).values():
            for cl in pair:
                cl.destroy()
        self._recordings = OrderedDict()
        self._decode_lists = {}

    def close(self) -> None:
        dev = getattr(self, "dev", None)
        if dev is None:
            return
        self._drop_recordings()
        if self._own_device:
            dev.close()
        self.dev = None


def _quant_size(qt: QType) -> tuple[int, int]:
    from gguf import GGML_QUANT_SIZES
    return GGML_QUANT_SIZES[qt]
