"""Many-stream benchmark (`phoenix-chat bench --streams 1,2,4,...`): the scheduler under N
concurrent requests — aggregate and per-stream decode tok/s, p50/p99 inter-token latency —,
one long prompt admitted beside running streams (`admit_tokens`: their token gaps before and
while it is prefilled in chunks, and its time to first token), and prefix reuse's time to first
token over a scripted chat's turns, one conversation or several taking turns
(`alternate_chats`: each must keep its own prefix in its own slot).

Every request goes through `Scheduler.submit` (engine/scheduler.py), the path every client
takes, so the figures include chunked prefill, host sampling where the backend has no device
sampler, and the stream plumbing. Tokenizer-free (prompts are random ordinary ids, as in
engine/bench.py), so it also runs on synthetic GGUFs.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from phoenix_chat.engine.backends.base import PREFILL_CHUNK
from phoenix_chat.engine.bench import bench_backend, bench_prompt
from phoenix_chat.engine.errors import PhoenixError
from phoenix_chat.engine.generate import PromptIds
from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from phoenix_chat.engine.config import ModelConfig
    from phoenix_chat.engine.loader import LoadedModel
    from phoenix_chat.engine.quantization import WeightQuant
    from phoenix_chat.engine.requests import RequestStream, Usage
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
    # the scheduler's decode steps inside that span (Scheduler.steps): how many, their mean rows,
    # wall time and the part in the backend's call; step - backend is the scheduler's host work
    window_steps: int = 0
    rows_per_step: float = 0.0
    step_ms: float = 0.0
    backend_ms: float = 0.0
    # batched steps recorded while these streams ran (a Vulkan backend's batch_recordings; None on
    # backends that record nothing): each one stalls every stream for the recording's host time
    batch_recordings: int | None = None
    # tokens each GPU sampler drew meanwhile (argmax, topk, full; None without a device sampler)
    gpu_sampled: dict[str, int] | None = None


@dataclass
class AdmissionPoint:
    """One long prompt submitted while `streams` others decode: the others' token gaps before it
    and during its admission (its submit to its first token), and its time to first token."""

    streams: int  # requests decoding when it was submitted
    admit_tokens: int  # its prompt
    chunks: int  # prefill chunks of PREFILL_CHUNK tokens its prompt takes, one per scheduler step
    ttft_ms: float
    reused: int  # prompt tokens a slot already held (0 on a fresh scheduler)
    running_tokens: int  # answer tokens the running streams received between its submit and first token
    still_running: int  # running streams with a gap inside the admission window (eos ends one early)
    before_p50_ms: float  # the running streams' inter-token gaps while all decode, before the submit
    before_p99_ms: float
    before_max_ms: float
    during_p50_ms: float  # gaps that overlap the admission window
    during_p99_ms: float
    during_max_ms: float  # the worst step latency a running stream saw meanwhile


@dataclass
class ChatTurns:
    """One scripted conversation, per turn: time to first token, prompt tokens, reused prompt tokens."""

    ttft_ms: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    reused: list[int] = field(default_factory=list)


@dataclass
class StreamsResult:
    model: str
    backend: str
    device: str
    slots: int
    context: int
    prompt_tokens: int
    gen_tokens: int
    points: list[StreamsPoint] = field(default_factory=list)
    admission: AdmissionPoint | None = None
    chat_turns: int = 0
    chats: list[ChatTurns] = field(default_factory=list)  # one, or the conversations that took turns
    # forwards the chats recorded for their prefills (a Vulkan backend's prefill_recordings; None
    # on backends that record nothing)
    chat_recordings: int | None = None
    mixed_sampling: bool = False  # every other stream greedy, the rest top-k (--mixed-sampling)
    date: str = ""

    def table(self) -> str:
        sampling = "every other stream greedy, the rest top-k" if self.mixed_sampling else "top-k"
        lines = [
            f"{self.model} on {self.backend} ({self.device}), {self.slots} slots, context {self.context}, "
            f"prompt {self.prompt_tokens} tok, {self.gen_tokens} tok per stream, {sampling}",
            f"{'streams':>7} {'aggregate tok/s':>16} {'per stream':>11} {'ITL p50 ms':>11} {'p99 ms':>8} {'batch':>6}"
            f" {'steps':>6} {'rows/step':>9} {'step ms':>8} {'backend ms':>10} {'recorded':>8}",
        ]
        for p in self.points:
            recorded = "-" if p.batch_recordings is None else str(p.batch_recordings)
            lines.append(
                f"{p.streams:>7} {p.aggregate_tok_s:>16.1f} {p.per_stream_tok_s:>11.1f} "
                f"{p.itl_p50_ms:>11.1f} {p.itl_p99_ms:>8.1f} {p.max_batch:>6}"
                f" {p.window_steps:>6} {p.rows_per_step:>9.1f} {p.step_ms:>8.1f} {p.backend_ms:>10.1f} {recorded:>8}"
            )
        a = self.admission
        if a is not None:
            lines += [
                f"admit a {a.admit_tokens}-token prompt ({a.chunks} chunks) beside {a.streams} decoding streams: "
                f"TTFT {a.ttft_ms:.0f} ms; the streams got {a.running_tokens} tokens meanwhile "
                f"({a.still_running} still running)",
                f"{'ITL ms':>16} {'p50':>8} {'p99':>8} {'max':>8}",
                f"{'before':>16} {a.before_p50_ms:>8.1f} {a.before_p99_ms:>8.1f} {a.before_max_ms:>8.1f}",
                f"{'during admission':>16} {a.during_p50_ms:>8.1f} {a.during_p99_ms:>8.1f} {a.during_max_ms:>8.1f}",
            ]
        for i, c in enumerate(self.chats):
            name = f"chat {chr(ord('A') + i)}" if len(self.chats) > 1 else "chat"
            turns = " ".join(f"{p}/{r}" for p, r in zip(c.prompt_tokens, c.reused))
            lines.append(
                f"{name} TTFT: turn 1 {c.ttft_ms[0]:.0f} ms, turn {len(c.ttft_ms)} {c.ttft_ms[-1]:.0f} ms "
                f"({c.ttft_ms[-1] / c.ttft_ms[0]:.2f}x); prompt/reused tokens per turn: {turns}"
            )
        if self.chat_recordings is not None and self.chats:
            lines.append(f"prefill forwards recorded during the chats: {self.chat_recordings}")
        return "\n".join(lines)


def _read(
    stream: RequestStream, times: list[tuple[float, int]], ready: threading.Event | None = None, after: int = 0
) -> Usage | None:
    """Collect (arrival time, tokens) per delta of one stream; set `ready` once `after` tokens
    came (or the stream ended). The last delta's usage."""
    got = 0
    usage = None
    for d in stream:
        if d.token_ids:
            times.append((time.perf_counter(), len(d.token_ids)))
            got += len(d.token_ids)
        if ready is not None and got >= after:
            ready.set()
        usage = d.usage
    if ready is not None:
        ready.set()
    return usage


def _gaps(times: list[tuple[float, int]], start: float = float("-inf"), end: float = float("inf")) -> list[float]:
    """Seconds between consecutive tokens, for gaps (a, b] that overlap (start, end]; a delta
    holding k tokens counts as k gaps of a k-th each."""
    gaps: list[float] = []
    for (a, _), (b, k) in zip(times, times[1:]):
        if a < end and b > start:
            gaps.extend([(b - a) / k] * k)
    return gaps


def _ms(gaps: list[float], q: float) -> float:
    return float(np.percentile(gaps, q)) * 1000 if gaps else 0.0


def stream_sampling(i: int, mixed: bool) -> SamplingParams:
    """Stream i's sampling: top-k 40 (seeded: the same every run), or with `mixed` greedy for
    the even streams, as a server's clients that ask temperature 0 beside sampled ones."""
    if mixed and i % 2 == 0:
        return SamplingParams(temperature=0.0)
    return SamplingParams(temperature=1.0, top_k=40, seed=i)


def _submit_streams(
    scheduler: Scheduler, cfg: ModelConfig, n: int, prompt_tokens: int, budget: int, mixed: bool = False
) -> list[RequestStream]:
    """N requests of `prompt_tokens`-token prompts, sampled as `stream_sampling` says."""
    return [
        scheduler.submit(
            Request(
                PromptIds(tuple(bench_prompt(cfg, prompt_tokens, seed=i + 1))),
                stream_sampling(i, mixed),
                max_tokens=budget,
            )
        )
        for i in range(n)
    ]


def measure_streams(
    scheduler: Scheduler, cfg: ModelConfig, n: int, prompt_tokens: int, gen_tokens: int, mixed: bool = False
) -> StreamsPoint:
    """N requests at once, each read on its own thread; the rates over the span when all N decode."""
    scheduler.max_batch = 0
    times: list[list[tuple[float, int]]] = [[] for _ in range(n)]
    before = scheduler.model.backend.stats()
    streams = _submit_streams(scheduler, cfg, n, prompt_tokens, gen_tokens, mixed)
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
    gaps = [g for t in live for g in _gaps(t)]
    inside = [st for st in scheduler.steps if start < st.ended <= end]
    k = max(1, len(inside))
    return StreamsPoint(
        streams=n,
        aggregate_tok_s=aggregate,
        per_stream_tok_s=aggregate / n,
        itl_p50_ms=_ms(gaps, 50),
        itl_p99_ms=_ms(gaps, 99),
        max_batch=scheduler.max_batch,
        tokens=sum(k for t in times for _, k in t),
        window_steps=len(inside),
        rows_per_step=sum(st.rows for st in inside) / k,
        step_ms=1e3 * sum(st.seconds for st in inside) / k,
        backend_ms=1e3 * sum(st.backend_s for st in inside) / k,
        **_backend_counts(before, scheduler.model.backend.stats()),
    )


def _backend_counts(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """StreamsPoint's batch_recordings and gpu_sampled: what the backend's counters moved by."""
    out: dict[str, Any] = {}
    if "batch_recordings" in before:
        out["batch_recordings"] = after["batch_recordings"] - before["batch_recordings"]
    if "gpu_sampled" in before:
        out["gpu_sampled"] = {k: n - before["gpu_sampled"][k] for k, n in after["gpu_sampled"].items()}
    return out


ADMIT_ANSWER_TOKENS = 2  # the admitted request's answer: only its first token is measured


def admission_budget(admit_tokens: int, gen_tokens: int) -> int:
    """Answer tokens of each running stream in the admission run: `gen_tokens` before the
    submit, one per step while the prompt's chunks are prefilled, and as many again after."""
    return 2 * max(gen_tokens, 2) + -(-admit_tokens // PREFILL_CHUNK) + 2


def measure_admission(
    scheduler: Scheduler, cfg: ModelConfig, streams: int, admit_tokens: int, prompt_tokens: int, gen_tokens: int
) -> AdmissionPoint:
    """`streams` requests decode; once each has `gen_tokens` tokens, one more request with an
    `admit_tokens`-token prompt is submitted. The scheduler prefills it a chunk per step between
    the running streams' decode steps, so they keep receiving tokens until its first one: their
    gaps before the submit vs those overlapping (submit, first token], and its TTFT.
    Needs a scheduler with `streams` + 1 slots."""
    before = max(gen_tokens, 2)
    times: list[list[tuple[float, int]]] = [[] for _ in range(streams)]
    ready = [threading.Event() for _ in range(streams)]
    running = _submit_streams(scheduler, cfg, streams, prompt_tokens, admission_budget(admit_tokens, gen_tokens))
    readers = [threading.Thread(target=_read, args=(s, t, e, before)) for s, t, e in zip(running, times, ready)]
    for r in readers:
        r.start()
    for e in ready:
        e.wait()
    submitted = time.perf_counter()
    admitted = scheduler.submit(
        Request(
            PromptIds(tuple(bench_prompt(cfg, admit_tokens, seed=10_000))),
            SamplingParams(temperature=0.0),
            max_tokens=ADMIT_ANSWER_TOKENS,
        )
    )
    usage = _read(admitted, [])
    for r in readers:
        r.join()
    if usage is None or usage.ttft_s is None:
        raise RuntimeError("the admitted request ended without a token")
    first = submitted + usage.ttft_s  # the scheduler's queued_at is a few µs after `submitted`
    live = [t for t in times if t]
    start = max(t[0][0] for t in live)  # all decode from here
    before_gaps = [g for t in live for g in _gaps([x for x in t if start <= x[0] <= submitted])]
    during = [_gaps(t, submitted, first) for t in live]
    during_gaps = [g for d in during for g in d]
    return AdmissionPoint(
        streams=streams,
        admit_tokens=admit_tokens,
        chunks=-(-(admit_tokens - usage.prompt_reused) // PREFILL_CHUNK),
        ttft_ms=usage.ttft_s * 1000,
        reused=usage.prompt_reused,
        running_tokens=sum(k for t in times for at, k in t if submitted < at <= first),
        still_running=sum(1 for d in during if d),
        before_p50_ms=_ms(before_gaps, 50),
        before_p99_ms=_ms(before_gaps, 99),
        before_max_ms=max(before_gaps, default=0.0) * 1000,
        during_p50_ms=_ms(during_gaps, 50),
        during_p99_ms=_ms(during_gaps, 99),
        during_max_ms=max(during_gaps, default=0.0) * 1000,
    )


# every turn of the scripted chat adds a message this long (cycled): lengths vary as real turns'
# do (a prefill of a length not seen before records its forward), around 64 tokens, so turn 1 and
# turn 10 compute about the same number of new tokens
CHAT_MESSAGE_TOKENS = (64, 57, 71, 50, 78, 61, 67, 53, 75, 63)
CHAT_ANSWER_TOKENS = 8


class _Conversation:
    """A scripted conversation: the first prompt is <bos> and a 64-token message, each next one
    the previous prompt, its answer and a new message of 50-78 tokens (CHAT_MESSAGE_TOKENS) — so
    every turn computes about the same number of new tokens, and TTFT growth is what the history
    costs. Conversation `index` has messages of its own (index 0: the single scripted chat's)."""

    def __init__(self, cfg: ModelConfig, index: int) -> None:
        self.cfg, self.index = cfg, index
        self.ids = bench_prompt(cfg, CHAT_MESSAGE_TOKENS[0] + 1, seed=1000 + index)
        self.turns = ChatTurns()

    def turn(self, scheduler: Scheduler) -> None:
        """Send the prompt, record its figures, extend it with the answer and the next message."""
        n = len(self.turns.ttft_ms)
        greedy = SamplingParams(temperature=0.0)
        request = Request(PromptIds(tuple(self.ids)), greedy, max_tokens=CHAT_ANSWER_TOKENS)
        deltas = list(scheduler.submit(request))
        usage = deltas[-1].usage
        if usage is None or usage.ttft_s is None:
            raise RuntimeError(f"the scripted chat's turn {n + 1} ended without a token ({deltas[-1].error})")
        self.turns.ttft_ms.append(usage.ttft_s * 1000)
        self.turns.prompt_tokens.append(usage.prompt_tokens)
        self.turns.reused.append(usage.prompt_reused)
        answer = [t for d in deltas for t in d.token_ids]
        length = CHAT_MESSAGE_TOKENS[(n + 1) % len(CHAT_MESSAGE_TOKENS)]
        message = bench_prompt(self.cfg, length + 1, seed=2000 + 1000 * self.index + n)
        self.ids = self.ids + answer + message[1:]  # no second <bos>


def scripted_chats(scheduler: Scheduler, cfg: ModelConfig, chats: int, turns: int) -> list[ChatTurns]:
    """`chats` conversations of `turns` turns taking turns (A1, B1, A2, B2, ...), one request at
    a time: with a slot per conversation, each turn should reuse its own conversation's whole
    history, whatever the others wrote in between."""
    conversations = [_Conversation(cfg, i) for i in range(chats)]
    for _ in range(turns):
        for c in conversations:
            c.turn(scheduler)
    return [c.turns for c in conversations]


def streams_context(prompt_tokens: int, gen_tokens: int, chat_turns: int, admit_tokens: int = 0) -> int:
    """The context every run needs: one stream's prompt and answer, the whole scripted chat,
    and with an admission the long prompt and the running streams' longer answers."""
    need = [prompt_tokens + gen_tokens, (chat_turns + 1) * (max(CHAT_MESSAGE_TOKENS) + CHAT_ANSWER_TOKENS)]
    if admit_tokens:
        need += [admit_tokens + ADMIT_ANSWER_TOKENS, prompt_tokens + admission_budget(admit_tokens, gen_tokens)]
    return max(need) + 8


def streams_slots(streams: list[int], admit_tokens: int = 0, alternate_chats: int = 1) -> int:
    """Slots to load: one per stream of the largest count, one more for an admitted prompt,
    one per alternating conversation."""
    return max(max(streams) + (1 if admit_tokens else 0), alternate_chats)


def run_streams_bench(
    model: LoadedModel,
    streams: list[int],
    prompt_tokens: int,
    gen_tokens: int,
    chat_turns: int = 10,
    backend_label: str = "",
    admit_tokens: int = 0,
    alternate_chats: int = 1,
    mixed_sampling: bool = False,
) -> StreamsResult:
    """Each stream count in turn on one scheduler over `model` (loaded with `streams_slots` and
    `streams_context`; `mixed_sampling`: every other stream greedy); then, with `admit_tokens`, the
    admission beside the largest count; then the scripted chat (`alternate_chats` conversations
    taking turns), each on a fresh scheduler."""
    from phoenix_chat.engine.scheduler import Scheduler

    cfg, backend = model.config, model.backend
    need_ctx = streams_context(prompt_tokens, gen_tokens, chat_turns, admit_tokens)
    if backend.context_length < need_ctx:
        raise PhoenixError(
            f"the many-stream bench needs a context of {need_ctx} tokens"
            + (f" (a {admit_tokens}-token prompt admitted)" if admit_tokens else "")
            + f", the model is loaded with {backend.context_length} (its maximum: {cfg.context_length})"
        )
    need_slots = streams_slots(streams, admit_tokens, alternate_chats)
    if backend.n_slots < need_slots:
        raise PhoenixError(
            f"the many-stream bench needs {need_slots} slots, the model is loaded with {backend.n_slots}"
        )
    result = StreamsResult(
        model=str(cfg.name),
        backend=backend_label or backend.name,
        device=backend.device_name,
        slots=backend.n_slots,
        context=backend.context_length,
        prompt_tokens=prompt_tokens,
        gen_tokens=gen_tokens,
        chat_turns=chat_turns,
        mixed_sampling=mixed_sampling,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )
    s = Scheduler(model, max_queue=max(streams))
    try:
        measure_streams(s, cfg, 1, prompt_tokens, min(gen_tokens, 4))  # warm-up
        if admit_tokens:  # the admission's chunk recordings too (Vulkan records each shape once)
            measure_streams(s, cfg, 1, min(admit_tokens, 2 * PREFILL_CHUNK), 1)
        for n in streams:
            result.points.append(measure_streams(s, cfg, n, prompt_tokens, gen_tokens, mixed_sampling))
    finally:
        s.close()
    if admit_tokens:
        s = Scheduler(model)
        try:
            result.admission = measure_admission(s, cfg, max(streams), admit_tokens, prompt_tokens, gen_tokens)
        finally:
            s.close()
    if chat_turns > 0:
        before = backend.stats().get("prefill_recordings")
        s = Scheduler(model)
        try:
            result.chats = scripted_chats(s, cfg, alternate_chats, chat_turns)
        finally:
            s.close()
        if before is not None:
            result.chat_recordings = backend.stats()["prefill_recordings"] - before
    return result


def parse_streams(text: str) -> list[int]:
    """Parse '1,2,4,8' into [1, 2, 4, 8] (each at least 1)."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PhoenixError(f"--streams takes comma-separated counts such as 1,2,4,8, not {text!r}") from None
    if not counts or min(counts) < 1:
        raise PhoenixError(f"--streams takes counts of at least 1, not {text!r}")
    return counts


def add_streams_arguments(p: argparse.ArgumentParser) -> None:
    """The many-stream bench's options beyond --streams and --chat-turns (bench/run.py; a CLI
    without them runs neither)."""
    p.add_argument(
        "--admit-tokens",
        type=int,
        default=0,
        metavar="N",
        help="with --streams: while the largest count decodes, admit one more request with an N-token "
        "prompt; the running streams' token gaps before and during its chunked prefill, and its TTFT",
    )
    p.add_argument(
        "--alternate-chats",
        type=int,
        default=1,
        metavar="N",
        help="with --streams: N scripted chats take turns (A1, B1, A2, ...), each in a slot of its own; "
        "per chat the TTFT of turn 1 and the last, prompt and reused tokens per turn",
    )
    p.add_argument(
        "--mixed-sampling",
        action="store_true",
        help="with --streams: every other stream greedy, the rest top-k (a server's mixed clients), "
        "with the batched steps recorded while each count ran",
    )


def load_for_streams(
    path: str | os.PathLike[str] | None,
    backend: str,
    streams: list[int],
    prompt_tokens: int,
    gen_tokens: int,
    chat_turns: int,
    admit_tokens: int = 0,
    alternate_chats: int = 1,
    ctx: int | None = None,
    quant: WeightQuant | str | None = None,
    device: int | None = None,
) -> LoadedModel:
    """The model loaded for `run_streams_bench`: `streams_slots` slots and `streams_context`
    tokens (or `ctx`, refused at once when shorter than that)."""
    from phoenix_chat.engine.loader import load

    if admit_tokens < 0 or alternate_chats < 1 or chat_turns < 0:
        raise PhoenixError("--admit-tokens and --chat-turns take 0 or more, --alternate-chats 1 or more")
    need = streams_context(prompt_tokens, gen_tokens, chat_turns, admit_tokens)
    if ctx is not None and ctx < need:
        raise PhoenixError(
            f"--ctx {ctx} is too short for this many-stream bench: it needs {need} tokens"
            + (f" (--admit-tokens {admit_tokens})" if admit_tokens else "")
        )
    slots = streams_slots(streams, admit_tokens, alternate_chats)
    return load(path, backend=backend, context_length=ctx or need, quant=quant, device=device, slots=slots)


def run_streams_cli(args: argparse.Namespace) -> int:
    """`phoenix-chat bench --streams`: the model loaded by `load_for_streams`, then
    `run_streams_bench`; --admit-tokens, --alternate-chats and --mixed-sampling where the parser has them."""
    counts = parse_streams(args.streams)
    admit = getattr(args, "admit_tokens", 0)
    chats = getattr(args, "alternate_chats", 1)
    model = load_for_streams(
        args.model,
        bench_backend(args),
        counts,
        args.prompt_tokens,
        args.gen_tokens,
        args.chat_turns,
        admit,
        chats,
        ctx=args.ctx,
        quant=args.quant,
        device=args.device,
    )
    mixed = getattr(args, "mixed_sampling", False)
    try:
        r = run_streams_bench(
            model, counts, args.prompt_tokens, args.gen_tokens, args.chat_turns, "", admit, chats, mixed
        )
    finally:
        model.close()
    print(json.dumps(asdict(r), indent=1) if args.json else r.table())
    return 0
