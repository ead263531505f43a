"""Load test for an OpenAI-compatible server: N concurrent streaming chat clients for S seconds.

    python -m bench.server_load --url http://127.0.0.1:8377/v1 --clients 8 --seconds 20
    python -m bench.server_load --start-phoenix --backend cpu --ctx 1024 --clients 8 --seconds 20

Works against any such server (Phoenix's `serve`, llama.cpp's `llama-server` or
llama-cpp-python's, with --model set to the name it lists). Each client sends one streamed chat
request after another until the time is up (requests under way then are allowed to finish,
up to --timeout). Reports requests, refusals by status (a 429/503 is a deliberate refusal, not
a loss), other errors and hangs, p50/p99 time to first token, and aggregate completion tok/s
(completion tokens from the usage chunk over the wall time). --start-phoenix hosts Phoenix's
server in this process on the embedded model and also reports its memory before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

TOPICS = ["the sea", "a city at night", "bread", "mountains", "a library", "rain", "trains", "a garden"]


@dataclass
class LoadResult:
    url: str
    model: str
    clients: int
    seconds: float
    max_tokens: int
    requests_ok: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # status → count (429/503: deliberate)
    errors: int = 0  # anything else: a lost request
    hung: int = 0  # no answer within --timeout
    ttft_p50_ms: float = 0.0
    ttft_p99_ms: float = 0.0
    completion_tokens: int = 0
    wall_s: float = 0.0
    aggregate_tok_s: float = 0.0
    rss_before_mib: float | None = None
    rss_after_mib: float | None = None
    error_samples: list[str] = field(default_factory=list)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def run_load(
    url: str, model: str, clients: int, seconds: float, max_tokens: int, api_key: str = "local", timeout: float = 300
) -> LoadResult:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=timeout)
    result = LoadResult(url, model, clients, seconds, max_tokens)
    ttfts: list[float] = []
    refused: Counter[str] = Counter()
    deadline = time.monotonic() + seconds

    async def one(i: int, n: int) -> None:
        messages = [{"role": "user", "content": f"Write a few sentences about {TOPICS[(i + n) % len(TOPICS)]}."}]
        started = time.monotonic()
        first: float | None = None
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0.7,
            stream=True,
            stream_options={"include_usage": True},
        )
        tokens = 0
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic()
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        if first is not None:
            ttfts.append(first - started)
        result.completion_tokens += tokens
        result.requests_ok += 1

    async def client_loop(i: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            try:
                await asyncio.wait_for(one(i, n), timeout)
            except asyncio.TimeoutError:
                result.hung += 1
            except openai.APIStatusError as exc:
                if exc.status_code in (429, 503):
                    refused[str(exc.status_code)] += 1
                    await asyncio.sleep(float(exc.response.headers.get("retry-after", "1")))
                else:
                    result.errors += 1
                    result.error_samples.append(f"{exc.status_code}: {exc.message}"[:200])
            except Exception as exc:  # a lost request of any kind: counted, and the sample kept
                result.errors += 1
                result.error_samples.append(f"{type(exc).__name__}: {exc}"[:200])
            n += 1

    began = time.monotonic()
    await asyncio.gather(*(client_loop(i) for i in range(clients)))
    result.wall_s = time.monotonic() - began
    await client.close()
    result.refused = dict(refused)
    result.ttft_p50_ms = 1000 * _percentile(ttfts, 50)
    result.ttft_p99_ms = 1000 * _percentile(ttfts, 99)
    result.aggregate_tok_s = result.completion_tokens / result.wall_s if result.wall_s else 0.0
    result.error_samples = result.error_samples[:5]
    return result


def _rss_mib() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss / 2**20)


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--url", default=None, help="the server's OpenAI base URL (…/v1)")
    ap.add_argument("--model", default=None, help="model name to send (default: the first /v1/models lists)")
    ap.add_argument("--api-key", default="local")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=300, help="seconds after which a request counts as hung")
    ap.add_argument("--start-phoenix", action="store_true", help="host Phoenix's server here on the embedded model")
    ap.add_argument("--backend", default="cpu", help="with --start-phoenix")
    ap.add_argument("--ctx", type=int, default=1024, help="with --start-phoenix")
    ap.add_argument("--json", default=None, metavar="OUT", help="also write the result here")
    args = ap.parse_args(argv)

    running = scheduler = model = None
    rss_before = None
    if args.start_phoenix:
        from phoenix_chat import engine
        from phoenix_chat.app.server.config import ServerConfig
        from phoenix_chat.app.server.running import start_server
        from phoenix_chat.engine.scheduler import Scheduler

        model = engine.load(None, backend=args.backend, context_length=args.ctx)
        scheduler = Scheduler(model)
        running = start_server(scheduler, ServerConfig(port=0))
        args.url = running.url + "/v1"
        rss_before = _rss_mib()
    if not args.url:
        ap.error("give --url or --start-phoenix")
    try:
        if args.model is None:
            import openai

            args.model = openai.OpenAI(base_url=args.url, api_key=args.api_key).models.list().data[0].id
        result = asyncio.run(
            run_load(args.url, args.model, args.clients, args.seconds, args.max_tokens, args.api_key, args.timeout)
        )
        if running is not None:
            result.rss_before_mib, result.rss_after_mib = rss_before, _rss_mib()
    finally:
        if running is not None:
            running.stop()
        if scheduler is not None:
            scheduler.close()
        if model is not None:
            model.close()
    text = json.dumps(asdict(result), indent=1)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0 if result.errors == 0 and result.hung == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
