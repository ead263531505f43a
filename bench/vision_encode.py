"""Picture encode and image-token prefill on a Vulkan device: `python -m bench.vision_encode`.

1. The SigLIP vision tower + Gemma 3 projector (engine/backends/vulkan/siglip_graph.py) with
   synthetic weights of the real 4B/12B/27B shape (SigLIP so400m: width 1152, 27 layers, 16
   heads of 72, MLP 4304, 896 px / patch 14 = 4,096 patches, pooled to 256 soft tokens,
   projected into 2560): time to encode one picture (pixels in, soft tokens out), warm-up runs
   then the median of --repeats, wall clock (patchify + copy in, the recorded list, copy out)
   and GPU time (timestamps), for each --matrix-types; then the GPU time by op of one picture.
2. The prefill of a prompt holding one picture (256 soft tokens) through a text model on the
   same device (default: the 4B shape at Q4_0, tools/make_synthetic_gguf.py into --workdir, as
   bench/run.py makes it), with the picture's span (soft tokens in place, bidirectional inside
   the picture) and, for comparison, the same ids as plain text.

3. With `--llama-mtmd BUILD/bin/llama-mtmd-cli` (bench/llama_cpp_vulkan.py builds it): llama.cpp's
   own picture encode (clip.cpp) and image-token prefill on the same GPU after ours, on a
   synthetic mmproj of the same tower shape (tools/make_synthetic_mmproj.py, F16 matrices as
   llama.cpp's converter writes them) beside the same text GGUF, which then carries Gemma 3's
   tokenizer (copied from the embedded 270M: llama-mtmd-cli tokenizes its prompt), and one
   picture of the tower's size; its figures, ours beside them and the ratios go into the JSON.

numpy and the engine only (no torch, no network): the weights are random, seeded per tensor
name, so the timing is that of the real shapes, not of real pictures. `--tiny`: a small tower
and the tiny text shape, a smoke test that runs on lavapipe in seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from phoenix_chat.engine.vision_config import VisionConfig

REAL = VisionConfig()  # Gemma 3 4B/12B/27B: SigLIP so400m, 896 px, 256 soft tokens into 2560
TINY = VisionConfig(
    image_size=112,
    patch_size=14,
    hidden_size=64,
    intermediate_size=120,  # not a multiple of 32, like so400m's 4304: the padded MLP runs
    num_layers=2,
    num_heads=2,
    mm_tokens_per_image=16,
    text_hidden_size=256,  # tools/make_synthetic_gguf.py's "tiny" text shape
)


def synthetic_tensor(cfg: VisionConfig, seed: int = 0):
    """tensor(name) -> f32 array of the shape transformers' SiglipVisionModel + Gemma 3's projector
    give it, random (seeded by the name): matrices ~N(0, 0.02), biases ~N(0, 0.01), LayerNorm
    weights ~1, position embeddings ~N(0, 0.02)."""
    W, p, inter = cfg.hidden_size, cfg.patch_size, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.patch_embedding.weight": (W, 3, p, p),
        "embeddings.patch_embedding.bias": (W,),
        "embeddings.position_embedding.weight": (cfg.patches_per_side**2, W),
        "post_layernorm.weight": (W,),
        "post_layernorm.bias": (W,),
    }
    for i in range(cfg.num_layers):
        lp = f"encoder.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[f"{lp}self_attn.{n}.weight"] = (W, W)
            shapes[f"{lp}self_attn.{n}.bias"] = (W,)
        for n in ("layer_norm1", "layer_norm2"):
            shapes[f"{lp}{n}.weight"] = (W,)
            shapes[f"{lp}{n}.bias"] = (W,)
        shapes[f"{lp}mlp.fc1.weight"] = (inter, W)
        shapes[f"{lp}mlp.fc1.bias"] = (inter,)
        shapes[f"{lp}mlp.fc2.weight"] = (W, inter)
        shapes[f"{lp}mlp.fc2.bias"] = (W,)
    from phoenix_chat.engine.backends.vulkan.siglip_graph import PROJECTION, SOFT_NORM
    from phoenix_chat.engine.models.siglip import PREFIX

    full = {PREFIX + k: v for k, v in shapes.items()}
    full[SOFT_NORM] = (W,)
    full[PROJECTION] = (W, cfg.text_hidden_size)

    def tensor(name: str) -> np.ndarray:
        shape = full[name]
        rng = np.random.default_rng([seed, int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")])
        if name.endswith("layer_norm1.weight") or name.endswith("layer_norm2.weight") or "post_layernorm.w" in name:
            return (1.0 + 0.05 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        std = 0.01 if len(shape) == 1 else 0.02
        return (std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)

    return tensor


def _ms(xs: list[float]) -> tuple[float, float, float]:
    return 1e3 * statistics.median(xs), 1e3 * min(xs), 1e3 * max(xs)


def bench_tower(dev, cfg: VisionConfig, matrix_type: str, warmup: int, repeats: int) -> dict[str, Any]:
    from phoenix_chat.engine.backends.vulkan.siglip_graph import SiglipGraph

    t0 = time.perf_counter()
    tower = SiglipGraph(dev, cfg, synthetic_tensor(cfg), matrix_type=matrix_type)
    build_s = time.perf_counter() - t0
    try:
        rng = np.random.default_rng(1)
        pixels = rng.uniform(-1, 1, (3, cfg.image_size, cfg.image_size)).astype(np.float32)
        for _ in range(warmup):
            tower.encode(pixels)
        wall, gpu = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            soft = tower.encode(pixels)
            wall.append(time.perf_counter() - t)
            g = tower.gpu_seconds()
            if g is not None:
                gpu.append(g)
        if not np.isfinite(soft).all():
            raise RuntimeError(f"{matrix_type}: the soft tokens are not finite")
        ops = tower.profile(pixels) if dev.caps.timestamp_bits else {}
        return {
            "matrix_type": matrix_type,
            "gemm": tower.gemm_kernel,
            "gemm_timing_us": tower.gemm_timing,
            "build_s": build_s,
            "weight_mib": tower.weight_bytes() / 2**20,
            "wall_ms": _ms(wall),
            "gpu_ms": _ms(gpu) if gpu else None,
            "ops_ms": ops,
        }
    finally:
        tower.close()


def check_accuracy(dev, cfg: VisionConfig, matrix_type: str) -> dict[str, float]:
    """The device tower against the numpy reference (engine/models/siglip.py + projector) at
    this config's widths but one layer and a 224 px picture (the full tower's reference would
    take minutes in numpy): max abs difference of the tower's output and of the soft tokens, and
    the largest magnitudes, on this device's own GEMM path (matrix cores with f16 operands where
    it has them, which the lavapipe tests cannot reach)."""
    from dataclasses import replace

    from phoenix_chat.engine.backends.vulkan.siglip_graph import PROJECTION, SOFT_NORM, SiglipGraph
    from phoenix_chat.engine.models.siglip import SiglipVisionTower
    from phoenix_chat.engine.vision.projector import project

    side = min(cfg.patches_per_side, 16)
    tokens = min(cfg.mm_tokens_per_image, (side // cfg.pool_kernel) ** 2)
    small = replace(cfg, num_layers=1, image_size=side * cfg.patch_size, mm_tokens_per_image=tokens)
    tensor = synthetic_tensor(small)
    pixels = np.random.default_rng(3).uniform(-1, 1, (3, small.image_size, small.image_size)).astype(np.float32)
    ref = SiglipVisionTower(small, tensor).forward(pixels)
    soft_ref = project(ref, tensor(SOFT_NORM) + np.float32(1), tensor(PROJECTION), small)
    g = SiglipGraph(dev, small, tensor, matrix_type=matrix_type)
    try:
        tower, soft = g.encode_with_tower(pixels)
    finally:
        g.close()
    return {
        "tower_max_abs_err": float(np.abs(tower - ref).max()),
        "tower_max_abs": float(np.abs(ref).max()),
        "soft_max_abs_err": float(np.abs(soft - soft_ref).max()),
        "soft_max_abs": float(np.abs(soft_ref).max()),
    }


def tower_flops(cfg: VisionConfig) -> tuple[float, float]:
    """(linear FLOPs, attention FLOPs) of one picture."""
    N, W, inter = cfg.patches_per_side**2, cfg.hidden_size, cfg.intermediate_size
    per_layer = 2 * N * (4 * W * W + 2 * W * inter)
    linear = cfg.num_layers * per_layer + 2 * N * W * 3 * cfg.patch_size**2
    linear += 2 * cfg.mm_tokens_per_image * W * cfg.text_hidden_size
    return linear, cfg.num_layers * 4.0 * N * N * W


def bench_prefill(dev, text_path: Path, cfg: VisionConfig, warmup: int, repeats: int) -> dict[str, Any]:
    """A prompt [bos, <start_of_image>, soft tokens..., <end_of_image>, 8 text ids] through the
    text model: with the picture's span, and the same ids as text."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.vision.spans import ImageSpan
    from phoenix_chat.engine.weights import open_weights

    weights = open_weights(text_path)
    tcfg = weights.config
    if tcfg.hidden_size != cfg.text_hidden_size:
        raise ValueError(f"{text_path}: width {tcfg.hidden_size}, the projector makes {cfg.text_hidden_size}")
    n_img = cfg.mm_tokens_per_image
    V = tcfg.vocab_size
    # the placeholder's own embedding is replaced; a small vocabulary (the tiny shape) lacks its id
    placeholder = cfg.image_token_id if cfg.image_token_id < V else V - 1
    boi = cfg.boi_token_id if cfg.boi_token_id < V else V - 2
    eoi = cfg.eoi_token_id if cfg.eoi_token_id < V else V - 3
    ids = [2, boi, *([placeholder] * n_img), eoi, *range(100, 108)]
    rng = np.random.default_rng(2)
    soft = (rng.standard_normal((n_img, tcfg.hidden_size), dtype=np.float32) * 0.5).astype(np.float32)
    span = ImageSpan(2, soft, "synthetic")
    t0 = time.perf_counter()
    backend = VulkanBackend(weights, 1024, VulkanOptions(allow_software=True), device=dev)
    load_s = time.perf_counter() - t0
    try:
        out: dict[str, Any] = {"prompt_tokens": len(ids), "image_tokens": n_img, "load_s": load_s}
        out["prefill_chunk"] = backend.prefill_chunk
        for label, run in (
            ("with_picture", lambda: backend.forward_images(ids, 0, [span])),
            ("as_text", lambda: backend.forward(ids, 0)),
        ):
            for _ in range(warmup):
                run()
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                logits = run()
                times.append(time.perf_counter() - t)
            if not np.isfinite(logits).all():
                raise RuntimeError(f"prefill {label}: logits not finite")
            out[label + "_ms"] = _ms(times)
        return out
    finally:
        backend.close()
        weights.close()


def text_model(args: argparse.Namespace) -> Path:
    """The text GGUF both engines prefill: --text-model, else the synthetic one of --text-shape
    (with a tokenizer when llama-mtmd-cli is to read it too: another file, the same tensors)."""
    if args.text_model:
        return Path(args.text_model)
    from tools.make_synthetic_gguf import write

    shape = "tiny" if args.tiny else args.text_shape
    vocab = bool(args.llama_mtmd)
    # bench/run.py's name: one file for both; with a vocabulary, a file of its own
    p = Path(args.workdir) / f"synthetic-{shape}-q4_0{'-vocab' if vocab else ''}.gguf"
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        print(f"generating {p} ...", flush=True)
        vocab_from = None
        if vocab:
            from phoenix_chat.engine.weights import embedded_model_path

            vocab_from = embedded_model_path()
        part = p.with_name(p.name + ".partial")
        write(part, shape, "q4_0", "q8_0", vocab_from=vocab_from)
        part.rename(p)
    return p


def llama_mtmd_inputs(cfg: VisionConfig, workdir: Path) -> tuple[Path, Path]:
    """(synthetic mmproj of this tower, F16 as the converter writes it; a picture of its size)."""
    from PIL import Image

    from tools.make_synthetic_mmproj import write

    workdir.mkdir(parents=True, exist_ok=True)
    tag = f"{cfg.hidden_size}x{cfg.num_layers}-{cfg.image_size}px-to{cfg.text_hidden_size}"
    mmproj = workdir / f"mmproj-synthetic-{tag}-f16.gguf"
    if not mmproj.exists():
        print(f"generating {mmproj} ...", flush=True)
        part = mmproj.with_name(mmproj.name + ".partial")
        write(part, cfg, "f16")
        part.rename(mmproj)
    picture = workdir / f"picture-{cfg.image_size}.png"
    if not picture.exists():
        rng = np.random.default_rng(4)
        pixels = rng.integers(0, 256, (cfg.image_size, cfg.image_size, 3), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(picture)
    return mmproj, picture


def bench_llama_mtmd(
    binary: Path, text: Path, cfg: VisionConfig, workdir: Path, repeats: int, ours: dict[str, Any]
) -> dict[str, Any]:
    """llama.cpp's encode and image prefill (best of flash attention on/off, each the median of
    `repeats` runs after a warm-up) beside ours: our F16 tower's wall-clock encode (else the first
    matrix type measured) and our prefill of the prompt holding the picture, as rates too since
    the token counts differ (ours: bos + the picture's span + 8 ids; llama.cpp's: the picture's
    soft tokens, its text chunks being decoded apart)."""
    from bench.llama_cpp_vulkan import run_mtmd

    mmproj, picture = llama_mtmd_inputs(cfg, workdir)
    runs = []
    for fa in ("on", "off"):
        try:
            runs.append(run_mtmd(binary, text, mmproj, picture, repeats, "full", fa))
        except RuntimeError as exc:
            print(f"llama.cpp mtmd -fa {fa}: {exc}", flush=True)
    if not runs:
        raise RuntimeError("llama-mtmd-cli failed with flash attention on and off")
    enc = min(runs, key=lambda r: r.encode_ms)
    dec = min(runs, key=lambda r: r.image_prefill_ms)
    out: dict[str, Any] = {
        "binary": str(binary),
        "mmproj": str(mmproj),
        "picture": str(picture),
        "text_model": str(text),
        "device_line": enc.device_line,
        "clip_backend": enc.clip_backend,
        "runs": [asdict(r) for r in runs],
        "encode_ms": enc.encode_ms,
        "encode_flash_attn": enc.flash_attn,
        "image_prefill_ms": dec.image_prefill_ms,
        "image_prefill_flash_attn": dec.flash_attn,
        "image_tokens": dec.image_tokens,
    }
    tower = next((t for t in ours["tower"] if t["matrix_type"] == "F16"), ours["tower"][0] if ours["tower"] else None)
    if tower is not None:
        mine = tower["wall_ms"][0]
        out["ours_encode_ms"] = mine
        out["ours_encode_matrix_type"] = tower["matrix_type"]
        out["encode_speedup_vs_llama"] = enc.encode_ms / mine  # > 1: ours is faster
    if "prefill" in ours:
        p = ours["prefill"]
        mine = p["with_picture_ms"][0]
        out["ours_prefill_ms"] = mine
        out["ours_prefill_tokens"] = p["prompt_tokens"]
        ours_rate = p["prompt_tokens"] / mine * 1e3
        llama_rate = dec.image_tokens / dec.image_prefill_ms * 1e3 if dec.image_prefill_ms else float("inf")
        out["ours_prefill_tok_s"], out["llama_image_prefill_tok_s"] = ours_rate, llama_rate
        out["prefill_rate_ratio_vs_llama"] = ours_rate / llama_rate  # > 1: ours is faster
    return out


def print_llama_mtmd(m: dict[str, Any]) -> None:
    print(f"llama.cpp mtmd ({m['device_line']}; {m['clip_backend']}):")
    for r in m["runs"]:
        print(
            f"  -fa {r['flash_attn']:<4} encode {r['encode_ms']:7.1f} ms (runs {r['encode_runs_ms']}), "
            f"{r['image_tokens']} image tokens prefilled in {r['image_prefill_ms']:.1f} ms "
            f"(runs {r['image_prefill_runs_ms']})"
        )
    if "ours_encode_ms" in m:
        print(
            f"  encode: llama.cpp {m['encode_ms']:.1f} ms, ours ({m['ours_encode_matrix_type']}, wall) "
            f"{m['ours_encode_ms']:.2f} ms: ours {m['encode_speedup_vs_llama']:.2f}x llama.cpp's speed"
        )
    if "ours_prefill_ms" in m:
        print(
            f"  picture prefill: llama.cpp {m['image_prefill_ms']:.1f} ms for {m['image_tokens']} image tokens "
            f"({m['llama_image_prefill_tok_s']:.0f} tok/s), ours {m['ours_prefill_ms']:.2f} ms for "
            f"{m['ours_prefill_tokens']} tokens ({m['ours_prefill_tok_s']:.0f} tok/s): "
            f"ours {m['prefill_rate_ratio_vs_llama']:.2f}x llama.cpp's rate"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a small tower and text model (smoke test, lavapipe)")
    ap.add_argument("--device", type=int, default=None, help="Vulkan device index (default: the best)")
    ap.add_argument("--matrix-types", default="F16,BF16,Q8_0", help="the tower's matrices: F32,F16,BF16,Q8_0")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--text-shape", default="4b", help="synthetic text model shape (tools/make_synthetic_gguf.py)")
    ap.add_argument("--text-model", help="a GGUF of the text model instead (its width must be the projector's)")
    ap.add_argument("--no-prefill", action="store_true", help="the tower only")
    ap.add_argument("--workdir", default="/tmp/phoenix-bench")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument(
        "--llama-mtmd",
        metavar="LLAMA_MTMD_CLI",
        help="llama.cpp's llama-mtmd-cli (python -m bench.llama_cpp_vulkan build): its encode beside ours",
    )
    ap.add_argument("--llama-repeats", type=int, default=3, help="llama-mtmd-cli runs timed after one warm-up")
    args = ap.parse_args(argv)

    from phoenix_chat.engine.backends.vulkan import ops_gemm
    from phoenix_chat.engine.backends.vulkan.device import Device

    cfg = TINY if args.tiny else REAL
    dev = Device.open(args.device, allow_software=True)
    results: dict[str, Any] = {"device": dev.name, "gemm_path": ops_gemm.path(dev), "tower": []}
    why = ops_gemm.coopmat_refusal(dev)
    try:
        N = cfg.patches_per_side**2
        print(
            f"vision tower on {dev.name}: {cfg.num_layers} layers, width {cfg.hidden_size}, {cfg.num_heads} heads of "
            f"{cfg.hidden_size // cfg.num_heads}, MLP {cfg.intermediate_size}, {cfg.image_size} px -> {N} patches -> "
            f"{cfg.mm_tokens_per_image} soft tokens x {cfg.text_hidden_size}"
        )
        print(f"GEMM path: {ops_gemm.path(dev)}" + (f" (matrix cores not used: {why})" if why else ""))
        linear, attn = tower_flops(cfg)
        print(f"per picture: {linear / 1e12:.3f} TFLOP in linears, {attn / 1e12:.3f} TFLOP in attention")
        print(
            f"{'matrices':<9}{'weights MiB':>12}{'encode ms (wall)':>18}{'GPU ms':>9}"
            f"{'min..max wall':>16}{'TFLOP/s':>9}"
        )
        for mt in args.matrix_types.split(","):
            r = bench_tower(dev, cfg, mt.strip().upper(), args.warmup, args.repeats)
            r["accuracy"] = check_accuracy(dev, cfg, r["matrix_type"])
            results["tower"].append(r)
            med, lo, hi = r["wall_ms"]
            gpu = r["gpu_ms"][0] if r["gpu_ms"] else None
            rate = (linear + attn) / ((gpu or med) * 1e-3) / 1e12
            gpu_s = f"{gpu:9.2f}" if gpu is not None else f"{'-':>9}"
            print(
                f"{r['matrix_type']:<9}{r['weight_mib']:12.0f}{med:18.2f}{gpu_s}{f'{lo:.1f}..{hi:.1f}':>16}{rate:9.1f}"
            )
        print("accuracy vs the numpy reference (these widths, 1 layer, <= 16 x 16 patches), max abs error:")
        for r in results["tower"]:
            a = r["accuracy"]
            print(
                f"  {r['matrix_type']:<7} tower {a['tower_max_abs_err']:.2e} (values to {a['tower_max_abs']:.2f}), "
                f"soft tokens {a['soft_max_abs_err']:.2e} (to {a['soft_max_abs']:.2f})"
            )
        for r in results["tower"]:
            if r["gemm_timing_us"]:
                timing = ", ".join(f"{k} {v:.0f} us" for k, v in sorted(r["gemm_timing_us"].items()))
                print(f"  {r['matrix_type']:<7} GEMM tile chosen: {r['gemm']} (one layer's GEMMs: {timing})")
        first = results["tower"][0]
        if first["ops_ms"]:
            ops = first["ops_ms"]
            total = ops["total"]
            print(f"GPU time by op, {first['matrix_type']} ({total:.2f} ms):")
            for label, t in sorted(ops.items(), key=lambda kv: -kv[1]):
                if label != "total":
                    print(f"  {label:<16}{t:9.3f} ms {100 * t / total:5.1f} %")
        else:
            print("GPU time by op: this device has no timestamps")
        if not args.no_prefill:
            path = text_model(args)
            p = bench_prefill(dev, path, cfg, args.warmup, args.repeats)
            p["text_model"] = str(path)
            results["prefill"] = p
            n = p["prompt_tokens"]
            print(
                f"prefill of {n} tokens ({p['image_tokens']} of them one picture) through {path.name}, "
                f"chunks of {p['prefill_chunk']}:"
            )
            for label in ("with_picture", "as_text"):
                med, lo, hi = p[label + "_ms"]
                print(f"  {label:<13}{med:10.2f} ms  ({n / med * 1e3:8.0f} tok/s; {lo:.1f}..{hi:.1f} ms)")
    finally:
        dev.close()
    if args.llama_mtmd:  # after ours, our device closed: the GPU is llama.cpp's alone
        binary = Path(args.llama_mtmd)
        if not binary.exists():
            raise SystemExit(f"{binary}: no such file (python -m bench.llama_cpp_vulkan build makes it)")
        results["llama_mtmd"] = bench_llama_mtmd(
            binary, text_model(args), cfg, Path(args.workdir), args.llama_repeats, results
        )
        print_llama_mtmd(results["llama_mtmd"])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
