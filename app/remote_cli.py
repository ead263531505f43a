"""`run --remote URL` / `chat --remote URL`: the answer comes from an OpenAI-compatible server
(engine/remote/) instead of this computer's engine.

The API key is read only from an environment variable (`--api-key-env VAR`, default
PHOENIX_CHAT_API_KEY): a key given as a flag would sit in the shell history and in `ps` for
every user of the machine. Plain http:// to another machine warns once on stderr. A fault is one
line on stderr and exit 2 (the text that came before it stays on stdout); Ctrl+C closes the
HTTP stream (the server stops generating) and exits 130.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from contextlib import closing
from typing import TYPE_CHECKING

from phoenix_chat.engine.errors import PhoenixError

if TYPE_CHECKING:  # the openai client loads only when --remote is used (`phoenix-chat` starts faster)
    from phoenix_chat.engine.remote.engine import RemoteDelta, RemoteEngine

DEFAULT_KEY_ENV = "PHOENIX_CHAT_API_KEY"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# flags that pick or shape this computer's engine: meaningless with --remote, refused rather than ignored
LOCAL_ONLY = ("model", "device", "ctx", "quant", "draft", "mmproj")


def add_remote_args(p) -> None:
    g = p.add_argument_group("remote server (instead of this computer's engine)")
    g.add_argument(
        "--remote",
        metavar="URL",
        default=None,
        help="an OpenAI-compatible server: vLLM, llama.cpp's server, Ollama, LM Studio, another `phoenix-chat serve` "
        "(http://HOST:PORT or https://…; /v1 is added when missing)",
    )
    g.add_argument(
        "--api-key-env",
        metavar="VAR",
        default=None,
        help=f"the environment variable holding the server's API key (default {DEFAULT_KEY_ENV}; "
        "the key is never taken as a flag)",
    )
    g.add_argument(
        "--remote-model", metavar="NAME", default=None, help="the server's model id (default: the first it lists)"
    )
    g.add_argument(
        "--remote-timeout",
        metavar="S",
        type=_timeout,
        default=None,
        help="seconds to wait for the server's next words, the first ones included (default 60; "
        "raise it for a server that reads long prompts slowly)",
    )
    # refused on purpose (and so not an abbreviation of --api-key-env, which would take the key as a name)
    g.add_argument("--api-key", dest="api_key_flag", default=None, help=argparse.SUPPRESS)


REMOTE_ONLY = ("remote_model", "remote_timeout", "api_key_env")  # meaningless without --remote


def refuse_remote_flags_without_remote(args) -> None:
    """PhoenixError for --remote-model / --remote-timeout / --api-key-env given without --remote:
    this computer's engine would answer, and the flag be silently ignored."""
    given = [f"--{name.replace('_', '-')}" for name in REMOTE_ONLY if getattr(args, name, None) is not None]
    if given and not args.remote:
        raise PhoenixError(f"{', '.join(given)}: for a remote server, give its URL with --remote")


def remote_engine(args) -> RemoteEngine:
    """The engine the flags describe; PhoenixError for flags that contradict --remote."""
    from phoenix_chat.engine.remote.engine import RemoteEngine, RemoteTarget

    if args.api_key_flag is not None:
        raise PhoenixError(
            f"--api-key: the key is not taken as a flag (it would stay in the shell's history and show in `ps`); "
            f"put it in an environment variable: {DEFAULT_KEY_ENV}=… or --api-key-env VAR"
        )
    given = [f"--{name}" for name in LOCAL_ONLY if getattr(args, name, None)]
    if getattr(args, "backend", "auto") != "auto":
        given.append("--backend")
    if getattr(args, "image", None):
        given.append("--image")
    if given:
        raise PhoenixError(f"{', '.join(given)}: for this computer's engine, not with --remote")
    target = RemoteTarget(args.remote, model=args.remote_model, api_key=_api_key(args.api_key_env))
    warning = target.insecure_warning()
    if warning:
        print(f"phoenix-chat: {warning}", file=sys.stderr)
    timeout = args.remote_timeout
    return RemoteEngine(target) if timeout is None else RemoteEngine(target, timeout_s=timeout)


def _timeout(text: str) -> float:
    """--remote-timeout's seconds, within READ_TIMEOUT_RANGE_S (argparse says which flag erred)."""
    from phoenix_chat.engine.remote.target import READ_TIMEOUT_RANGE_S

    low, high = READ_TIMEOUT_RANGE_S
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text} s: takes {low:g} to {high:g} seconds")
    return value


def _api_key(named: str | None) -> str | None:
    """The key from the environment: a variable named by --api-key-env must be set."""
    if named is not None and not ENV_NAME.fullmatch(named):  # a key given where its name goes: never echoed
        raise PhoenixError("--api-key-env takes the name of an environment variable (like MY_KEY), not the key")
    key = os.environ.get(named or DEFAULT_KEY_ENV) or None
    if named and key is None:
        raise PhoenixError(f"--api-key-env {named}: the environment variable {named} is not set")
    return key


def run_remote(args, params) -> int:
    """`run --remote`: stream one answer to stdout, its figures to stderr."""
    engine = remote_engine(args)
    try:
        if args.raw:
            stream = engine.stream_completion(args.prompt, params, args.max_tokens)
        else:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            stream = engine.stream_chat([*messages, {"role": "user", "content": args.prompt}], params, args.max_tokens)
        _, final = print_stream(stream, sys.stdout, notices=sys.stderr)
        model = engine.resolved_model() if final.finish_reason != "error" else engine.target.model
    finally:
        engine.close()
    sys.stdout.write("\n")
    if final.finish_reason != "error":
        print(figures(engine.target.host, model, final), file=sys.stderr)
    if final.finish_reason in ("error", "cut"):
        raise PhoenixError(final.error or "the answer failed")
    return 0


def print_stream(stream, out, notices) -> tuple[str, RemoteDelta]:
    """Write the text as it comes (notices on their own lines to `notices`); (the text, the
    final delta). The stream is closed however this ends (Ctrl+C included): the server stops."""
    parts = []
    with closing(stream):
        for delta in stream:
            if delta.notice:
                print(f"phoenix-chat: {delta.notice}", file=notices, flush=True)
            if delta.text:
                parts.append(delta.text)
                out.write(delta.text)
                out.flush()
            if delta.finish_reason is not None:
                return "".join(parts), delta
    raise PhoenixError("the answer ended without a final delta")  # the engine always sends one


def figures(host: str, model: str | None, final: RemoteDelta) -> str:
    """The local path's figures line, measured on this side: the server's prefill cannot be told
    from its queue here, so no prompt tok/s."""
    u = final.usage
    if u is None:
        return f"[remote {host} {model}: finish: {final.finish_reason}]"
    ttft = "-" if u.ttft_s is None else f"{u.ttft_s * 1000:.0f}"
    return (
        f"[remote {host} {model}: prompt {u.prompt_tokens} tok, generated {u.completion_tokens} tok at "
        f"{u.generation_tps:.1f} tok/s, ttft {ttft} ms, finish: {final.finish_reason}]"
    )
