"""The SigLIP vision tower and Gemma 3's projector on Vulkan: pixels -> soft tokens, recorded
once per image size and replayed for every picture. Reads beside engine/models/siglip.py and
engine/vision/projector.py (the numpy f32 reference).

Per picture (N patches, width W, one command list):
  patch embedding: the stride-p convolution as one GEMM over the patchified pixels (K = 3 p p,
  zero-padded to a multiple of 32, the GEMMs' K step) B  + bias + position embedding B
  per layer: LayerNorm (with bias) B  q, k, v GEMMs into one [N][3W] buffer B  + biases B
  bidirectional attention over all N patches (vision_attention.comp) B  out GEMM B
  x += o + bias B  LayerNorm B  fc1 GEMM B  gelu_tanh(+ bias) B  fc2 GEMM B  x += o + bias B
  post LayerNorm B  average pool (k x k patches per soft token) B  RMSNorm (1 + w) B  projection GEMM
The picture goes in and the soft tokens come out through host-mapped buffers copied at the
list's ends, so a run touches no shared staging buffer or transfer command buffer: pictures
are encoded on whatever thread submits them (Scheduler.encode) while the scheduler's thread
runs the text model; the two share only the queue (Device.queue_lock).
The linears are the text prefill's GEMMs (ops_gemm: matrix cores with f16 operands where the
device has them, else the f32 kernels; f32 accumulation in every case), bias, GELU, residual,
LayerNorm, pooling and attention are shaders/vision*.comp (f32). The pool and the projector
run on the device too: only the soft tokens come back (and the tower's output when asked).
The MLP width is zero-padded to a multiple of 32 as well (SigLIP so400m's 4304 is not one):
fc1's extra rows and biases are 0, gelu_tanh(0) = 0, and fc2's extra columns are 0, so the
padding changes no value.

Matrices are uploaded in `matrix_type`: "F32", "F16" (the default), "BF16" or "Q8_0" (rounded
on the host by gguf's quantizer). Vectors (biases, norms, position embeddings) stay f32.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType, quants

from phoenix_chat.engine.backends.vulkan import ops_gemm, ops_norm, ops_vision
from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.memory import Buffer, Tensor
from phoenix_chat.engine.backends.vulkan.profiling import mark
from phoenix_chat.engine.backends.vulkan.recorder import CommandList
from phoenix_chat.engine.models.gemma3 import F32
from phoenix_chat.engine.models.siglip import PREFIX, patchify
from phoenix_chat.engine.vision_config import VisionConfig

MATRIX_TYPES = ("F32", "F16", "BF16", "Q8_0")
PROJECTION = "multi_modal_projector.mm_input_projection_weight"
SOFT_NORM = "multi_modal_projector.mm_soft_emb_norm.weight"


def pad32(n: int) -> int:
    return -(-n // 32) * 32


@dataclass
class _Layer:
    ln1: tuple[Buffer, Buffer]
    qkv: tuple[Tensor, Tensor, Tensor]
    qkv_bias: Buffer
    out: Tensor
    out_bias: Buffer
    ln2: tuple[Buffer, Buffer]
    fc1: Tensor
    fc1_bias: Buffer
    fc2: Tensor
    fc2_bias: Buffer


class SiglipGraph:
    """The vision tower + projector of one model on one device; `encode(pixels)` -> soft tokens."""

    def __init__(
        self,
        dev: Device,
        cfg: VisionConfig,
        tensor: Callable[[str], F32],
        *,
        matrix_type: str = "F16",
        gemm_kernel: str | None = None,
    ) -> None:
        """tensor: a vision tensor by its transformers name (`vision_tower.vision_model.…`,
        `multi_modal_projector.…`) as f32 (WeightSource.vision_tensor). gemm_kernel: one of
        ops_gemm.KERNELS; None: on a device with matrix cores the fastest of their tiles on
        this tower's shapes (`choose_gemm_kernel`, timed here), else the device's own."""
        if matrix_type not in MATRIX_TYPES:
            raise ValueError(f"vision tower matrices in {matrix_type}: have {', '.join(MATRIX_TYPES)}")
        self.dev, self.cfg, self.matrix_type = dev, cfg, matrix_type
        self.gemm_kernel = gemm_kernel or ops_gemm.kernel(dev)
        self.gemm_timing: dict[str, float] = {}  # µs of one layer's GEMMs per kernel, where timed
        W, p = cfg.hidden_size, cfg.patch_size
        if W % cfg.num_heads or (W // cfg.num_heads) % 4:
            raise ValueError(f"vision width {W} / {cfg.num_heads} heads: head_dim must be a multiple of 4")
        self.n_patches = cfg.patches_per_side**2
        self.n_tokens = cfg.mm_tokens_per_image
        self.k_patch = pad32(3 * p * p)
        self.inter = pad32(cfg.intermediate_size)
        self._owned: list[Buffer] = []
        self._tensors: list[Tensor] = []
        self._vectors: list[Buffer] = []
        self._lists: list[CommandList] = []
        self.kept = False
        self._lock = threading.Lock()  # one picture at a time: `encode` may come from several threads
        try:
            self._upload(tensor)
            self._allocate()
            if gemm_kernel is None and ops_gemm.coopmat_ok(dev):
                self.gemm_kernel = self.choose_gemm_kernel(ops_gemm.COOPMAT_KERNELS)
            self.list = self._record(keep_tower=False)
            self.list_keeping = self._record(keep_tower=True)  # + the tower's output (tests, `tower_output`)
            self.last = self.list
        except BaseException:
            self.close()
            raise

    # ---- weights and buffers ---------------------------------------------------------------

    def _vector(self, values: npt.NDArray[Any], name: str) -> Buffer:
        data = np.ascontiguousarray(values, np.float32).reshape(-1)
        buf = self.dev.buffer(max(data.nbytes, 4), name=name)
        self.dev.upload(buf, data.view(np.uint8))
        self._owned.append(buf)
        self._vectors.append(buf)
        return buf

    def _matrix(self, w: npt.NDArray[Any], name: str, rows: int | None = None, cols: int | None = None) -> Tensor:
        """w [out, in] (nn.Linear's layout), zero-padded to rows x cols, in matrix_type."""
        r, c = w.shape
        rows, cols = rows or r, cols or c
        if (rows, cols) != (r, c):
            padded = np.zeros((rows, cols), np.float32)
            padded[:r, :c] = w
            w = padded
        w = np.ascontiguousarray(w, np.float32)
        raw = w if self.matrix_type == "F32" else quants.quantize(w, getattr(GGMLQuantizationType, self.matrix_type))
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)
        t = self.dev.tensor(raw, raw.shape[1], name=name)
        self._owned.append(t.buffer)
        self._tensors.append(t)
        return t

    def _upload(self, tensor: Callable[[str], F32]) -> None:
        cfg, W = self.cfg, self.cfg.hidden_size

        def v(name: str) -> F32:
            return tensor(PREFIX + name)

        patch = v("embeddings.patch_embedding.weight")
        self.patch = self._matrix(patch.reshape(W, -1), "patch_embedding", cols=self.k_patch)
        self.patch_bias = self._vector(v("embeddings.patch_embedding.bias"), "patch_bias")
        self.positions = self._vector(v("embeddings.position_embedding.weight"), "position_embedding")
        self.layers: list[_Layer] = []
        for i in range(cfg.num_layers):
            p = f"encoder.layers.{i}."
            a = p + "self_attn."
            qkv = tuple(self._matrix(v(f"{a}{m}_proj.weight"), f"{i}.{m}_proj") for m in "qkv")
            self.layers.append(
                _Layer(
                    ln1=(
                        self._vector(v(p + "layer_norm1.weight"), "ln1"),
                        self._vector(v(p + "layer_norm1.bias"), "ln1b"),
                    ),
                    qkv=(qkv[0], qkv[1], qkv[2]),
                    qkv_bias=self._vector(np.concatenate([v(f"{a}{m}_proj.bias") for m in "qkv"]), "qkv_bias"),
                    out=self._matrix(v(a + "out_proj.weight"), f"{i}.out_proj"),
                    out_bias=self._vector(v(a + "out_proj.bias"), "out_bias"),
                    ln2=(
                        self._vector(v(p + "layer_norm2.weight"), "ln2"),
                        self._vector(v(p + "layer_norm2.bias"), "ln2b"),
                    ),
                    fc1=self._matrix(v(p + "mlp.fc1.weight"), f"{i}.fc1", rows=self.inter),
                    fc1_bias=self._vector(_padded(v(p + "mlp.fc1.bias"), self.inter), "fc1_bias"),
                    fc2=self._matrix(v(p + "mlp.fc2.weight"), f"{i}.fc2", cols=self.inter),
                    fc2_bias=self._vector(v(p + "mlp.fc2.bias"), "fc2_bias"),
                )
            )
        self.post = (
            self._vector(v("post_layernorm.weight"), "post_ln"),
            self._vector(v("post_layernorm.bias"), "post_lnb"),
        )
        self.soft_norm = self._vector(tensor(SOFT_NORM) + np.float32(1.0), "soft_norm")  # Gemma's RMSNorm: 1 + w
        projection = tensor(PROJECTION)  # [vision width, text width], input-major
        if projection.shape != (W, cfg.text_hidden_size):
            raise ValueError(f"{PROJECTION} has shape {projection.shape}, expected ({W}, {cfg.text_hidden_size})")
        self.projection = self._matrix(projection.T, "projection")

    def _allocate(self) -> None:
        cfg, N, W = self.cfg, self.n_patches, self.cfg.hidden_size

        def buf(floats: int, name: str) -> Buffer:
            b = self.dev.buffer(4 * floats, name=name)
            self._owned.append(b)
            return b

        def host(floats: int, name: str) -> Buffer:
            b = self.dev.buffer(4 * floats, host=True, name=name)
            self._owned.append(b)
            return b

        self.pixels_in = host(N * self.k_patch, "patches_in")
        self.soft_out = host(self.n_tokens * cfg.text_hidden_size, "soft_tokens_out")
        self.tower_out = host(N * W, "tower_out")
        self.pixels = buf(N * self.k_patch, "patches")
        self.x = buf(N * W, "vision_x")  # the residual stream
        self.h = buf(N * W, "vision_h")  # LayerNorm outputs; after the post LayerNorm, the tower's output
        self.qkv = buf(N * 3 * W, "vision_qkv")
        self.attn = buf(N * W, "vision_attn")
        self.o = buf(N * W, "vision_o")
        self.mlp = buf(N * self.inter, "vision_mlp")
        self.pooled = buf(self.n_tokens * W, "vision_pooled")
        self.normed = buf(self.n_tokens * W, "vision_normed")
        self.soft = buf(self.n_tokens * cfg.text_hidden_size, "soft_tokens")

    # ---- the recorded pass ---------------------------------------------------------------

    def _gemm(
        self, cl: CommandList, x: Buffer, w: Tensor, y: Buffer | tuple[Buffer, int, int], m: int, k: int, ys: int
    ) -> None:
        ops_gemm.gemm(
            cl,
            self.dev,
            x,
            w,
            y,
            wtype=self.matrix_type,
            m=m,
            n=w.rows,
            k=k,
            x_stride=k,
            y_stride=ys,
            kernel_name=self.gemm_kernel,
        )

    def _layer_gemms(self, cl: CommandList, L: _Layer) -> None:
        """One layer's GEMMs (q, k, v, out, fc1, fc2) on whatever the buffers hold (timing only)."""
        N, W = self.n_patches, self.cfg.hidden_size
        for j, m in enumerate(L.qkv):
            self._gemm(cl, self.h, m, (self.qkv, 4 * j * W, self.qkv.size - 4 * j * W), N, W, 3 * W)
        self._gemm(cl, self.attn, L.out, self.o, N, W, W)
        self._gemm(cl, self.h, L.fc1, self.mlp, N, W, self.inter)
        self._gemm(cl, self.mlp, L.fc2, self.o, N, self.inter, W)

    def choose_gemm_kernel(self, candidates: tuple[str, ...]) -> str:
        """The fastest of `candidates` (ops_gemm kernel names) on one layer's GEMMs, timed on the
        device (timing.time_many); the times stay in `gemm_timing`. A bigger tile reads each
        weight tile for more patches but fills fewer workgroups: which wins is the GPU's."""
        from phoenix_chat.engine.backends.vulkan.timing import time_many

        chosen = self.gemm_kernel
        L = self.layers[0]

        def record(kernel: str) -> Callable[[CommandList], None]:
            def rec(cl: CommandList) -> None:
                self.gemm_kernel = kernel
                self._layer_gemms(cl, L)

            return rec

        try:
            self.gemm_timing = time_many(self.dev, {k: record(k) for k in candidates}, reps=3)
        finally:
            self.gemm_kernel = chosen
        return min(self.gemm_timing, key=self.gemm_timing.__getitem__)

    def _record(self, keep_tower: bool, profile: bool = False) -> CommandList:
        """profile: a timestamp at every barrier (`profile`), else two around the list."""
        cfg, dev, N, W = self.cfg, self.dev, self.n_patches, self.cfg.hidden_size
        eps = cfg.layer_norm_eps
        heads = cfg.num_heads
        stamps = (11 * cfg.num_layers + 16 if profile else 2) if dev.caps.timestamp_bits else 0
        cl = dev.commands(name=f"siglip[{N}]", timestamps=stamps)
        self._lists.append(cl)
        if profile:
            cl.profile_labels = []
        if stamps:
            cl.timestamp(0)
        cl.copy(self.pixels_in, self.pixels, self.pixels.size)
        mark(cl, "upload")
        self._gemm(cl, self.pixels, self.patch, self.x, N, self.k_patch, W)
        mark(cl, "patch_embedding")
        ops_vision.bias(cl, dev, self.x, self.patch_bias, self.positions, rows=N, n=W, mode=ops_vision.BIAS_POSITION)
        mark(cl, "bias_position")
        for L in self.layers:
            ops_vision.layer_norm(cl, dev, self.x, *L.ln1, self.h, rows=N, n=W, eps=eps)
            mark(cl, "layer_norm1")
            for j, m in enumerate(L.qkv):  # one GEMM per matrix into its columns of qkv
                off = 4 * j * W
                self._gemm(cl, self.h, m, (self.qkv, off, self.qkv.size - off), N, W, 3 * W)
            mark(cl, "qkv")
            ops_vision.bias(cl, dev, self.qkv, L.qkv_bias, self.qkv, rows=N, n=3 * W, mode=ops_vision.BIAS)
            mark(cl, "qkv_bias")
            ops_vision.attention(
                cl,
                dev,
                self.qkv,
                self.attn,
                n_tokens=N,
                n_heads=heads,
                head_dim=W // heads,
                stride=3 * W,
                k_off=W,
                v_off=2 * W,
            )
            mark(cl, "attention")
            self._gemm(cl, self.attn, L.out, self.o, N, W, W)
            mark(cl, "out_proj")
            ops_vision.bias(cl, dev, self.o, L.out_bias, self.x, rows=N, n=W, mode=ops_vision.BIAS_RESIDUAL)
            mark(cl, "residual")
            ops_vision.layer_norm(cl, dev, self.x, *L.ln2, self.h, rows=N, n=W, eps=eps)
            mark(cl, "layer_norm2")
            self._gemm(cl, self.h, L.fc1, self.mlp, N, W, self.inter)
            mark(cl, "fc1")
            ops_vision.bias(cl, dev, self.mlp, L.fc1_bias, self.mlp, rows=N, n=self.inter, mode=ops_vision.BIAS_GELU)
            mark(cl, "gelu")
            self._gemm(cl, self.mlp, L.fc2, self.o, N, self.inter, W)
            mark(cl, "fc2")
            ops_vision.bias(cl, dev, self.o, L.fc2_bias, self.x, rows=N, n=W, mode=ops_vision.BIAS_RESIDUAL)
            mark(cl, "residual")
        ops_vision.layer_norm(cl, dev, self.x, *self.post, self.h, rows=N, n=W, eps=eps)
        mark(cl, "post_layernorm")
        ops_vision.pool(cl, dev, self.h, self.pooled, side=cfg.patches_per_side, k=cfg.pool_kernel, n=W)
        mark(cl, "pool")
        ops_norm.norm(cl, dev, self.pooled, self.soft_norm, self.normed, rows=self.n_tokens, n=W, eps=eps)
        mark(cl, "soft_norm")
        self._gemm(cl, self.normed, self.projection, self.soft, self.n_tokens, W, cfg.text_hidden_size)
        mark(cl, "projection")
        cl.copy(self.soft, self.soft_out, self.soft.size)
        if keep_tower:
            cl.copy(self.h, self.tower_out, self.h.size)
        if profile:
            mark(cl, "copy_out")
        elif stamps:
            cl.barrier()
            cl.timestamp(1)
        return cl.end()

    # ---- running ----------------------------------------------------------------------------

    def run(self, pixels: F32, keep_tower: bool = True) -> None:
        """One picture [3, size, size] (preprocessed) through the tower and the projector (read
        the results with `soft_tokens` and, with keep_tower, `tower_output`)."""
        patches = self._patches(pixels)
        self.pixels_in.view(np.float32, patches.size)[:] = patches.reshape(-1)
        self.last = self.list_keeping if keep_tower else self.list
        self.last.submit(wait=True)
        self.kept = keep_tower

    def _patches(self, pixels: F32) -> F32:
        size = self.cfg.image_size
        if pixels.shape != (3, size, size):
            raise ValueError(f"pixel values of shape {pixels.shape}, expected (3, {size}, {size})")
        patches = patchify(np.asarray(pixels, np.float32), self.cfg.patch_size)
        if patches.shape[1] != self.k_patch:
            patches = np.pad(patches, ((0, 0), (0, self.k_patch - patches.shape[1])))
        return patches

    def gpu_seconds(self) -> float | None:
        """GPU time of the last `run` (None: the device has no timestamps)."""
        if not self.dev.caps.timestamp_bits:
            return None
        ts = self.last.timestamps_ns(2)
        return float(ts[1] - ts[0]) * 1e-9

    def profile(self, pixels: F32, runs: int = 3) -> dict[str, float]:
        """GPU milliseconds by op kind of one picture (the last of `runs`: the first warm clocks
        and caches), from a timestamp after every barrier, plus "total". For benchmarks: the
        profiled list is recorded here, on the calling thread."""
        if not self.dev.caps.timestamp_bits:
            raise ValueError(f"{self.dev.name}: the compute queue has no timestamps")
        cl = self._record(keep_tower=False, profile=True)
        patches = self._patches(pixels)
        for _ in range(runs):
            self.pixels_in.view(np.float32, patches.size)[:] = patches.reshape(-1)
            cl.submit(wait=True)
        labels = cl.profile_labels
        assert labels is not None
        ms = np.diff(cl.timestamps_ns(len(labels) + 1)) / 1e6
        out: dict[str, float] = {}
        for label, t in zip(labels, ms, strict=True):
            out[label] = out.get(label, 0.0) + float(t)
        out["total"] = float(ms.sum())
        return out

    def soft_tokens(self) -> F32:
        """[mm_tokens_per_image, text width] of the last `run`."""
        return self.soft_out.view(np.float32, self.soft.size // 4).reshape(self.n_tokens, -1).copy()

    def tower_output(self) -> F32:
        """[patches, vision width] of the last `run` (the post LayerNorm's output)."""
        if not self.kept:
            raise ValueError("the last run did not keep the tower's output (run(..., keep_tower=True))")
        return self.tower_out.view(np.float32, self.h.size // 4).reshape(self.n_patches, -1).copy()

    def encode(self, pixels: F32) -> F32:
        """Soft tokens of one preprocessed picture (thread-safe; `run` and the reads are not)."""
        with self._lock:
            self.run(pixels, keep_tower=False)
            return self.soft_tokens()

    def encode_with_tower(self, pixels: F32) -> tuple[F32, F32]:
        """(the tower's output, the soft tokens) of one preprocessed picture (thread-safe)."""
        with self._lock:
            self.run(pixels, keep_tower=True)
            return self.tower_output(), self.soft_tokens()

    def weight_bytes(self) -> int:
        return sum(t.buffer.size for t in self._tensors) + sum(b.size for b in self._vectors)

    def scratch_bytes(self) -> int:
        """Activations and the host-mapped in/out buffers."""
        return sum(b.size for b in self._owned) - self.weight_bytes()

    def close(self) -> None:
        for cl in self._lists:
            cl.destroy()
        self._lists.clear()
        for b in self._owned:
            b.destroy()
        self._owned.clear()


def _padded(values: F32, n: int) -> F32:
    out = np.zeros(n, np.float32)
    out[: len(values)] = values
    return out
