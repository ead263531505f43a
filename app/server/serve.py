"""`phoenix-chat serve`: check the settings, load the model, host the server until Ctrl-C or
SIGTERM. Settings are checked before the model loads, so an unsafe bind fails at once."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from phoenix_chat.engine.errors import PhoenixError

from .config import ServerConfig
from .running import bind_socket, start_server


def config_from_args(args: Any) -> ServerConfig:
    return ServerConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        cors_origins=tuple(args.cors_origin),
        allowed_hosts=tuple(args.allow_host),
    )


def slots_kwargs(parallel: int) -> dict[str, int]:
    """`slots=` for engine.load: --parallel N requests share the engine's decode steps (each in
    its own KV slot; engine/scheduler.py)."""
    if parallel < 1:
        raise PhoenixError("--parallel must be 1 or more")
    return {"slots": parallel}


def queue_kwargs(max_queue: int | None) -> dict[str, int]:
    """`max_queue=` for the Scheduler: --max-queue N requests may wait for a slot, the next gets
    429 with Retry-After (left out: the scheduler's default)."""
    if max_queue is None:
        return {}
    if max_queue < 0:
        raise PhoenixError("--max-queue must be 0 or more")
    return {"max_queue": max_queue}


def serve(args: Any, load_fn: Callable[..., Any]) -> int:
    from phoenix_chat.engine.scheduler import Scheduler

    config = config_from_args(args)
    config.check()
    queue = queue_kwargs(args.max_queue)
    if config.port:
        bind_socket(config.host, config.port).close()  # a port in use fails now, not after the load
    model = load_fn(args, **slots_kwargs(args.parallel))
    scheduler = Scheduler(model, **queue)
    try:
        running = start_server(scheduler, config, access_log=bool(args.verbose))
    except BaseException:
        scheduler.close()
        raise
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(
        f"phoenix-chat: serving {running.state.model_id} ({model.backend.name}, context "
        f"{model.backend.context_length}) at {running.url}/v1 — Ctrl-C stops",
        file=sys.stderr,
        flush=True,
    )
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        running.stop()
        scheduler.close()
        model.close()
    print("phoenix-chat: server stopped", file=sys.stderr, flush=True)
    return 0
