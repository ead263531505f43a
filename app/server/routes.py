"""The endpoints: /health, /v1/models, /v1/chat/completions, /v1/completions.

Generation goes through the engine's one request API: tokenize (off the event loop), submit to
the scheduler with this loop, read the `RequestStream` with `async for`. A client that goes away
cancels its request (`RequestStream.cancel()`), streamed or not, waiting or running.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from phoenix_chat.engine.backends.base import NoImageBackend
from phoenix_chat.engine.chat import ChatTemplateError
from phoenix_chat.engine.quantization import quant_name
from phoenix_chat.engine.requests import EngineBusy, PromptTooLong, RequestStream
from phoenix_chat.engine.vision.images import ImageError
from phoenix_chat.engine.vision.prompt import NoImageInput

from .api_errors import APIError, bad_request
from .parsing import Generation, parse_chat, parse_completion, parse_json_object
from .responses import Shape
from .state import ServerState


def _state(request: HTTPRequest) -> ServerState:
    state: ServerState = request.app.state.phoenix
    return state


async def health(request: HTTPRequest) -> Response:
    s = _state(request)
    sched = s.scheduler
    backend = sched.model.backend
    return JSONResponse(
        {
            "status": "ok",
            "model": s.model_id,
            "backend": backend.name,
            "device": backend.device_name,  # what --device picked, as the backend names it
            "quant": quant_name(backend.quant),  # the re-quantization applied at load (--quant), or "file"
            "weight_types": backend.weight_types(),  # tensors per type as loaded: --quant's effect
            "context_length": s.context_length,
            "slots": int(getattr(backend, "n_slots", 1)),
            "active": sched.active,
            "waiting": sched.waiting,
            "max_queue": sched.max_queue,  # waiting past this is refused with 429
            "max_batch": sched.max_batch,  # the most requests one decode step has advanced
            **s.counters.as_dict(),
        }
    )


async def models(request: HTTPRequest) -> Response:
    s = _state(request)
    entry = {
        "id": s.model_id,
        "object": "model",
        "created": 0,
        "owned_by": "phoenix-chat",
        "context_length": s.context_length,
    }
    return JSONResponse({"object": "list", "data": [entry]})


async def chat_completions(request: HTTPRequest) -> Response:
    return await _generate(request, parse_chat(parse_json_object(await request.body())))


async def completions(request: HTTPRequest) -> Response:
    return await _generate(request, parse_completion(parse_json_object(await request.body())))


async def _generate(request: HTTPRequest, gen: Generation) -> Response:
    s = _state(request)
    if gen.model is not None and gen.model != s.model_id:
        raise APIError(
            404,
            f"the model {gen.model!r} does not exist here (this server has {s.model_id!r})",
            param="model",
            code="model_not_found",
        )
    try:  # pictures are decoded and encoded here too (soft tokens cached per picture)
        ids, images = await run_in_threadpool(s.scheduler.encode, gen.prompt, gen.kind == "text")
    except ChatTemplateError as exc:
        raise bad_request(str(exc), param="messages") from None
    except (NoImageInput, NoImageBackend) as exc:
        raise bad_request(str(exc), param="messages", code="image_input_unsupported") from None
    except ImageError as exc:  # the picture's one line: not an image, truncated, a decompression bomb
        raise bad_request(str(exc), param="messages", code="invalid_image") from None
    if len(ids) >= s.context_length:
        raise _too_long(PromptTooLong(len(ids), s.context_length))
    engine_request = gen.to_request(ids, s.context_length, images)
    try:
        stream = s.scheduler.submit(engine_request, loop=asyncio.get_running_loop())
    except EngineBusy as exc:
        s.counters.add("busy")
        raise APIError(
            429, str(exc), type="server_busy", code="server_busy", headers={"Retry-After": str(s.config.retry_after_s)}
        ) from None
    except PromptTooLong as exc:
        raise _too_long(exc) from None
    s.counters.add("requests")
    shape = Shape(gen.kind, stream.id, s.model_id)
    if gen.stream:
        return EventSourceResponse(_sse(s, stream, shape, gen.include_usage), sep="\n", ping=15)
    return await _whole(request, s, stream, shape)


def _too_long(exc: PromptTooLong) -> APIError:
    return bad_request(
        f"This model's maximum context length is {exc.context_length} tokens; the prompt has "
        f"{exc.prompt_tokens} (prompt and answer share the context).",
        param="messages",
        code="context_length_exceeded",
    )


async def _whole(request: HTTPRequest, s: ServerState, stream: RequestStream, shape: Shape) -> Response:
    """Collect the answer; cancel it if the client hangs up while it waits."""
    watcher = asyncio.ensure_future(_cancel_on_disconnect(request, s, stream))
    try:
        parts = [d.text async for d in stream]
    finally:
        watcher.cancel()
    final = stream.final
    failure = _failure(final.finish_reason, final.error) if final else _failure("cancelled", None)
    if failure is not None:
        raise failure
    assert final is not None
    return JSONResponse(shape.whole("".join(parts), final.finish_reason, final.usage))


async def _cancel_on_disconnect(request: HTTPRequest, s: ServerState, stream: RequestStream) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            stream.cancel()
            s.counters.add("cancelled_on_disconnect")
            return


def _failure(reason: str | None, error: str | None) -> APIError | None:
    """The error object for an answer that did not end normally; None when it did."""
    if reason == "error":
        return APIError(500, f"the engine failed: {error}", type="server_error", code="engine_error")
    if reason == "cancelled":
        return APIError(
            503, "the request was cancelled (the server is stopping)", type="server_error", code="cancelled"
        )
    return None


async def _sse(
    s: ServerState, stream: RequestStream, shape: Shape, include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    """The SSE events: text chunks, the finish chunk, the usage chunk if asked, `[DONE]`. A
    client that disconnects cancels this generator (sse-starlette), which cancels the request."""
    finished = False
    first = True
    try:
        async for delta in stream:
            if delta.finish_reason is None:
                if delta.text:
                    yield _event(shape.chunk(delta.text, first=first, with_usage=include_usage))
                    first = False
                continue
            finished = True
            failure = _failure(delta.finish_reason, delta.error)
            if failure is not None:  # the status line is sent already: an error event ends the stream
                yield _event(failure.body())
                return
            text = delta.text or None
            if text is not None:
                yield _event(shape.chunk(text, first=first, with_usage=include_usage))
                first = False
            yield _event(shape.chunk(None, delta.finish_reason, first=first, with_usage=include_usage))
            if include_usage:
                yield _event(shape.usage_chunk(delta.usage))
            yield {"data": "[DONE]"}
    finally:
        if not finished:
            stream.cancel()
            s.counters.add("cancelled_on_disconnect")


def _event(obj: dict[str, Any]) -> dict[str, Any]:
    return {"data": json.dumps(obj, ensure_ascii=False)}
