"""Answers through a remote OpenAI-compatible server, inside the worker (no Qt here).

The worker holds either a local model or a `RemoteEngine` (engine/remote/), never both: a
LOAD_REQUESTED with `remote={url, model, api_key}` drops the local model and connects here. An
answer then goes to the server's chat endpoint (chat mode: the conversation's messages, system
prompt included, pictures as OpenAI `image_url` parts with base64 `data:` URLs) or completion
endpoint (completion mode: the conversation as one text), and its deltas go through the same
`_AnswerPump` as a local answer, so Stop, regenerate, continue and the status bar's figures
(measured here, client-side) behave as they do locally.

The API key stays inside the `RemoteTarget` (kept out of its repr) and the engine's HTTP client;
nothing here prints, logs or sends it back to the GUI.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable
from typing import Any

from phoenix_chat.app.pictures import media_type


def connect(remote: dict) -> tuple[Any, dict]:
    """A RemoteEngine for {url, model, api_key, timeout_s} and the model info the GUI shows (and
    the engine's read timeout in it, so the GUI can check what it runs with); the server is
    asked which model it serves (its first one when `model` is None), so a wrong URL, key or model
    name fails here with the engine's one-line RemoteError, not at the first answer."""
    from phoenix_chat.engine.remote.engine import RemoteEngine, RemoteTarget

    target = RemoteTarget(url=str(remote["url"]), model=remote.get("model") or None, api_key=remote.get("api_key"))
    engine = RemoteEngine(target, timeout_s=float(remote["timeout_s"]))
    try:
        model = engine.resolved_model()
    except BaseException:
        engine.close()
        raise
    return engine, {**remote_info(target, model), "timeout_s": engine.timeout_s}


def remote_info(target: Any, model: str) -> dict:
    """MODEL_CHANGED's info for a remote engine: what answers and where, and nothing about local
    devices or quantization (the server's own are not known here)."""
    return {
        "remote": True,
        "name": model,
        "model": model,
        "host": target.host,
        "backend": "remote",
        "device": target.host,
        "insecure_warning": target.insecure_warning(),
        "context_length": None,  # the server's; an OpenAI server does not say
        "is_instruction_tuned": True,  # a chat endpoint applies the model's template
    }


def openai_messages(messages: list[dict]) -> list[dict]:
    """The chat as OpenAI's API takes it: each picture (an engine image part holding the file's
    bytes) as an `image_url` part with a base64 `data:` URL; text as it is. A part's
    `pan_and_scan` stays here: OpenAI's API has no such field (the remote server's own setting applies)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = [_openai_part(part) for part in content]
        out.append({**m, "content": content})
    return out


def _openai_part(part: dict) -> dict:
    if part.get("type") != "image":
        return part
    data = part["image"]
    url = f"data:{media_type(data)};base64,{base64.b64encode(data).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


def stream_answer(
    engine: Any,
    pump: Any,
    msg: dict,
    params: Any,
    max_tokens: int,
    cancel: threading.Event,
    notice: Callable[[str], None],
) -> tuple[str, str | None]:
    """Stream one answer from the server into `pump`; returns (finish reason, one-line error).

    A completion ends at its first blank line (the pump's ParagraphStop): the stream is then
    closed like a Stop, and the reason is "stop". Text that came before a failure is kept: the
    reason is "cut" then, with the error line."""
    from phoenix_chat.engine.completion import completion_text

    stopped = threading.Event()  # the completion's blank line came: close the HTTP stream

    def closing() -> bool:
        return cancel.is_set() or stopped.is_set()

    if msg.get("mode") == "completion":
        stream = engine.stream_completion(completion_text(msg["messages"]), params, max_tokens, cancel=closing)
    else:
        stream = engine.stream_chat(openai_messages(msg["messages"]), params, max_tokens, cancel=closing)
    reason: str | None = None
    error: str | None = None
    try:
        for delta in stream:
            if delta.notice:
                notice(delta.notice)
            if delta.usage is not None:
                pump.remote_usage = delta.usage
            if stopped.is_set():
                if delta.finish_reason is not None:
                    break  # the server saw the close; the blank line was the end
                continue
            if pump.feed(delta.text, delta.tokens, bool(delta.finish_reason)):
                reason = "stop"
                stopped.set()
                if delta.finish_reason is not None:
                    break
                continue
            if delta.finish_reason is not None:
                reason, error = delta.finish_reason, delta.error
                break
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    if reason is None:
        reason, error = "cut", "the server's stream ended without a finish reason"
    if reason == "error" and pump.text:
        reason = "cut"  # what came is kept and marked as cut
    return reason, error
