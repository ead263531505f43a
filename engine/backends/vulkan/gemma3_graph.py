"""Gemma 3's forward pass as Vulkan command lists: the layer graph, recorded once per (token
count, output kind) and replayed. Reads beside engine/models/gemma3.py (the numpy reference):
embed, per layer norm → QKV → QK-norm + RoPE + KV write → attention → o-proj + norm_add →
GEGLU → down + norm_add, then the LM head (and the sampler, for a decode step). A prefill's
LM head reads row 0 of h, where its last real token's row is moved first (ops_last_row): the
step buffer's n_tokens may be below the count recorded (a bucketed chunk). Another
architecture would be another file like this one.

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
`mlpq` for an int8 down matvec (`geglu_q8_1`, where timing says it pays). Where timing says so
(`tuning.prologue_groups`, autotune.choose_prologue) each norm_add is instead the prologue of the
matvec reading h (the GEGLU, the next layer's QKV: its workgroups run it themselves, `Prologue`)
and the down quantizes its own input: QKV B attention B o B gate/up B down B, the last layer's
norm_add apart. Prefill (T > 1) runs GEMMs and
separate norm_add dispatches. Which path each matvec takes is the `Tuning` record's (autotune.py).
"""

from __future__ import annotations

import re
from typing import Literal, TypeAlias

import numpy as np

from phoenix_chat.engine.backends.vulkan import (
    ops_attention,
    ops_embed,
    ops_gemm,
    ops_last_row,
    ops_norm,
    ops_rope,
    ops_sample,
    ops_vision,
)
from phoenix_chat.engine.backends.vulkan.autotune import FEW_TOKENS, IntDot, Spec, Tuning
from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.gemm_tuning import shape_key
from phoenix_chat.engine.backends.vulkan.image_prefill import ImageRows
from phoenix_chat.engine.backends.vulkan.matvec import (
    MAX_COLUMNS,
    REGS_SPEC,
    NormTail,
    Prologue,
    RopeTail,
    WeightMatrix,
    default_spec,
    dummy,
    fusable,
    prologue_ok,
    q8_1_bytes,
    record_matvec,
    record_quantize,
    rope_tail_ok,
    rows_per_group,
)
from phoenix_chat.engine.backends.vulkan.matvec_cols import cols_ok, record_matvec_cols
from phoenix_chat.engine.backends.vulkan.memory import Buffer
from phoenix_chat.engine.backends.vulkan.pipelines import INT_DOT_TYPES
from phoenix_chat.engine.backends.vulkan.profiling import mark
from phoenix_chat.engine.backends.vulkan.recorder import CommandList
from phoenix_chat.engine.backends.vulkan.resident import Buffers, DeviceWeights, Layer
from phoenix_chat.engine.config import ModelConfig

# what a recorded forward leaves: the cache only, the last position's logits, every position's,
# or (decode) a token sampled on the device
ForwardMode: TypeAlias = Literal["none", "last", "all", "sample"]


def matrix_role(mats: list[WeightMatrix]) -> str:
    """The matrices' names without the layer prefix: "self_attn.q_proj+self_attn.k_proj+...",
    "mlp.down_proj", "embed_tokens" (the tied LM head)."""
    return "+".join(re.sub(r"^(model\.)?(blk|layers)\.\d+\.|\.weight$", "", m.name) or "?" for m in mats)


class Gemma3Graph:
    """Records Gemma 3 forwards over the resident weights and buffers, as `tuning` says."""

    def __init__(
        self,
        config: ModelConfig,
        dev: Device,
        weights: DeviceWeights,
        buffers: Buffers,
        *,
        context_length: int,
        n_splits: int,
        int_dot: bool,
        tuning: Tuning,
    ):
        self.config, self.dev, self.weights, self.buffers = config, dev, weights, buffers
        self.context_length = context_length
        self.n_splits = n_splits  # decode attention's splits of the context
        self.int_dot = int_dot  # int8 activations allowed at all
        self.tuning = tuning
        self.qkv_dim = config.q_dim + 2 * config.kv_dim
        # T (2..FEW_TOKENS) -> matrix role -> the path its T-token products took when last
        # recorded ("int8", "f32" multi-column matvec or "gemm"): stats()["few_token_paths"], so
        # no fallback is silent
        self.few_token_paths: dict[int, dict[str, str]] = {}
        # T (2..FEW_TOKENS) -> weight shape (gemm_tuning.shape_key) -> the GEMM tile its T-token
        # products ran when last recorded: what step_tiles.py may swap in a batched step
        self.few_token_tiles: dict[int, dict[str, str]] = {}

    def record(
        self,
        T: int,
        mode: ForwardMode,
        greedy: bool = True,
        penalty: bool = False,
        profile: bool = False,
        steps: int = 1,
        full_sampler: bool = False,
        images: ImageRows | None = None,
    ) -> CommandList:
        """A command list of one forward over T tokens. mode: 'none' (fill the cache only),
        'last' / 'all' (logits), 'sample' (a decode step, or a prefill chunk ending in the
        sampler: the first token). steps > 1 (decode only): that many
        token steps back to back in one command buffer; each step's sampler advances step.pos,
        so the next one embeds the token just drawn. profile: a timestamp at every barrier
        (profiling.profile_step); else two bracket the list for the busy gauge. The sampler:
        argmax (greedy), else top-k, or with full_sampler the one for every top_k (ops_sample).
        images (a prefill chunk holding pictures): after the embedding, the soft tokens in `images`
        replace the flagged rows of x, and the attention lets each picture's tokens see each
        other (image_prefill.py); the host writes `images` before each submission."""
        cfg, dev = self.config, self.dev
        busy_ts = 2 if dev.caps.timestamp_bits else 0
        assert images is None or steps == 1
        cl = dev.commands(
            name=f"forward[{T},{mode}{',images' if images else ''}]",
            timestamps=(24 * cfg.num_layers + 32) if profile else busy_ts,
        )
        assert steps == 1 or mode == "sample"
        if profile:
            cl.profile_labels = []
        if profile or busy_ts:
            cl.timestamp(0)
        for i in range(steps):
            if i:
                mark(cl, "sample")
            self._record_body(cl, T, mode, greedy, penalty, full_sampler, images)
        if profile:  # close the last op: the sampler (decode) or the LM head (prefill)
            mark(cl, "sample" if mode == "sample" else "lm_head")
        if busy_ts and not profile:
            cl.timestamp(1)
            cl.busy_timed = True
        return cl.end()

    def record_decode_layers(self, cl: CommandList, n_layers: int | None = None) -> None:
        """One decode token's first `n_layers` layers (all: None) into `cl`, no LM head or
        sampler (autotune's step timing)."""
        self._record_body(cl, 1, "none", greedy=True, penalty=False, n_layers=n_layers)

    def _record_body(
        self,
        cl: CommandList,
        T: int,
        mode: ForwardMode,
        greedy: bool,
        penalty: bool,
        full_sampler: bool = False,
        images: ImageRows | None = None,
        n_layers: int | None = None,
    ) -> None:
        cfg, dev, b, w = self.config, self.dev, self.buffers, self.weights
        layers = w.layers[:n_layers]  # all but for autotune's timing of a few
        eps = cfg.rms_norm_eps
        H = cfg.hidden_size
        tuning = self.tuning
        ops_embed.embed(
            cl,
            dev,
            b.step,
            b.tokens,
            w.embed_table,
            b.x,
            wtype=w.embed_type.name,
            hidden=H,
            scale=float(np.float32(cfg.embed_scale)),
            max_tokens=T,
        )
        mark(cl, "embed")
        if images is not None:  # a picture's soft tokens over its placeholders' embeddings
            ops_vision.overlay(cl, dev, images.flags, images.rows, b.x, tokens=T, n=H)
            mark(cl, "image_overlay")
        # Decode: where the matvec reading h takes the int8 path, the norm writing h also writes
        # its q8_1 blocks (hq), so that matvec needs no quantize dispatch; attention does the
        # same for the o matvec (attnq).
        dec = T == 1

        def qkv_hq(L: Layer) -> Buffer | None:
            return self._h_q8_1(L.qkv, "qkv") if dec and self.qkv_fused(L) else None

        hq = qkv_hq(w.layers[0])
        ops_norm.norm(cl, dev, b.x, w.layers[0].norms["input_layernorm"], b.h, rows=T, n=H, eps=eps, q=hq)
        open_op = "norm"  # the op the next barrier closes (profile label)
        res = b.x  # the buffer holding the residual stream (decode alternates)
        # decode with prologues: each norm_add (and the down's quantize: the GEGLU then writes
        # no q8_1 blocks) is run by the matvec after it, in its workgroups (matvec.Prologue);
        # `pending` is the one the next reader of h runs
        fold = dec and self.prologues()
        pending: Prologue | None = None
        for i, L in enumerate(layers):
            mark(cl, open_op)
            pre = "norm_add+" if pending is not None else ""
            if (
                dec
                and tuning.qkv_rope is not None
                and self.qkv_fused(L)
                and self.path(L.qkv, "qkv")[0] == tuning.qkv_rope[0]
            ):
                self._qkv(cl, L, T, hq=hq, rope=self.rope_tail(i), pro=pending)
                mark(cl, pre + "qkv+rope_kv")
            else:
                self._qkv(cl, L, T, hq=hq, pro=pending)
                mark(cl, pre + "qkv")
                self.rope_kv(cl, i, T)
                mark(cl, "rope_kv")
            pending = None
            window = 0 if L.is_global else cfg.sliding_window
            attnq = self._attn_q8_1(L) if dec else None  # the int8 o matvec's input blocks
            if T == 1:
                ops_attention.attention_decode(
                    cl,
                    dev,
                    b.step,
                    b.qkv,
                    L.k_cache,
                    L.v_cache,
                    b.partial,
                    b.counters,
                    b.attn,
                    head_dim=cfg.head_dim,
                    n_heads=cfg.num_heads,
                    n_kv_heads=cfg.num_kv_heads,
                    cache_slots=L.slots,
                    window=window,
                    scale=cfg.attn_scale,
                    n_splits=self.n_splits,
                    q_offset=0,
                    q=attnq,
                )
            else:
                ops_attention.attention_prefill(
                    cl,
                    dev,
                    b.step,
                    b.qkv,
                    L.k_cache,
                    L.v_cache,
                    b.attn,
                    head_dim=cfg.head_dim,
                    n_heads=cfg.num_heads,
                    n_kv_heads=cfg.num_kv_heads,
                    cache_slots=L.slots,
                    window=window,
                    scale=cfg.attn_scale,
                    max_tokens=T,
                    q_stride=self.qkv_dim,
                    q_offset=0,
                    vis=images.vis if images is not None else None,
                )
            mark(cl, "attention")
            # o-proj + (x += norm(o); h = norm(x)): one dispatch in decode
            hq = self._h_q8_1([L.gate, L.up], "geglu") if dec else None
            if fold:  # the norm_add goes to the GEGLU's prologue
                self.mv(cl, [L.o], b.attn, b.o, T=1, x_cols=cfg.q_dim, y_cols=H, key="o", xq=attnq)
                pending, res = self._norm_add_prologue(
                    L.norms["post_attention_layernorm"], L.norms["pre_feedforward_layernorm"], res
                )
                open_op = "o_proj"
            else:
                open_op, res = self._mv_norm_add(
                    cl,
                    L.o,
                    b.attn,
                    T=T,
                    x_cols=cfg.q_dim,
                    key="o",
                    label="o_proj",
                    w_post=L.norms["post_attention_layernorm"],
                    w_next=L.norms["pre_feedforward_layernorm"],
                    res=res,
                    hq=hq,
                    xq=attnq,
                )
            mark(cl, open_op)
            mlpq: Buffer | None = None
            if dec and not fold and tuning.geglu_q8_1 is not None and self._geglu_q8_1_applies(L):
                mlpq = b.mlpq  # the int8 down matvec's input blocks, from the GEGLU itself
                self.mv(
                    cl,
                    [L.gate, L.up],
                    b.h,
                    b.mlp,
                    T=1,
                    x_cols=H,
                    y_cols=cfg.intermediate_size,
                    epilogue="geglu_q8_1",
                    force=tuning.geglu_q8_1,
                    xq=hq,
                    y_q8_1=mlpq,
                )
            else:
                self.mv(
                    cl,
                    [L.gate, L.up],
                    b.h,
                    b.mlp,
                    T=T,
                    x_cols=H,
                    y_cols=cfg.intermediate_size,
                    epilogue="geglu",
                    key="geglu",
                    xq=hq,
                    pro=pending,
                )
            mark(cl, ("norm_add+" if pending is not None else "") + "gate_up_geglu")
            pending = None
            if i + 1 < len(layers):
                nxt, hq = layers[i + 1].norms["input_layernorm"], qkv_hq(layers[i + 1])
            else:  # the lm head reads one row of h (the last token's), through the int8 path or not
                nxt, hq = w.final_norm, (self._h_q8_1([w.lm_head], "lm") if mode in ("last", "sample") else None)
            # the down's input quantized by its own workgroups, where the GEGLU did not write it
            down_pro = None
            if fold and tuning.prologue_down and mlpq is None:
                down_pro = Prologue("quant", b.mlp, tuning.prologue_groups or 0)
            if fold and i + 1 < len(layers):  # the norm_add goes to the next QKV's prologue
                self.mv(
                    cl,
                    [L.down],
                    b.mlp,
                    b.o,
                    T=1,
                    x_cols=cfg.intermediate_size,
                    y_cols=H,
                    key="down",
                    xq=mlpq,
                    pro=down_pro,
                )
                pending, res = self._norm_add_prologue(L.norms["post_feedforward_layernorm"], nxt, res)
                open_op = ("quantize+" if down_pro is not None else "") + "down"
                continue
            open_op, res = self._mv_norm_add(
                cl,
                L.down,
                b.mlp,
                T=T,
                x_cols=cfg.intermediate_size,
                key="down",
                label=("quantize+" if down_pro is not None else "") + "down",
                w_post=L.norms["post_feedforward_layernorm"],
                w_next=nxt,
                res=res,
                hq=hq,
                xq=mlpq,
                pro=down_pro,
            )
        mark(cl, open_op)
        V = cfg.vocab_size
        if mode == "all":
            self.mv(cl, [w.lm_head], b.h, b.logits, T=T, x_cols=H, y_cols=V, key="lm")
        elif mode in ("last", "sample"):
            if T > 1:  # the step's last real token may sit below row T - 1 (a bucketed prefill)
                ops_last_row.last_row_to_front(cl, dev, b.step, b.h, row_bytes=H * 4)
                if hq is not None:
                    ops_last_row.last_row_to_front(cl, dev, b.step, hq, row_bytes=q8_1_bytes(H))
                mark(cl, "last_row")
            self.mv(cl, [w.lm_head], b.h, b.logits, T=1, x_cols=H, y_cols=V, key="lm", xq=hq)
        if mode == "sample":
            mark(cl, "lm_head")
            ops_sample.sample(
                cl,
                dev,
                b.step,
                b.logits,
                b.cand,
                b.counters,
                b.tokens,
                vocab=V,
                greedy=greedy,
                full=full_sampler,
                penalty=penalty,
            )

    # ---- the attention half ----------------------------------------------------------------

    def _qkv(
        self,
        cl: CommandList,
        L: Layer,
        T: int,
        hq: Buffer | None = None,
        rope: RopeTail | None = None,
        pro: Prologue | None = None,
    ) -> None:
        """qkv = [q; k; v] h. rope (decode): the fused matvec also runs each head's rope.
        pro (decode, fused): h is made by its workgroups (the norm_add before)."""
        cfg, b = self.config, self.buffers
        q, k, v = L.qkv
        if rope is not None:
            qkv_rope = self.tuning.qkv_rope
            assert qkv_rope is not None  # the caller passes a rope only where tuning chose it
            self.mv(
                cl,
                L.qkv,
                b.h,
                b.qkv,
                T=1,
                x_cols=cfg.hidden_size,
                y_cols=self.qkv_dim,
                force=qkv_rope,
                xq=hq if qkv_rope[0] is True else None,
                rope=rope,
                pro=pro,
            )
            return
        if self.qkv_fused(L):
            self.mv(cl, L.qkv, b.h, b.qkv, T=T, x_cols=cfg.hidden_size, y_cols=self.qkv_dim, key="qkv", xq=hq, pro=pro)
            return
        assert pro is None
        if T > 1:
            self.mv(cl, L.qkv, b.h, b.qkv, T=T, x_cols=cfg.hidden_size, y_cols=self.qkv_dim)
            return
        # types no fused kernel covers (MIXED_QKV_TYPES): three dispatches, no barrier between them
        for m, off in ((q, 0), (k, cfg.q_dim), (v, cfg.q_dim + cfg.kv_dim)):
            record_matvec(
                cl, self.dev, [m], b.h, b.qkv, y_off=off, tokens=T, x_stride=cfg.hidden_size, y_stride=self.qkv_dim
            )

    def qkv_fused(self, L: Layer) -> bool:
        """The decode QKV is one matvec (key "qkv"): one type (or v alone of another type with a
        kernel, as in llama.cpp's Q4_K_M), each matrix in one binding."""
        return all(len(m.tensor.ranges) == 1 for m in L.qkv) and fusable(L.qkv)

    def rope_tail(self, i: int) -> RopeTail:
        """Layer i's QK-norm + RoPE + KV write, as the fused decode QKV matvec's epilogue."""
        cfg, L, b = self.config, self.weights.layers[i], self.buffers
        return RopeTail(
            b.step,
            L.norms["self_attn.q_norm"],
            L.norms["self_attn.k_norm"],
            L.k_cache,
            L.v_cache,
            b.block_arrival,
            head_dim=cfg.head_dim,
            n_heads=cfg.num_heads,
            n_kv_heads=cfg.num_kv_heads,
            cache_slots=L.slots,
            theta=cfg.rope_base(i),
            scale_factor=cfg.rope_scale(i),
            eps=cfg.rms_norm_eps,
        )

    def rope_kv(self, cl: CommandList, i: int, T: int, step: Buffer | None = None, rows: int = 0) -> None:
        """QK-norm + RoPE of q in place, k and v into layer i's cache (its own dispatch).
        rows > 0: a batched decode step (batch.py), each token row with its own Step in `step`."""
        cfg, L, b = self.config, self.weights.layers[i], self.buffers
        ops_rope.rope_kv(
            cl,
            self.dev,
            b.step if step is None else step,
            b.qkv,
            b.qkv,
            b.qkv,
            L.norms["self_attn.q_norm"],
            L.norms["self_attn.k_norm"],
            L.k_cache,
            L.v_cache,
            head_dim=cfg.head_dim,
            n_heads=cfg.num_heads,
            n_kv_heads=cfg.num_kv_heads,
            cache_slots=L.slots,
            theta=cfg.rope_base(i),
            scale_factor=cfg.rope_scale(i),
            eps=cfg.rms_norm_eps,
            max_tokens=T,
            q_stride=self.qkv_dim,
            kv_stride=self.qkv_dim,
            q_offset=0,
            k_offset=cfg.q_dim,
            v_offset=cfg.q_dim + cfg.kv_dim,
            rows=rows,
        )

    def _attn_q8_1(self, L: Layer) -> Buffer | None:
        """`attnq` when L's decode o-proj runs the int8 path on q8_1 input: attention then writes
        its output's q8_1 blocks into it (as `_h_q8_1` for h), and the o matvec needs no quantize."""
        return self.buffers.attnq if self.path([L.o], "o")[0] is True else None

    # ---- the MLP half ------------------------------------------------------------------------

    def _geglu_q8_1_applies(self, L: Layer) -> bool:
        """L's decode GEGLU can write its output's q8_1 blocks for L's down matvec: down reads q8_1
        blocks (int8 path, not quantized in registers) and gate/up take the path `geglu_q8_1` was
        chosen for (layers may differ in type)."""
        idot = self.path([L.gate, L.up], "geglu")[0]
        geglu_q8_1 = self.tuning.geglu_q8_1
        return (
            geglu_q8_1 is not None
            and self.path([L.down], "down")[0] is True
            and idot == geglu_q8_1[0]
            and self.config.intermediate_size % 32 == 0
        )

    # ---- matvecs and the norms after them --------------------------------------------------

    def path(self, mats: list[WeightMatrix], key: str | None = None) -> tuple[IntDot, Spec | None]:
        """(int_dot, spec) the matvec of `mats` takes: the tuned choice for `key`, else the
        default; int8 only where every matrix has an int8 kernel (layers may differ in type)."""
        int_dot: IntDot = self.int_dot and all(m.qtype.name in INT_DOT_TYPES for m in mats)
        spec = None
        if key in self.tuning.matvec:
            _us, tuned, spec = self.tuning.matvec[key]
            int_dot = tuned if int_dot else False
        return int_dot, spec

    def _h_q8_1(self, mats: list[WeightMatrix], key: str) -> Buffer | None:
        """`hq` when the matvec of `mats` reading h runs the int8 path on q8_1 input: the norm that
        writes h then writes h's q8_1 blocks into it, and the matvec needs no quantize dispatch.
        A buffer of its own (not the shared `xq`): no later quantize can overwrite it first."""
        return self.buffers.hq if self.path(mats, key)[0] is True else None

    def mv(
        self,
        cl: CommandList,
        mats: list[WeightMatrix],
        x: Buffer,
        y: Buffer,
        *,
        T: int,
        x_cols: int,
        y_cols: int,
        epilogue: str | None = None,
        x_off: int = 0,
        y_off: int = 0,
        key: str | None = None,
        force: tuple[IntDot, Spec | None] | None = None,
        xq: Buffer | None = None,
        tail: NormTail | None = None,
        y_q8_1: Buffer | None = None,
        rope: RopeTail | None = None,
        pro: Prologue | None = None,
    ) -> None:
        """One (possibly fused) matvec over T tokens, through the int8 path where it applies;
        several tokens go through the tiled GEMM (weights read once per 64 tokens).
        force: (int_dot, spec) instead of the tuned path for `key` (autotune's candidates).
        xq: the q8_1 blocks of x already exist there (written by the norm that produced x; same
        offsets): the int8 path reads them instead of recording a quantize dispatch.
        tail: a NormTail run by the matvec's last workgroup (T == 1, one matrix in one binding).
        y_q8_1: with epilogue "geglu_q8_1", where the GEGLU writes y's q8_1 blocks.
        rope: a RopeTail run per head after the fused decode QKV (epilogue "rope").
        pro: x made by the matvec's workgroups (matvec.Prologue; decode, the q8_1 int8 path)."""
        b = self.buffers
        arrival = b.block_arrival if epilogue == "geglu_q8_1" else None
        if tail is not None:
            assert T == 1 and epilogue is None
            epilogue = "norm"
        if rope is not None:
            assert T == 1 and epilogue is None
            epilogue = "rope"
        if T > 1 and x_off == 0 and self._few_token_matvec(cl, mats, x, y, T, x_cols, y_cols, epilogue, y_off, xq, key):
            return
        if T > 1 and x_off == 0:
            yr: Buffer | tuple[Buffer, int, int] = y  # y, or its range from y_off on
            if y_off:
                yr = (y, y_off * 4, y.size - y_off * 4)
            geglu = epilogue == "geglu"
            shapes = [shape_key(m.qtype.name, m.rows, x_cols, geglu=geglu) for m in (mats[:1] if geglu else mats)]
            kernels = [self.tuning.gemm_kernel_for(T, shape) for shape in shapes]
            if T <= FEW_TOKENS:
                self.few_token_tiles.setdefault(T, {}).update(
                    (shape, kn) for shape, kn in zip(shapes, kernels, strict=True) if kn is not None
                )
            gemm_xq = None
            if any(kn in ops_gemm.INT8_KERNELS for kn in kernels):
                # the int8 GEMMs read x's q8_1 blocks: quantized once for the products sharing x
                record_quantize(cl, self.dev, x, self.buffers.xq, T * x_cols)
                mark(cl, "quantize")
                gemm_xq = self.buffers.xq
            if epilogue == "geglu":
                ops_gemm.gemm(
                    cl,
                    self.dev,
                    x,
                    mats[0].tensor,
                    yr,
                    wtype=mats[0].qtype.name,
                    m=T,
                    n=mats[0].rows,
                    k=x_cols,
                    x_stride=x_cols,
                    y_stride=y_cols,
                    w_up=mats[1].tensor,
                    kernel_name=kernels[0],
                    xq=gemm_xq,
                )
                return
            assert epilogue is None
            off = 0
            # fused QKV: one GEMM per matrix into its columns of y, their split-K reduces after
            # one barrier (the mark before this product ended every earlier reader of the scratch)
            group = ops_gemm.SplitKGroup()
            for m, kn in zip(mats, kernels, strict=True):
                yb = (
                    yr
                    if off == 0
                    else (
                        (yr, off * 4, yr.size - off * 4)
                        if not isinstance(yr, tuple)
                        else (yr[0], yr[1] + off * 4, yr[2] - off * 4)
                    )
                )
                ops_gemm.gemm(
                    cl,
                    self.dev,
                    x,
                    m.tensor,
                    yb,
                    wtype=m.qtype.name,
                    m=T,
                    n=m.rows,
                    k=x_cols,
                    x_stride=x_cols,
                    y_stride=y_cols,
                    kernel_name=kn,
                    xq=gemm_xq,
                    group=group,
                )
                off += m.rows
            group.finish(cl)
            return
        int_dot, spec = force if force is not None else self.path(mats, key)
        if pro is not None:
            assert T == 1 and int_dot is True
            spec = self.tuning.prologue_spec or spec
            record_matvec(
                cl, self.dev, mats, dummy(self.dev), y, epilogue=epilogue, int_dot=True, spec=spec, rope=rope, pro=pro
            )
            return
        if int_dot == "regs":
            if spec is None or spec.get("THREAD_ROWS"):
                spec = REGS_SPEC  # the block-pair path lives in the cooperative kernels
            record_matvec(
                cl,
                self.dev,
                mats,
                x,
                y,
                epilogue=epilogue,
                int_dot="regs",
                tokens=T,
                x_off=x_off,
                x_stride=x_cols,
                y_stride=y_cols,
                y_off=y_off,
                spec=spec,
                tail=tail,
                y_q8_1=y_q8_1,
                arrival=arrival,
                rope=rope,
            )
        elif int_dot and xq is not None:
            record_matvec(
                cl,
                self.dev,
                mats,
                xq,
                y,
                epilogue=epilogue,
                int_dot=True,
                tokens=T,
                x_off=x_off // 32,
                x_stride=x_cols // 32,
                y_stride=y_cols,
                y_off=y_off,
                spec=spec,
                tail=tail,
                y_q8_1=y_q8_1,
                arrival=arrival,
                rope=rope,
            )
        elif int_dot:
            record_quantize(cl, self.dev, x, b.xq, T * x_cols, x_off=x_off)
            mark(cl, "quantize")
            record_matvec(
                cl,
                self.dev,
                mats,
                b.xq,
                y,
                epilogue=epilogue,
                int_dot=True,
                tokens=T,
                x_stride=x_cols // 32,
                y_stride=y_cols,
                y_off=y_off,
                spec=spec,
                tail=tail,
                y_q8_1=y_q8_1,
                arrival=arrival,
                rope=rope,
            )
        else:
            record_matvec(
                cl,
                self.dev,
                mats,
                x,
                y,
                epilogue=epilogue,
                tokens=T,
                x_off=x_off,
                x_stride=x_cols,
                y_stride=y_cols,
                y_off=y_off,
                spec=spec,
                tail=tail,
                y_q8_1=y_q8_1,
                arrival=arrival,
                rope=rope,
            )

    def few_token_path(self, mats: list[WeightMatrix], T: int, key: str | None = None) -> str:
        """How a forward of T > 1 tokens runs these matrices: "int8" (the multi-column int8
        matvec, q8_1 x), "f32" (the multi-column matvec, f32 x) or "gemm" — the tuned path for T
        (tuning.few_token_int8 / few_token_matvec), where the matrices allow it; where that is the
        GEMM, the int8 matvec still takes matvec `key` if its own timing beat the GEMM's
        (`_cols_beat_gemm`)."""
        groups = [mats] if len(mats) == 2 or fusable(mats) else [[m] for m in mats]
        int8_ok = all(cols_ok(self.dev, g) for g in groups)
        if T in self.tuning.few_token_int8 and int8_ok:
            return "int8"
        if T in self.tuning.few_token_matvec and T <= MAX_COLUMNS:
            return "f32"
        if int8_ok and self.int_dot and self._cols_beat_gemm(mats, T, key):
            return "int8"
        return "gemm"

    def _cols_beat_gemm(self, mats: list[WeightMatrix], T: int, key: str | None) -> bool:
        """Whether matvec `key`'s int8 multi-column timing at load (cols_timing, the first timed
        count >= T) beat the GEMM tiles its shapes chose for a few tokens (gemm_shape_timing_few,
        at the timed count a forward of T tokens takes): a forward takes the GEMM path as a whole
        when its sum wins, yet on the H100 the 4B down product of 32 tokens ran in 51 µs as a
        matvec against 93 as a GEMM."""
        t = self.tuning
        cols = t.cols_timing.get(key or "", {})
        above = [c for c in sorted(cols) if c >= T]
        if not above:
            return False
        geglu = key == "geglu"
        gemm_us = 0.0
        for m in mats[:1] if geglu else mats:
            shape = shape_key(m.qtype.name, m.rows, m.cols, geglu=geglu)
            kn, timed = t.few_shape_choice(T, shape)
            if kn is None or kn not in timed:
                return False
            gemm_us += timed[kn]
        return min(cols[above[0]].values()) < gemm_us

    def _few_token_matvec(
        self,
        cl: CommandList,
        mats: list[WeightMatrix],
        x: Buffer,
        y: Buffer,
        T: int,
        x_cols: int,
        y_cols: int,
        epilogue: str | None,
        y_off: int,
        xq: Buffer | None,
        key: str | None,
    ) -> bool:
        """Record a T-token product through a multi-column matvec where `few_token_path` says
        so (noting the path taken in `few_token_paths`); False: the GEMM path is the caller's."""
        path = self.few_token_path(mats, T, key)
        if T <= FEW_TOKENS:  # longer forwards (prefill chunks) always take the GEMM
            self.few_token_paths.setdefault(T, {})[matrix_role(mats)] = path
        if path == "gemm":
            return False
        assert epilogue in (None, "geglu")
        if path == "int8" and xq is None:
            record_quantize(cl, self.dev, x, self.buffers.xq, T * x_cols)
            mark(cl, "quantize")
            xq = self.buffers.xq
        off = 0
        for group in [mats] if epilogue or fusable(mats) else [[m] for m in mats]:
            if path == "int8":
                assert xq is not None
                record_matvec_cols(
                    cl,
                    self.dev,
                    group,
                    xq,
                    y,
                    n_vecs=T,
                    x_stride=x_cols // 32,
                    y_stride=y_cols,
                    y_off=y_off + off,
                    epilogue=epilogue,
                    spec=self.tuning.cols_spec_for(self.dev, key, T),
                )
            else:
                record_matvec(
                    cl,
                    self.dev,
                    group,
                    x,
                    y,
                    epilogue=epilogue,
                    x_stride=x_cols,
                    y_stride=y_cols,
                    y_off=y_off + off,
                    columns=T,
                )
            off += sum(m.rows for m in group)
        return True

    def _norm_add_prologue(self, w_post: Buffer, w_next: Buffer, res: Buffer) -> tuple[Prologue, Buffer]:
        """The decode norm_add after a matvec into b.o, as the next matvec's prologue: (it, the
        buffer the residual moves to, the other of x / x_alt)."""
        b = self.buffers
        out = b.x_alt if res is b.x else b.x
        groups = self.tuning.prologue_groups or 0
        return Prologue("norm_add", b.o, groups, res, w_post, w_next, out, self.config.rms_norm_eps), out

    def prologues(self) -> bool:
        """Decode runs the norm_adds and the down's quantize as prologues: tuned so
        (tuning.prologue_groups) and nothing refuses it (`prologue_refusal`)."""
        return self.tuning.prologue_groups is not None and not self.prologue_refusal()

    def prologue_refusal(self) -> str:
        """Why decode cannot run its norm_adds (and the down's quantize) as the prologues of the
        matvecs after them ("" where it can): every reader of h must take the q8_1 int8 path
        with a prologue kernel for its type, and o / down must not run the norm as a tail."""
        tuning = self.tuning
        for key in ("o", "down"):
            if tuning.norm_tail.get(key, True):
                return f"the {key} matvec runs the norm_add in its last workgroup (norm tail)"
        for i, L in enumerate(self.weights.layers):
            uses: list[tuple[list[WeightMatrix], str, str | None, str]] = [
                ([L.gate, L.up], "geglu", "geglu", "norm_add")
            ]
            if i > 0:
                if not self.qkv_fused(L):
                    return f"layer {i}'s q, k and v run as three matvecs"
                qkv_rope = tuning.qkv_rope
                rope = qkv_rope is not None and self.path(L.qkv, "qkv")[0] == qkv_rope[0]
                if rope and qkv_rope is not None:
                    spec = tuning.prologue_spec or qkv_rope[1] or default_spec(self.dev)
                    if not rope_tail_ok(spec, self.config.head_dim):
                        return f"the QKV's workgroups with a prologue ({rows_per_group(spec)} rows) straddle heads"
                uses.append((L.qkv, "qkv", "rope" if rope else None, "norm_add"))
            if tuning.prologue_down:  # (the GEGLU then writes no q8_1 blocks)
                uses.append(([L.down], "down", None, "quant"))
            for mats, key, epilogue, kind in uses:
                if self.path(mats, key)[0] is not True:
                    return f"layer {i}'s {key} matvec does not read q8_1 blocks"
                why = prologue_ok(mats, epilogue, kind)
                if why:
                    return f"layer {i}'s {key}: {why}"
        return ""

    def _mv_norm_add(
        self,
        cl: CommandList,
        m: WeightMatrix,
        x: Buffer,
        *,
        T: int,
        x_cols: int,
        key: str,
        label: str,
        w_post: Buffer,
        w_next: Buffer,
        res: Buffer,
        hq: Buffer | None = None,
        xq: Buffer | None = None,
        pro: Prologue | None = None,
    ) -> tuple[str, Buffer]:
        """o = m x, then res += rmsnorm(o) * w_post; h = rmsnorm(res) * w_next (+ q8_1 of h into
        hq). Decode: one dispatch where tuned so (the matvec's last workgroup runs the norm), else
        the matvec, a barrier and the split norm_add, which writes the residual to the other of
        x / x_alt; prefill: the matvec and a norm_add per row, in place. xq: x's q8_1 blocks, as
        for `mv`. Returns the profile label of what is still open (no barrier after) and the
        buffer that now holds the residual. pro: the matvec's prologue (decode, no norm tail)."""
        cfg, b = self.config, self.buffers
        H = cfg.hidden_size
        if T == 1 and len(m.tensor.ranges) == 1 and self.tuning.norm_tail.get(key, True):
            assert pro is None
            self.mv(
                cl,
                [m],
                x,
                b.o,
                T=1,
                x_cols=x_cols,
                y_cols=H,
                key=key,
                xq=xq,
                tail=NormTail(w_post, res, w_next, b.h, b.mv_arrival, cfg.rms_norm_eps, q=hq),
            )
            return label + "+norm_add", res
        self.mv(cl, [m], x, b.o, T=T, x_cols=x_cols, y_cols=H, key=key, xq=xq, pro=pro)
        mark(cl, label)
        if T == 1:
            out = b.x_alt if res is b.x else b.x
            ops_norm.norm_add_split(cl, self.dev, b.o, w_post, res, w_next, b.h, out, n=H, eps=cfg.rms_norm_eps, q=hq)
            return "norm_add", out
        ops_norm.norm_add(cl, self.dev, b.o, w_post, res, w_next, b.h, rows=T, n=H, eps=cfg.rms_norm_eps, q=hq)
        return "norm_add", res
