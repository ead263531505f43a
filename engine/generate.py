"""The layered generation API (mlx-lm style).

`generate_step` yields token ids; `stream_generate` turns them into response records with text
deltas and timings; `generate` collects the whole answer. The CLI, the GUI worker and the
benchmarks all consume `stream_generate`.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from phoenix_chat.engine.errors import CancelledError, ContextFull, PhoenixError
from phoenix_chat.engine.sampling import Sampler, SamplingParams

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.base import CancelCheck
    from phoenix_chat.engine.loader import LoadedModel
    from phoenix_chat.engine.prompt_cache import PromptCache
    from phoenix_chat.engine.speculative import SpeculativeStats
    from phoenix_chat.engine.vision.spans import ImageSpan


@dataclass(frozen=True)
class PromptIds:
    """A prompt already encoded (engine/prompt_fit.py fits a chat to the context this way);
    `images`: its pictures' spans where it holds any (`encode_prompt` of a chat with pictures,
    done once off the caller's event loop, as the local server does)."""

    ids: tuple[int, ...]
    images: tuple[ImageSpan, ...] = field(default=(), compare=False)


# a chat (messages as {"role": ..., "content": ...}), one user message / raw text, or ids
Prompt: TypeAlias = str | Sequence[Mapping[str, Any]] | PromptIds


@dataclass
class GenerationResponse:
    text: str  # the new text since the previous record
    token: int | None  # the token id behind it (None on the final record)
    prompt_tokens: int
    generation_tokens: int
    prompt_tps: float  # prompt tokens computed (not reused) per second of ttft; 0.0 before the first token
    generation_tps: float
    ttft_s: float | None  # time to first token, prompt processing included; None before the first
    finish_reason: str | None  # None while running; "stop" | "length" | "context" | "cancelled"
    prompt_reused: int = 0  # prompt tokens whose K/V came from the cache (stream_generate's `cache`)


def generate_step(
    model: LoadedModel,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    max_tokens: int,
    reuse: int = 0,
    cancel: CancelCheck | None = None,
    images: Sequence[ImageSpan] = (),
) -> Generator[int, None, None]:
    """Prefill `prompt_ids` then yield sampled ids until max_tokens or the context is full.

    reuse: the K/V of the first `reuse` ids is already in the backend's cache at positions
    0..reuse-1 (engine/prompt_cache.py decides when that is exact): the prefill starts there.
    Sampling happens on the device where the backend keeps the token step there: every token
    (`generate_tokens`, Vulkan), or all but the first (`decode_tokens`, a hybrid whose prefill
    leaves logits on the host); on the CPU from logits otherwise. The caller stops early by
    closing us; `cancel` interrupts the prefill between chunks (CancelledError).
    images: the pictures' spans in `prompt_ids` (engine/vision/prompt.py); the prefill then runs
    through `backend.forward_images` (none may start before `reuse`) and the decode as usual.
    """
    backend = model.backend
    limit = backend.context_length
    if len(prompt_ids) >= limit:
        raise ContextFull(f"prompt of {len(prompt_ids)} tokens does not fit a context of {limit}")
    if not 0 <= reuse < len(prompt_ids):
        raise ValueError(f"reuse must leave at least one of the {len(prompt_ids)} prompt ids to run, not {reuse}")
    pos = len(prompt_ids)
    budget = min(max_tokens, limit - pos)
    pending = [s for s in images if s.end > reuse]
    if any(s.start < reuse for s in pending):
        raise ValueError(f"reuse {reuse} cuts a picture's span")
    if pending:
        logits = backend.forward_images(prompt_ids[reuse:], reuse, pending, cancel=cancel)
    else:
        on_device = backend.generate_tokens(prompt_ids[reuse:], reuse, params, budget, cancel=cancel)
        if on_device is not None:  # the prefill ends in the device's sampler: every token drawn there
            yield from on_device
            return
        logits = backend.forward(prompt_ids[reuse:], reuse, cancel=cancel)
    sampler = Sampler(params)
    history = list(prompt_ids)
    token = sampler(logits, history)
    device_stream = backend.decode_tokens(token, pos, params, budget - 1) if budget > 1 else None
    yield token
    if device_stream is not None:
        yield from device_stream
        return
    for _ in range(budget - 1):
        history.append(token)
        logits = backend.forward([token], pos)
        pos += 1
        token = sampler(logits, history)
        yield token


def prompt_ids_for(model: LoadedModel, prompt: Prompt, raw: bool = False) -> list[int]:
    """Token ids for a chat (list of messages) or a single user message / raw text (a chat
    with pictures: the ids with the image layout; `encode_prompt` also gives the soft tokens)."""
    return encode_prompt(model, prompt, raw)[0]


def encode_prompt(model: LoadedModel, prompt: Prompt, raw: bool = False) -> tuple[list[int], list[ImageSpan]]:
    """Token ids and the pictures' spans (a text-only model refuses pictures: NoImageInput)."""
    from phoenix_chat.engine.vision.prompt import encode_chat, has_images

    if not isinstance(prompt, (str, PromptIds)) and has_images(prompt):
        return encode_chat(model, prompt)
    if isinstance(prompt, PromptIds) and prompt.images:
        from phoenix_chat.engine.vision.prompt import require_image_input

        require_image_input(model)
        return list(prompt.ids), list(prompt.images)
    if isinstance(prompt, PromptIds) and model.vision is not None and model.vision.cfg.image_token_id in prompt.ids:
        # ids alone have lost their pictures: running them would read the placeholders as text
        raise PhoenixError("a prompt with image placeholders needs its pictures: pass the chat messages")
    return _text_prompt_ids(model, prompt, raw), []


def _text_prompt_ids(model: LoadedModel, prompt: Prompt, raw: bool) -> list[int]:
    if isinstance(prompt, PromptIds):
        return list(prompt.ids)
    if isinstance(prompt, str):
        if raw:
            return model.tokenizer.encode(prompt, add_bos=True, parse_special=True)
        prompt = [{"role": "user", "content": prompt}]
    return model.chat.encode(prompt, model.tokenizer)


def stream_generate(
    model: LoadedModel,
    prompt: Prompt,
    params: SamplingParams | None = None,
    max_tokens: int = 256,
    raw: bool = False,
    draft: LoadedModel | None = None,
    draft_tokens: int = 4,
    spec_stats: SpeculativeStats | None = None,
    cancel: CancelCheck | None = None,
    cache: PromptCache | None = None,
) -> Iterator[GenerationResponse]:
    """Stream response records for `prompt` (a chat as a list of messages, or a string).

    draft: a second LoadedModel with the same tokenizer for speculative decoding
    (engine/speculative.py); spec_stats, a SpeculativeStats it fills in. cancel: asked
    between prefill chunks and between tokens; when it says stop, the last record has
    finish_reason "cancelled".
    cache: the model's PromptCache (engine/prompt_cache.py): only the prompt after what the KV
    cache already holds is prefilled (a chat's next turn, regenerate, edit-and-resend)."""
    from phoenix_chat.engine.tokenizer import StreamingDetokenizer

    params = params or SamplingParams()
    ids, images = encode_prompt(model, prompt, raw)
    stops = set(model.config.eos_token_ids)
    detok = StreamingDetokenizer(model.tokenizer)
    start = time.perf_counter()
    first_at: float | None = None
    count = 0
    n_prompt = len(ids)
    reused = 0

    def record(text: str, token: int | None, reason: str | None) -> GenerationResponse:
        now = time.perf_counter()
        # No token yet (the prompt did not fit, or Stop came during prefill): nothing was
        # measured, so no TTFT and no prompt speed rather than a near-zero time's nonsense.
        ttft = None if first_at is None else first_at - start
        decode_time = now - (first_at or now)
        return GenerationResponse(
            text=text,
            token=token,
            prompt_tokens=n_prompt,
            generation_tokens=count,
            prompt_tps=(n_prompt - reused) / ttft if ttft else 0.0,
            generation_tps=(count - 1) / decode_time if count > 1 and decode_time > 0 else 0.0,
            ttft_s=ttft,
            finish_reason=reason,
            prompt_reused=reused,
        )

    if n_prompt >= model.backend.context_length:
        yield record("", None, "context")
        return
    if draft is not None:
        from phoenix_chat.engine.speculative import speculative_step

        if cache is not None:
            raise ValueError("prefix reuse (cache) does not combine with a draft model (its cache is not tracked)")
        if images:
            raise PhoenixError("speculative decoding (--draft) does not take pictures yet")
        steps = speculative_step(model, draft, ids, params, max_tokens, draft_tokens, spec_stats, cancel)
    elif cache is not None:
        plan = cache.plan(ids, images)
        reused = plan.reused
        steps = cache.generate(model, ids, params, max_tokens, plan, cancel=cancel, images=images)
    else:
        steps = generate_step(model, ids, params, max_tokens, cancel=cancel, images=images)
    reason = "length"
    try:
        for token in steps:
            if first_at is None:
                first_at = time.perf_counter()
            if token in stops:
                reason = "stop"
                break
            if cancel is not None and cancel():
                reason = "cancelled"
                break
            count += 1
            text = detok.add(token)
            if text:
                yield record(text, token, None)
        else:
            if n_prompt + count >= model.backend.context_length:
                reason = "context"
    except CancelledError:
        reason = "cancelled"
    finally:
        steps.close()
    yield record(detok.flush(), None, reason)


def generate(
    model: LoadedModel, prompt: Prompt, params: SamplingParams | None = None, max_tokens: int = 256, raw: bool = False
) -> str:
    return "".join(r.text for r in stream_generate(model, prompt, params, max_tokens, raw))
