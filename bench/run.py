"""Benchmark suite: `python -m bench.run [--synthetic 270m,4b,27b] [--model PATH] [--json OUT]`.

Default: the embedded 270M on the Vulkan backend (any device; `--backends vulkan,cpu` adds the CPU
reference), then llama.cpp's CPU build on the same file when llama-cpp-python is installed. With
--synthetic, Gemma-3-shaped Q4_0 GGUFs are generated first (tools/make_synthetic_gguf.py)
into --workdir. With --llama-vulkan PATH/llama-bench (built by bench/llama_cpp_vulkan.py, with
its cooperative-matrix and integer-dot shaders), llama.cpp's Vulkan backend runs on every file
in the same run, on the same device, full build and KHR-coopmat-only, and the ratios are printed.
No figure of the peer is quoted from elsewhere: a ratio exists only for a peer measured here.
With --streams 1,2,4,... the many-stream bench (engine/bench_streams.py: the scheduler over that
many slots) runs per file and backend too (--admit-tokens: a long prompt admitted beside the
largest count; --alternate-chats: scripted chats taking turns); --only-streams runs nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path


def main(argv=None) -> int:
    from phoenix_chat.engine.bench import run_bench
    from phoenix_chat.engine.bench_streams import add_streams_arguments

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", default="", help="comma-separated shapes: tiny,270m,1b,4b,12b,27b")
    ap.add_argument(
        "--synthetic-types",
        default="q4_0",
        help="comma-separated weight types of the synthetic files, e.g. q4_0,q2_k,q3_k,iq4_xs (Q8_0 embedding)",
    )
    ap.add_argument("--model", action="append", default=[], help="GGUF path (repeatable)")
    ap.add_argument("--backends", default="vulkan", help="comma-separated: vulkan,cpu")
    ap.add_argument("--workdir", default="/tmp/phoenix-bench")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp (llama-cpp-python) on the same file")
    ap.add_argument("--llama-vulkan", type=Path, help="llama-bench of a fair Vulkan build (bench/llama_cpp_vulkan.py)")
    ap.add_argument("--peer-repeats", type=int, default=5)
    ap.add_argument(
        "--streams",
        default="",
        help="also the many-stream bench per file and backend, e.g. 1,2,4,8,16,32 (engine/bench_streams.py)",
    )
    ap.add_argument("--chat-turns", type=int, default=10, help="with --streams: turns of the scripted chat")
    add_streams_arguments(ap)
    ap.add_argument(
        "--only-streams",
        action="store_true",
        help="with --streams: only the many-stream bench (no single-stream, no peers)",
    )
    args = ap.parse_args(argv)
    if args.only_streams and not args.streams:
        ap.error("--only-streams needs --streams")

    runs = []
    if args.synthetic:
        from tools.make_synthetic_gguf import write

        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        types = args.synthetic_types.split(",")
        for shape in args.synthetic.split(","):
            for wtype in types:
                p = Path(args.workdir) / f"synthetic-{shape}-{wtype}.gguf"
                if not p.exists():
                    print(f"generating {p} ...", flush=True)
                    write(p, shape, wtype, "q8_0")
                runs.append((shape if types == ["q4_0"] else f"{shape}-{wtype}", p))
    for m in args.model:
        runs.append((Path(m).stem, Path(m)))
    if not runs:
        from phoenix_chat.engine.weights import embedded_model_path

        runs.append(("270m-embedded", embedded_model_path()))

    results = []
    for label, path in runs:
        for backend in args.backends.split(","):
            print(f"== {label} on {backend}", flush=True)
            if not args.only_streams:
                r = run_bench(path, backend, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens)
                d = asdict(r)
                d["label"] = label
                print(r.table(), flush=True)
                results.append(d)
                if args.json:
                    Path(args.json).write_text(json.dumps(results, indent=1))
            if args.streams:
                results.append(_streams(label, path, backend, args))
                if args.json:
                    Path(args.json).write_text(json.dumps(results, indent=1))
        if args.only_streams:
            continue
        if args.llama_vulkan:
            results.extend(_llama_vulkan_side_by_side(label, path, args, [d for d in results if d["label"] == label]))
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
        if not args.no_llama_cpp:
            results.append(_llama_cpp_side_by_side(label, path, args, [d for d in results if d["label"] == label]))
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def _streams(label, path, backend, args) -> dict:
    """The scheduler under N concurrent streams on one backend (slots = the largest N)."""
    from phoenix_chat.engine.bench_streams import load_for_streams, parse_streams, run_streams_bench

    counts = parse_streams(args.streams)
    turns, admit, chats = args.chat_turns, args.admit_tokens, args.alternate_chats
    model = load_for_streams(path, backend, counts, args.prompt_tokens, args.gen_tokens, turns, admit, chats)
    try:
        r = run_streams_bench(
            model, counts, args.prompt_tokens, args.gen_tokens, turns, "", admit, chats, args.mixed_sampling
        )
    finally:
        model.close()
    print(r.table(), flush=True)
    return {"label": label, "kind": "streams", **asdict(r)}


def _llama_vulkan_side_by_side(label, path, args, ours) -> list[dict]:
    """llama.cpp's Vulkan backend (fair build) on the same file and device: full and KHR-only."""
    from bench.llama_cpp_vulkan import run_llama_bench

    out = []
    for mode in ("full", "khr"):
        peer = run_llama_bench(args.llama_vulkan, path, args.prompt_tokens, args.gen_tokens, args.peer_repeats, mode)
        d = {"label": label, "backend": f"llama.cpp-vulkan-{mode}", **asdict(peer), "ratios": {}}
        print(
            f"llama.cpp Vulkan [{mode}]: prefill {peer.prefill_tok_s:.1f} tok/s, decode {peer.decode_tok_s:.1f} tok/s"
            f"  ({peer.device_line})",
            flush=True,
        )
        for r in ours:
            if r["backend"] != "vulkan":
                continue
            ratio = {
                "prefill": r["prefill_tok_s"] / peer.prefill_tok_s,
                "decode": r["decode_tok_s"] / peer.decode_tok_s,
            }
            d["ratios"][r["backend"]] = ratio
            print(
                f"  ours / llama.cpp [{mode}]: prefill x{ratio['prefill']:.2f}, decode x{ratio['decode']:.2f}",
                flush=True,
            )
        out.append(d)
    return out


def _llama_cpp_side_by_side(label, path, args, ours) -> dict:
    """llama.cpp's CPU build on the same GGUF and prompt, in the same run; ratios printed."""
    from bench.llama_cpp_peer import run_llama_cpp
    from phoenix_chat.engine.bench import bench_prompt
    from phoenix_chat.engine.weights import open_weights

    weights = open_weights(path)
    prompt = bench_prompt(weights.config, args.prompt_tokens)  # the prompt our backends ran
    weights.close()
    peer = run_llama_cpp(path, prompt, args.gen_tokens)
    if peer is None:
        print("llama.cpp: llama-cpp-python is not installed (pip install '.[bench]'); no side-by-side", flush=True)
        return {"label": label, "backend": "llama.cpp", "error": "llama-cpp-python not installed"}
    print(f"{peer.name}: prefill {peer.prefill_tok_s:.1f} tok/s, decode {peer.decode_tok_s:.1f} tok/s", flush=True)
    d = {"label": label, "backend": "llama.cpp-cpu", **asdict(peer), "ratios": {}}
    for r in ours:
        ratio = {"prefill": r["prefill_tok_s"] / peer.prefill_tok_s, "decode": r["decode_tok_s"] / peer.decode_tok_s}
        d["ratios"][r["backend"]] = ratio
        print(
            f"  ours ({r['backend']}) / llama.cpp CPU: prefill x{ratio['prefill']:.2f}, decode x{ratio['decode']:.2f}",
            flush=True,
        )
    return d


if __name__ == "__main__":
    sys.exit(main())
