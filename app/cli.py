"""`phoenix-chat` console script: the GUI with no arguments, otherwise a subcommand.

Contract (issue "Foundation"): run, chat, tokenize, info, perplexity, devices, export, bench.
User errors print one line to stderr and exit 2; generated text goes to stdout alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from phoenix_chat.app.remote_cli import add_remote_args, refuse_remote_flags_without_remote
from phoenix_chat.engine.quantization import WeightQuant

EXIT_USAGE = 2
MAX_TOKENS = 256  # answer length in the terminal (the app's own is in its settings)


def _add_model_args(p, backend=True):
    p.add_argument("--model", metavar="PATH", help="GGUF file or Hugging Face folder (default: embedded Gemma 3 270M)")
    if backend:
        p.add_argument("--backend", choices=["auto", "cpu", "vulkan", "npu-hybrid"], default="auto")
        p.add_argument("--device", type=int, default=None, metavar="N", help="Vulkan device index (see `devices`)")
        p.add_argument("--ctx", type=_bounded(int, 1), default=None, metavar="N", help="context length")
        p.add_argument(
            "--quant",
            choices=[q.value for q in WeightQuant],
            default=None,
            help="re-quantize the weights on load (Vulkan: on the device; CPU: values rounded, computed in f32)",
        )


def _add_mmproj_arg(p):
    p.add_argument(
        "--mmproj",
        metavar="PATH",
        default=None,
        help="the vision tower of a text GGUF, as llama.cpp splits Gemma 3 4B/12B/27B (mmproj-*.gguf); "
        "default: the one mmproj*.gguf beside the model, if there is exactly one",
    )


def _bounded(kind: type, low: float, high: float | None = None, *, above: bool = False):
    """An argparse type: a `kind` number from `low` (or above it) up to `high`, else the flag's
    error with the range; out-of-range values went to the engine before (--max-tokens 0 still
    wrote a token, --temperature -1 sampled greedily)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if (value <= low if above else value < low) or (high is not None and value > high):
            if above:
                wanted = f"more than {low:g}" + (f", up to {high:g}" if high is not None else "")
            else:
                wanted = f"{low:g}" + (f" to {high:g}" if high is not None else " or more")
            raise argparse.ArgumentTypeError(f"{text}: takes {wanted}")
        return value

    return parse


def _add_sampling_args(p):
    # No sampling defaults here: a flag left out is the engine's SamplingParams default. The
    # ranges are the server's (app/server/parsing.py), where they are the same quantity.
    p.add_argument("--max-tokens", type=_bounded(int, 1), default=MAX_TOKENS)
    p.add_argument("--temperature", type=_bounded(float, 0.0), help="0: greedy")
    p.add_argument("--top-k", type=_bounded(int, 0), help="0: off")
    p.add_argument("--top-p", type=_bounded(float, 0.0, 1.0), help="1: off")
    p.add_argument("--min-p", type=_bounded(float, 0.0, 1.0), help="0: off")
    p.add_argument("--repeat-penalty", type=_bounded(float, 0.0, above=True), help="1: off")
    p.add_argument("--seed", type=_bounded(int, 0))
    p.add_argument("--system", default=None, help="system prompt (folded into the first user turn)")


def _add_serve_args(p):
    from phoenix_chat.app.server.config import DEFAULT_HOST, DEFAULT_PORT

    p.add_argument("--host", default=DEFAULT_HOST, help="address to bind (another than loopback needs --api-key)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--api-key", default=None, metavar="KEY", help="clients must send Authorization: Bearer KEY")
    p.add_argument(
        "--parallel", type=int, default=1, metavar="N", help="requests the engine runs at once (its scheduler's slots)"
    )
    p.add_argument(
        "--max-queue", type=int, default=None, metavar="N", help="requests that may wait for a slot; more get 429"
    )
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN", help="a web origin allowed to call")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME", help="another name for the Host header")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="phoenix-chat", description="Local Gemma 3 chat. No arguments: open the app.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command")

    p = sub.add_parser("run", help="generate a reply to PROMPT, streamed to stdout")
    p.add_argument("prompt")
    p.add_argument("--raw", action="store_true", help="feed PROMPT as plain text after <bos>, no chat template")
    _add_model_args(p)
    _add_mmproj_arg(p)
    _add_sampling_args(p)
    p.add_argument(
        "--draft",
        metavar="PATH",
        default=None,
        help="speculative decoding: a small model with the same tokenizer proposes tokens "
        "(e.g. Gemma 3 270M or 1B for 4B-27B); the output is the same",
    )
    p.add_argument(
        "--draft-tokens", type=_bounded(int, 1), default=4, metavar="K", help="tokens the draft proposes per round"
    )
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="a picture (PNG, JPEG, WebP, GIF) placed before PROMPT; repeat for several "
        "(Gemma 3 4B/12B/27B multimodal models, CPU backend for now)",
    )
    p.add_argument(
        "--pan-and-scan",
        action="store_true",
        help="with --image: also show the model up to 4 crops of a wide or tall picture "
        "(Gemma 3's pan-and-scan; more prompt tokens, finer detail)",
    )
    add_remote_args(p)

    p = sub.add_parser("chat", help="interactive chat in the terminal")
    _add_model_args(p)
    _add_mmproj_arg(p)
    _add_sampling_args(p)
    add_remote_args(p)

    p = sub.add_parser("tokenize", help="print the token ids of TEXT as a raw prompt (<bos> included)")
    p.add_argument("text")
    _add_model_args(p, backend=False)

    p = sub.add_parser("info", help="architecture, parameters, tensor types, context, file size, memory fit")
    _add_model_args(p, backend=False)
    _add_mmproj_arg(p)
    p.add_argument(
        "--ctx", type=_bounded(int, 1), default=None, metavar="N", help="context length for the memory estimate"
    )
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("perplexity", help="llama.cpp-style perplexity of a text file")
    p.add_argument("file")
    _add_model_args(p)

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP API on this machine (headless)")
    _add_model_args(p)
    _add_mmproj_arg(p)
    _add_serve_args(p)

    p = sub.add_parser("devices", help="what compute is available")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser(
        "doctor",
        help="what to paste into a bug report: system, GPUs, kernel paths, autotuner picks, "
        "a short measurement per device, NPU",
    )
    p.add_argument("--json", action="store_true", help="JSON instead of Markdown")
    p.add_argument("--out", help="also write the report to this file")
    p.add_argument("--json-out", help="also write the report as JSON to this file (one run, both forms)")
    p.add_argument(
        "--no-self-test",
        action="store_true",
        help="skip running kernels and the model on each device (no self-test, tuning or measurement)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=10.0,
        help="the measurement's budget per device (copy bandwidth, prefill, decode; default 10)",
    )
    p.add_argument("--model", help="a GGUF to tune and measure on each device instead of the embedded model")
    p.add_argument("--root", default="/", help="read sys/, dev/ and lib/firmware/ under this folder (a copied tree)")

    p = sub.add_parser("export", help="print every saved conversation")
    p.add_argument("--format", choices=["json", "markdown"], default="json")

    p = sub.add_parser("bench", help="prefill/decode speed, bandwidth and %% of roofline")
    _add_model_args(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument(
        "--streams",
        metavar="N,N,...",
        default=None,
        help="many-stream mode: N concurrent requests through the scheduler for each count "
        "(aggregate and per-stream tok/s, p50/p99 inter-token latency), then a scripted chat's TTFT",
    )
    p.add_argument(
        "--chat-turns", type=int, default=10, metavar="N", help="with --streams: turns of the scripted chat (0: none)"
    )
    from phoenix_chat.engine.bench_streams import add_streams_arguments  # --admit-tokens, --alternate-chats

    add_streams_arguments(p)
    return parser


def _sampling(args):
    """The flags given, over the engine's SamplingParams defaults."""
    from phoenix_chat.engine.sampling import SamplingParams

    given = {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repetition_penalty": args.repeat_penalty,
        "seed": args.seed,
    }
    return SamplingParams(**{k: v for k, v in given.items() if v is not None})


def _load(args, **kw):
    from phoenix_chat import engine

    return engine.load(
        args.model,
        backend=getattr(args, "backend", "cpu"),
        context_length=getattr(args, "ctx", None),
        quant=getattr(args, "quant", None),
        device=getattr(args, "device", None),
        mmproj=getattr(args, "mmproj", None),
        **kw,
    )


def _messages(system, prompt, images=(), pan_and_scan=False):
    msgs = [{"role": "system", "content": system}] if system else []
    if images:  # the pictures first, then the question (as Gemma 3's model card writes it)
        pictures = [{"type": "image", "image": path, "pan_and_scan": pan_and_scan} for path in images]
        parts = [*pictures, {"type": "text", "text": prompt}]
        return msgs + [{"role": "user", "content": parts}]
    return msgs + [{"role": "user", "content": prompt}]


# a base model (the embedded 270M is one) answers a chat turn poorly: say what continues text
BASE_MODEL_NOTE = (
    "note: this is a base model, not instruction-tuned: in the chat format it often answers poorly; "
    "--raw continues PROMPT as text instead"
)


def cmd_run(args) -> int:
    refuse_remote_flags_without_remote(args)
    if args.pan_and_scan and not args.image:
        from phoenix_chat.engine.errors import PhoenixError

        raise PhoenixError("--pan-and-scan crops pictures: give one with --image")
    if args.system is not None and args.raw:  # raw text has no turns to put it in: it was dropped
        from phoenix_chat.engine.errors import PhoenixError

        raise PhoenixError("--system needs the chat format: leave out --raw, or put it in PROMPT")
    if args.remote:
        from phoenix_chat.app.remote_cli import run_remote

        return run_remote(args, _sampling(args))
    if args.image and args.raw:
        from phoenix_chat.engine.errors import PhoenixError

        raise PhoenixError("--image needs the chat format: leave out --raw")
    model = _load(args)
    prompt = args.prompt if args.raw else _messages(args.system, args.prompt, args.image, args.pan_and_scan)
    if not args.raw and not model.is_instruction_tuned:
        print(BASE_MODEL_NOTE, file=sys.stderr)
    if args.draft or args.image:
        # the scheduler carries no pictures yet (it refuses them: engine/scheduler.py), so
        # --image goes through stream_generate, as --draft does
        return _run_direct(args, model, prompt)
    from phoenix_chat.engine.requests import Request
    from phoenix_chat.engine.scheduler import Scheduler

    scheduler = Scheduler(model)  # the one engine API (engine/requests.py), as every client
    try:
        stream = scheduler.submit(Request(prompt, _sampling(args), args.max_tokens, raw=args.raw))
        for d in stream:
            if d.text:
                sys.stdout.write(d.text)
                sys.stdout.flush()
    finally:
        scheduler.close()
    final, usage = stream.final, stream.final.usage if stream.final else None
    if final is None or usage is None:  # finish_reason "error": its one line, as any PhoenixError
        from phoenix_chat.engine.errors import PhoenixError

        raise PhoenixError(final.error if final and final.error else "the engine ended without an answer")
    sys.stdout.write("\n")
    ttft = "-" if usage.ttft_s is None else f"{usage.ttft_s * 1000:.0f}"
    prompt_tps = (usage.prompt_tokens - usage.prompt_reused) / usage.ttft_s if usage.ttft_s else 0.0
    print(
        f"[{model.backend.name}: prompt {usage.prompt_tokens} tok at {prompt_tps:.1f} tok/s, "
        f"generated {usage.completion_tokens} tok at {usage.generation_tps:.1f} tok/s, "
        f"ttft {ttft} ms, finish: {final.finish_reason}]",
        file=sys.stderr,
    )
    return 0


def _run_direct(args, model, prompt) -> int:
    """`run --draft` / `run --image`: through stream_generate, not the scheduler (it serves one
    model, and a draft's own cache is outside its slots; it carries no pictures)."""
    from phoenix_chat.engine.generate import stream_generate
    from phoenix_chat.engine.speculative import SpeculativeStats, check_draft

    draft = spec = None
    if args.draft:
        from phoenix_chat import engine

        on = "auto" if args.backend == "npu-hybrid" else args.backend  # the draft decodes, it prefills little
        draft = engine.load(
            args.draft, backend=on, context_length=model.backend.context_length, quant=args.quant, device=args.device
        )
        check_draft(model, draft)
        spec = SpeculativeStats()
    last = None
    for r in stream_generate(
        model,
        prompt,
        _sampling(args),
        args.max_tokens,
        raw=args.raw,
        draft=draft,
        draft_tokens=args.draft_tokens,
        spec_stats=spec,
    ):
        if r.text:
            sys.stdout.write(r.text)
            sys.stdout.flush()
        last = r
    sys.stdout.write("\n")
    assert last is not None  # stream_generate always ends with a final record
    drafted = (
        f", draft {draft.config.name} ({draft.backend.name}) proposals accepted "
        f"{spec.accepted}/{spec.proposed} ({100 * spec.acceptance:.0f} %) in {spec.rounds} target passes "
        f"of up to {args.draft_tokens}, {spec.tokens_per_round:.2f} tok per target pass"
        if draft and spec
        else ""
    )
    ttft = "-" if last.ttft_s is None else f"{last.ttft_s * 1000:.0f}"
    print(
        f"[{model.backend.name}: prompt {last.prompt_tokens} tok at {last.prompt_tps:.1f} tok/s, "
        f"generated {last.generation_tokens} tok at {last.generation_tps:.1f} tok/s, "
        f"ttft {ttft} ms, finish: {last.finish_reason}{drafted}]",
        file=sys.stderr,
    )
    return 0


def cmd_chat(args) -> int:
    refuse_remote_flags_without_remote(args)
    if args.remote:
        from phoenix_chat.app.remote_cli import remote_engine
        from phoenix_chat.app.terminal_chat import remote_terminal_chat

        engine = remote_engine(args)
        try:
            return remote_terminal_chat(engine, _sampling(args), args.max_tokens, system=args.system)
        finally:
            engine.close()
    from phoenix_chat.app.terminal_chat import terminal_chat

    return terminal_chat(_load(args), _sampling(args), args.max_tokens, system=args.system)


def cmd_tokenize(args) -> int:
    from phoenix_chat.engine.weights import embedded_model_path, open_weights

    weights = open_weights(args.model or embedded_model_path())
    ids = weights.tokenizer().encode(args.text, add_bos=True, parse_special=True)
    print(" ".join(str(i) for i in ids))
    return 0


def cmd_info(args) -> int:
    from phoenix_chat.engine.fit import fit_advice
    from phoenix_chat.engine.loader import AUTO_CONTEXT_FLOOR
    from phoenix_chat.engine.weights import embedded_model_path, open_weights
    from phoenix_chat.engine.weights.mmproj import AUTO

    path = args.model or embedded_model_path()
    w = open_weights(path, mmproj=args.mmproj or AUTO)
    cfg = w.config
    # without --ctx: at the smallest context "auto" may pick (loader.AUTO_CONTEXT_FLOOR)
    fit = fit_advice(w, min(args.ctx or AUTO_CONTEXT_FLOOR, cfg.context_length))
    info: dict[str, Any] = {
        "path": str(path),
        "name": cfg.name,
        "architecture": cfg.architecture,
        "parameters": cfg.parameter_count(),
        "layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "heads": cfg.num_heads,
        "kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "context_length": cfg.context_length,
        "sliding_window": cfg.sliding_window,
        "tensor_types": w.tensor_types(),
        "file_size": w.file_size,
        "chat_template": bool(w.chat_template),
        "image_input": _image_input(w),
        "mmproj": str(w.mmproj.path) if w.mmproj is not None else None,
        "mmproj_note": w.mmproj_note or None,
        "fit": {
            "context_length": fit.context_length,
            "need_bytes": fit.need,
            "weights_bytes": fit.weights,
            "kv_cache_bytes": fit.kv_cache,
            "available_bytes": fit.available,
            "total_bytes": fit.total,
            "fits": fit.fits,
            "suggestion": fit.suggestion.name if fit.suggestion else None,
            "line": fit.line(),
        },
    }
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"model:          {info['name']} ({info['path']})")
    print(
        f"architecture:   {cfg.architecture}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
        f"heads {cfg.num_heads}/{cfg.num_kv_heads} kv, head_dim {cfg.head_dim}, ffn {cfg.intermediate_size}"
    )
    print(f"parameters:     {info['parameters'] / 1e6:.1f} M")
    print(f"vocabulary:     {cfg.vocab_size} tokens")
    print(f"context length: {cfg.context_length} (sliding window {cfg.sliding_window})")
    print("tensor types:   " + ", ".join(f"{k} ×{v}" for k, v in sorted(info["tensor_types"].items())))
    print(f"file size:      {w.file_size / 2**20:.1f} MiB")
    print(f"chat template:  {'yes' if w.chat_template else 'no (Gemma 3 format used)'}")
    print(f"image input:    {info['image_input'] or 'no (text-only model)'}")
    if w.mmproj is not None or w.mmproj_note:
        print(f"vision file:    {info['mmproj'] or '-'} ({w.mmproj_note})")
    print(f"memory:         {fit.line()}")
    return 0


def _image_input(weights) -> str | None:
    """One line on the vision tower, or None for a text-only model."""
    v = weights.vision_config
    if v is None:
        return None
    return (
        f"yes: SigLIP {v.image_size} px, patch {v.patch_size}, {v.num_layers} layers, width {v.hidden_size}, "
        f"{v.mm_tokens_per_image} tokens per image"
    )


def cmd_perplexity(args) -> int:
    from phoenix_chat.engine.perplexity import perplexity

    try:
        with open(args.file, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        from phoenix_chat.engine.errors import PhoenixError

        raise PhoenixError(f"{args.file}: {exc.strerror}") from None
    model = _load(args)
    n_ctx = args.ctx or 512

    def progress(done, total, ppl):
        print(f"[{done}/{total}] {ppl:.4f}", file=sys.stderr)

    try:
        result = perplexity(model, text, n_ctx, progress)
    except ValueError as exc:
        from phoenix_chat.engine.errors import PhoenixError

        raise PhoenixError(f"{args.file}: {exc}") from None
    print(
        f"{result['windows']} windows of {n_ctx} tokens, {result['scored_tokens']} scored, backend {model.backend.name}"
    )
    print(f"PPL = {result['ppl']:.4f}")
    return 0


def cmd_serve(args) -> int:
    from phoenix_chat.app.server.serve import serve

    return serve(args, _load)


def cmd_devices(args) -> int:
    from phoenix_chat.engine.devices import list_devices

    entries = list_devices()
    if args.json:
        print(json.dumps([e.as_dict() for e in entries], indent=1, default=str))
        return 0
    for e in entries:
        idx = f"[{e.index}] " if e.index is not None else ""
        print(f"{e.kind:7s} {idx}{e.name}: {'available' if e.available else 'not available'} — {e.status}")
    return 0


def cmd_doctor(args) -> int:
    from phoenix_chat.engine import doctor

    rep = doctor.report(self_test=not args.no_self_test, root=args.root, seconds=args.seconds, model=args.model)
    text = json.dumps(rep, indent=1, default=str) + "\n" if args.json else doctor.markdown(rep)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(rep, indent=1, default=str) + "\n")
    return 0


def cmd_export(args) -> int:
    from phoenix_chat.app.store import export_all

    sys.stdout.write(export_all(args.format))
    return 0


def cmd_bench(args) -> int:
    if args.streams:
        from phoenix_chat.engine.bench_streams import run_streams_cli

        return run_streams_cli(args)
    from phoenix_chat.engine.bench import run_bench_cli

    return run_bench_cli(args)


def cmd_gui(args) -> int:
    from phoenix_chat.app.gui import display_available, run_gui

    if display_available():
        return run_gui(None)
    print(
        "phoenix-chat: no display found (set DISPLAY or run on a desktop); starting the terminal chat instead.",
        file=sys.stderr,
    )
    from phoenix_chat import engine
    from phoenix_chat.app.terminal_chat import terminal_chat
    from phoenix_chat.engine.sampling import SamplingParams

    return terminal_chat(engine.load(None), SamplingParams(), MAX_TOKENS)


COMMANDS = {
    "run": cmd_run,
    "chat": cmd_chat,
    "tokenize": cmd_tokenize,
    "info": cmd_info,
    "perplexity": cmd_perplexity,
    "serve": cmd_serve,
    "devices": cmd_devices,
    "doctor": cmd_doctor,
    "export": cmd_export,
    "bench": cmd_bench,
    None: cmd_gui,
}


def main(argv=None) -> int:
    from phoenix_chat.engine.errors import PhoenixError

    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return COMMANDS[args.command](args)
    except PhoenixError as exc:
        print(f"phoenix-chat: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
