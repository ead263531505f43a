"""Load test for OpenAI-compatible servers: N concurrent streaming chat clients for D seconds,
the same client load against Phoenix's `phoenix-chat serve` and llama.cpp's server on the same
GGUF, one after the other in one run.

    python -m bench.server_load --clients 64 --seconds 60 --parallel 8
    python -m bench.server_load --servers phoenix --clients 8 --seconds 20
    python -m bench.server_load --url http://127.0.0.1:8377/v1 --clients 8 --seconds 20

Each client (the real `openai` async client, no retries) sends one streamed chat request after
another until D is up; requests under way then may finish, up to --deadline after they were sent
(past it: hung). The prompts, max_tokens and greedy sampling are the same for every server.
Counted per request: a complete answer (a finish_reason arrived), a deliberate refusal (429 or
503 with Retry-After; the client waits that long), any other error by kind (status, connection,
a stream cut short), or hung. Reported: p50/p99 time to first token, aggregate tok/s (completion
tokens over the wall time: the usage chunk where the server sends one, else streamed chunks),
and the server's RSS (psutil on its pid) after a warm-up request, after the load and after a
second identical load: memory is flat when the two after-load figures are within --rss-margin.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field

TOPICS = ["the sea", "a city at night", "bread", "mountains", "a library", "rain", "trains", "a garden"]


def prompt_for(n: int) -> list[dict[str, str]]:
    """The n-th prompt a client sends (clients start at different topics)."""
    return [{"role": "user", "content": f"Write a few sentences about {TOPICS[n % len(TOPICS)]}."}]


@dataclass
class LoadResult:
    server: str
    clients: int
    seconds: float
    max_tokens: int
    sent: int = 0
    ok: int = 0  # 200 and a finish_reason
    refused: dict[str, int] = field(default_factory=dict)  # "429"/"503" with Retry-After: deliberate
    errors: dict[str, int] = field(default_factory=dict)  # kind → count: lost requests
    hung: int = 0  # no end within the deadline
    finish_reasons: dict[str, int] = field(default_factory=dict)
    ttft_p50_s: float = 0.0
    ttft_p99_s: float = 0.0
    completion_tokens: int = 0
    tokens_from: str = "usage"  # "usage": the server's usage chunk; "chunks": streamed content chunks
    wall_s: float = 0.0
    tok_s: float = 0.0
    load_avg: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at the start and at the end
    distinct_answers: dict[str, int] = field(default_factory=dict)  # topic → different complete answers
    answers: dict[str, str] = field(default_factory=dict)  # topic → one complete answer
    error_samples: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return sum(self.errors.values()) + self.hung


def _percentile(values: list[float], q: int) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def run_load(
    url: str,
    model: str,
    clients: int,
    seconds: float,
    max_tokens: int,
    api_key: str = "local",
    deadline: float = 300.0,
    server: str = "",
) -> LoadResult:
    """`clients` loops of streamed greedy chat requests for `seconds`; every request accounted for."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=deadline + 30)
    result = LoadResult(server or url, clients, seconds, max_tokens)
    ttfts: list[float] = []
    refused: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    texts: dict[str, Counter[str]] = defaultdict(Counter)
    used_chunks = False
    stop_at = time.monotonic() + seconds

    def lose(kind: str, sample: str) -> None:
        errors[kind] += 1
        if len(result.error_samples) < 5:
            result.error_samples.append(f"{kind}: {sample}"[:200])

    async def one(n: int) -> None:
        nonlocal used_chunks
        started = time.monotonic()
        first: float | None = None
        usage_tokens: int | None = None
        chunks = 0
        parts: list[str] = []
        reason: str | None = None
        stream = await client.chat.completions.create(
            model=model,
            messages=prompt_for(n),  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
        )
        try:
            async for chunk in stream:
                if chunk.choices:
                    choice = chunk.choices[0]
                    if choice.delta.content:
                        first = first or time.monotonic()
                        chunks += 1
                        parts.append(choice.delta.content)
                    reason = choice.finish_reason or reason
                if chunk.usage is not None:
                    usage_tokens = chunk.usage.completion_tokens
        finally:  # a request given up on (deadline) hangs up, so the server can cancel it
            await stream.close()
        if reason is None:
            lose("stream ended without a finish_reason", f"after {chunks} chunks")
            return
        result.ok += 1
        reasons[reason] += 1
        texts[TOPICS[n % len(TOPICS)]]["".join(parts)] += 1
        if first is not None:
            ttfts.append(first - started)
        if usage_tokens is None:
            used_chunks = True
        result.completion_tokens += usage_tokens if usage_tokens is not None else chunks

    async def client_loop(i: int) -> None:
        n = i
        while time.monotonic() < stop_at:
            result.sent += 1
            try:
                await asyncio.wait_for(one(n), deadline)
            except asyncio.TimeoutError:
                result.hung += 1
            except openai.APIStatusError as exc:
                retry_after = exc.response.headers.get("retry-after")
                if exc.status_code in (429, 503) and retry_after is not None:
                    refused[str(exc.status_code)] += 1
                    await asyncio.sleep(float(retry_after))
                else:
                    lose(f"status {exc.status_code}", exc.message)
            except openai.APIError as exc:  # an error event inside a 200 stream, a dropped connection
                lose(type(exc).__name__, str(exc))
            except Exception as exc:  # any other way a request can fail: counted, never swallowed
                lose(type(exc).__name__, str(exc))
            n += clients

    load_start = os.getloadavg()[0]
    began = time.monotonic()
    await asyncio.gather(*(client_loop(i) for i in range(clients)))
    result.wall_s = time.monotonic() - began
    result.load_avg = (load_start, os.getloadavg()[0])
    await client.close()
    result.refused, result.errors, result.finish_reasons = dict(refused), dict(errors), dict(reasons)
    result.ttft_p50_s, result.ttft_p99_s = _percentile(ttfts, 50), _percentile(ttfts, 99)
    result.tokens_from = "chunks" if used_chunks else "usage"
    result.tok_s = result.completion_tokens / result.wall_s if result.wall_s else 0.0
    result.distinct_answers = {topic: len(seen) for topic, seen in texts.items()}
    result.answers = {topic: seen.most_common(1)[0][0] for topic, seen in texts.items()}
    return result


@dataclass
class ServerRun:
    """One server under the load twice, and its memory around the loads."""

    name: str
    settings: str
    loads: list[LoadResult]
    rss_mib: list[float]  # after a warm-up request, after each load
    rss_margin_mib: float

    @property
    def flat(self) -> bool:
        return abs(self.rss_mib[-1] - self.rss_mib[-2]) <= self.rss_margin_mib


def _rss_mib(pid: int) -> float:
    import psutil

    return float(psutil.Process(pid).memory_info().rss / 2**20)


def measure(served, args) -> ServerRun:
    """Warm up with one request, then the load `args.loads` times, reading RSS between."""
    import openai

    warm = openai.OpenAI(base_url=served.url, api_key=args.api_key, max_retries=0, timeout=args.deadline)
    warm.chat.completions.create(model=served.model, messages=prompt_for(0), max_tokens=args.max_tokens)  # type: ignore[arg-type]
    rss = [_rss_mib(served.pid)]
    loads = []
    for _ in range(args.loads):
        loads.append(
            asyncio.run(
                run_load(
                    served.url,
                    served.model,
                    args.clients,
                    args.seconds,
                    args.max_tokens,
                    args.api_key,
                    args.deadline,
                    served.name,
                )
            )
        )
        rss.append(_rss_mib(served.pid))
    return ServerRun(served.name, served.settings, loads, rss, args.rss_margin)


def table(runs: list[ServerRun]) -> str:
    """The Markdown table docs/PERFORMANCE.md carries."""
    head = (
        "| server | load | sent | ok | refused 429/503 | other errors | hung | TTFT p50 / p99 | aggregate tok/s "
        "| RSS after | load avg (start → end) |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for run in runs:
        for i, r in enumerate(run.loads):
            refused = f"{r.refused.get('429', 0)} / {r.refused.get('503', 0)}"
            other = sum(r.errors.values())
            other_s = f"{other} ({', '.join(f'{k}: {v}' for k, v in r.errors.items())})" if other else "0"
            tok = f"{r.tok_s:.2f}" + (" (chunks)" if r.tokens_from == "chunks" else "")
            before = f"{run.rss_mib[i]:.0f} → " if i == 0 else ""
            rows.append(
                f"| {run.name} | {i + 1} | {r.sent} | {r.ok} | {refused} | {other_s} | {r.hung} "
                f"| {r.ttft_p50_s:.2f} s / {r.ttft_p99_s:.2f} s | {tok} | {before}{run.rss_mib[i + 1]:.0f} MiB "
                f"| {r.load_avg[0]:.1f} → {r.load_avg[1]:.1f} |"
            )
    notes = []
    for run in runs:
        delta = run.rss_mib[-1] - run.rss_mib[-2]
        verdict = "flat" if run.flat else "NOT flat"
        notes.append(
            f"- {run.name} ({run.settings}): memory {verdict} — after load {len(run.loads)} "
            f"{delta:+.0f} MiB against after load {len(run.loads) - 1} (margin ±{run.rss_margin_mib:.0f} MiB)"
        )
    if len(runs) == 2 and runs[1].loads[0].tok_s:
        a, b = runs[0].loads[0], runs[1].loads[0]
        notes.append(
            f"- {runs[0].name} / {runs[1].name}, load 1: {a.tok_s / b.tok_s:.2f}× the aggregate tok/s, "
            f"TTFT p50 {a.ttft_p50_s:.2f} s vs {b.ttft_p50_s:.2f} s"
        )
    return "\n".join(rows + [""] + notes)


def _servers(args) -> Iterator[Callable[[], AbstractContextManager]]:
    from bench import served
    from phoenix_chat.engine.weights import embedded_model_path

    gguf = args.model_path or embedded_model_path()
    for name in args.servers.split(","):
        if name == "phoenix":
            yield lambda: served.phoenix(args.backend, args.ctx, args.parallel, args.max_queue, gguf)
        elif name == "llama.cpp":
            yield lambda: served.llama_cpp(gguf, args.ctx, args.threads)
        else:
            raise SystemExit(f"unknown server {name!r}: phoenix, llama.cpp")


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--servers", default="phoenix,llama.cpp", help="which to start, in order (phoenix, llama.cpp)")
    ap.add_argument("--url", default=None, help="instead: a server already running (its OpenAI base URL, …/v1)")
    ap.add_argument("--model", default=None, help="with --url: the model name to send (default: the first listed)")
    ap.add_argument("--model-path", default=None, help="the GGUF both servers load (default: the embedded 270M)")
    ap.add_argument("--api-key", default="local")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--deadline", type=float, default=300, help="seconds after which a request counts as hung")
    ap.add_argument("--loads", type=int, default=2, help="loads per server (the last two decide 'flat')")
    ap.add_argument("--rss-margin", type=float, default=32, metavar="MIB", help="what still counts as flat")
    ap.add_argument("--backend", default="cpu", help="phoenix's --backend")
    ap.add_argument("--parallel", type=int, default=8, help="phoenix's --parallel (requests batched at once)")
    ap.add_argument("--max-queue", type=int, default=None, help="phoenix's --max-queue (default: its own)")
    ap.add_argument("--ctx", type=int, default=1024, help="context per request, both servers")
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp's threads (default: every core)")
    ap.add_argument("--json", default=None, metavar="OUT", help="also write the results here")
    args = ap.parse_args(argv)
    if args.loads < 1:
        ap.error("--loads must be at least 1")

    runs: list[ServerRun] = []
    if args.url:
        import openai

        model = args.model or openai.OpenAI(base_url=args.url, api_key=args.api_key).models.list().data[0].id
        result = asyncio.run(
            run_load(args.url, model, args.clients, args.seconds, args.max_tokens, args.api_key, args.deadline)
        )
        print(json.dumps(asdict(result), indent=1))
        return 0 if result.lost == 0 else 1
    print(f"{args.clients} clients × {args.seconds:g} s, max_tokens {args.max_tokens}, greedy", file=sys.stderr)
    for start in _servers(args):
        with start() as server:
            print(f"{server.name}: {server.settings} (pid {server.pid})", file=sys.stderr, flush=True)
            runs.append(measure(server, args))
    out = table(runs)
    print(out)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([asdict(r) | {"flat": r.flat} for r in runs], fh, indent=1)
            fh.write("\n")
    return 0 if all(r.flat and all(x.lost == 0 for x in r.loads) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
