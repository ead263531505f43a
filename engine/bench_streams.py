"""Many-stream benchmark (`phoenix-chat bench --streams 1,2,4,...`): the scheduler under N
concurrent requests — aggregate and per-stream decode tok/s, p50/p99 inter-token latency — and
prefix reuse's time to first token, turn 1 vs turn N of a scripted chat.

Every request goes through `Scheduler.submit` (engine/scheduler.py), the path every client
takes, so the figures include chunked prefill, host sampling where the backend has no device
sampler, and the stream plumbing. Tokenizer-free (prompts are random ordinary ids, as in
engine/bench.py), so it also runs on synthetic GGUFs.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from phoenix_chat.engine.bench import bench_backend, bench_prompt
from phoenix_chat.engine.generate import PromptIds
from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from phoenix_chat.engine.config import ModelConfig
    from phoenix_chat.engine.loader import LoadedModel
    from phoenix_chat.engine.requests import RequestStream
    from phoenix_chat.engine.scheduler import Scheduler


@dataclass
class StreamsPoint:
    streams: int
    aggregate_tok_s: float  # answer tokens per second of all streams, while all of them decode
    per_stream_tok_s: float  # the mean stream's share of that
    itl_p50_ms: float  # gap between a stream's consecutive tokens
    itl_p99_ms: float
    max_batch: int  # the most sequences one decode step advanced (== streams when they batched)
    tokens: int  # answer tokens produced by all streams


@dataclass
class StreamsResult:
    model: str
    backend: str
    device: str
    slots: int
    prompt_tokens: int
    gen_tokens: int
    points: list[StreamsPoint] = field(default_factory=list)
    chat_turns: int = 0
    chat_ttft_ms: list[float] = field(default_factory=list)  # per turn, the scripted chat's
    chat_reused: list[int] = field(default_factory=list)  # prompt tokens reused per turn
    date: str = ""

    def table(self) -> str:
        lines = [
            f"{self.model} on {self.backend} ({self.device}), {self.slots} slots, "
            f"prompt {self.prompt_tokens} tok, {self.gen_tokens} tok per stream",
            f"{'streams':>7} {'aggregate tok/s':>16} {'per stream':>11} {'ITL p50 ms':>11} {'p99 ms':>8} {'batch':>6}",
        ]
        for p in self.points:
            lines.append(
                f"{p.streams:>7} {p.aggregate_tok_s:>16.1f} {p.per_stream_tok_s:>11.1f} "
                f"{p.itl_p50_ms:>11.1f} {p.itl_p99_ms:>8.1f} {p.max_batch:>6}"
            )
        if self.chat_ttft_ms:
            lines.append(
                f"chat TTFT: turn 1 {self.chat_ttft_ms[0]:.0f} ms, turn {self.chat_turns} "
                f"{self.chat_ttft_ms[-1]:.0f} ms ({self.chat_ttft_ms[-1] / self.chat_ttft_ms[0]:.2f}x), "
                f"reused {self.chat_reused[-1]} prompt tokens on the last turn"
            )
        return "\n".join(lines)


def _read(stream: RequestStream, times: list[tuple[float, int]]) -> None:
    """Collect (arrival time, tokens) per delta of one stream."""
    for d in stream:
        if d.token_ids:
            times.append((time.perf_counter(), len(d.token_ids)))


def measure_streams(
    scheduler: Scheduler, cfg: ModelConfig, n: int, prompt_tokens: int, gen_tokens: int
) -> StreamsPoint:
    """N requests at once, each read on its own thread; the rates over the span when all N decode."""
    scheduler.max_batch = 0
    times: list[list[tuple[float, int]]] = [[] for _ in range(n)]
    streams = [
        scheduler.submit(
            Request(
                PromptIds(tuple(bench_prompt(cfg, prompt_tokens, seed=i + 1))),
                SamplingParams(temperature=1.0, top_k=40, seed=i),
                max_tokens=gen_tokens,
            )
        )
        for i in range(n)
    ]
    readers = [threading.Thread(target=_read, args=(s, t)) for s, t in zip(streams, times)]
    for r in readers:
        r.start()
    for r in readers:
        r.join()
    live = [t for t in times if t]
    start = max(t[0][0] for t in live)  # every stream has its first token: all decode from here
    end = min(t[-1][0] for t in live)  # until the first one ends
    in_span = sum(k for t in live for (at, k) in t if start < at <= end)
    span = end - start
    aggregate = in_span / span if span > 0 else 0.0
    gaps: list[float] = []
    for t in live:
        for (a, _), (b, k) in zip(t, t[1:]):
            gaps.extend([(b - a) / k] * k)  # a delta holding k tokens: k gaps of a k-th each
    return StreamsPoint(
        streams=n,
        aggregate_tok_s=aggregate,
        per_stream_tok_s=aggregate / n,
        itl_p50_ms=float(np.percentile(gaps, 50)) * 1000 if gaps else 0.0,
        itl_p99_ms=float(np.percentile(gaps, 99)) * 1000 if gaps else 0.0,
        max_batch=scheduler.max_batch,
        tokens=sum(k for t in times for _, k in t),
    )


CHAT_MESSAGE_TOKENS = 64  # every turn of the scripted chat adds a message this long
CHAT_ANSWER_TOKENS = 8


def scripted_chat(scheduler: Scheduler, cfg: ModelConfig, turns: int) -> tuple[list[float], list[int]]:
    """A conversation of `turns` turns: the first prompt is <bos> and a 64-token message, each
    next one the previous prompt, its answer and a new 64-token message — so every turn computes
    about the same number of new tokens, and TTFT growth is what the history costs. TTFT (ms)
    and reused prompt tokens per turn."""
    answer_tokens = CHAT_ANSWER_TOKENS
    ids = bench_prompt(cfg, CHAT_MESSAGE_TOKENS + 1, seed=1000)
    ttft: list[float] = []
    reused: list[int] = []
    for turn in range(turns):
        greedy = SamplingParams(temperature=0.0)
        deltas = list(scheduler.submit(Request(PromptIds(tuple(ids)), greedy, max_tokens=answer_tokens)))
        usage = deltas[-1].usage
        if usage is None or usage.ttft_s is None:
            raise RuntimeError(f"the scripted chat's turn {turn + 1} ended without a token ({deltas[-1].error})")
        ttft.append(usage.ttft_s * 1000)
        reused.append(usage.prompt_reused)
        answer = [t for d in deltas for t in d.token_ids]
        ids = ids + answer + bench_prompt(cfg, CHAT_MESSAGE_TOKENS + 1, seed=2000 + turn)[1:]  # no second <bos>
    return ttft, reused


def run_streams_bench(
    model: LoadedModel,
    streams: list[int],
    prompt_tokens: int,
    gen_tokens: int,
    chat_turns: int = 10,
    backend_label: str = "",
) -> StreamsResult:
    """Each stream count in turn on one scheduler over `model` (loaded with slots >= max(streams)),
    then the scripted chat on a fresh one."""
    from phoenix_chat.engine.scheduler import Scheduler

    cfg = model.config
    result = StreamsResult(
        model=str(cfg.name),
        backend=backend_label or model.backend.name,
        device=model.backend.device_name,
        slots=model.backend.n_slots,
        prompt_tokens=prompt_tokens,
        gen_tokens=gen_tokens,
        chat_turns=chat_turns,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )
    s = Scheduler(model, max_queue=max(streams))
    try:
        measure_streams(s, cfg, 1, prompt_tokens, min(gen_tokens, 4))  # warm-up
        for n in streams:
            result.points.append(measure_streams(s, cfg, n, prompt_tokens, gen_tokens))
    finally:
        s.close()
    if chat_turns > 0:
        s = Scheduler(model)
        try:
            result.chat_ttft_ms, result.chat_reused = scripted_chat(s, cfg, chat_turns)
        finally:
            s.close()
    return result


def parse_streams(text: str) -> list[int]:
    """Parse '1,2,4,8' into [1, 2, 4, 8] (each at least 1)."""
    from phoenix_chat.engine.errors import PhoenixError

    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PhoenixError(f"--streams takes comma-separated counts such as 1,2,4,8, not {text!r}") from None
    if not counts or min(counts) < 1:
        raise PhoenixError(f"--streams takes counts of at least 1, not {text!r}")
    return counts


def run_streams_cli(args: argparse.Namespace) -> int:
    """`phoenix-chat bench --streams`: the model loaded with one slot per stream of the largest
    count, then `run_streams_bench`."""
    from phoenix_chat.engine.loader import load

    counts = parse_streams(args.streams)
    backend = bench_backend(args)
    turns = args.chat_turns
    # room for the longest request: one stream's prompt and answer, or the whole scripted chat
    chat = (turns + 1) * (CHAT_MESSAGE_TOKENS + CHAT_ANSWER_TOKENS)
    ctx = args.ctx or max(args.prompt_tokens + args.gen_tokens, chat) + 8
    model = load(
        args.model, backend=backend, context_length=ctx, quant=args.quant, device=args.device, slots=max(counts)
    )
    try:
        r = run_streams_bench(model, counts, args.prompt_tokens, args.gen_tokens, turns)
    finally:
        model.close()
    print(json.dumps(asdict(r), indent=1) if args.json else r.table())
    return 0
