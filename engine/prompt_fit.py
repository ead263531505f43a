"""Fitting a long chat into the context window, as LM Studio and Jan do.

When a conversation plus room for the answer no longer fits the model's context, the model
reads a shortened copy (the saved history is never changed):
- "drop_oldest" (a rolling window): the oldest messages are left out, the system prompt kept;
- "truncate_middle": the system prompt and the first message are kept, the ones after them
  left out.
Messages go in user/assistant pairs so the roles keep alternating (chat templates insist).
When what is left is still too long (one 40,000-character paste), the middle of its longest
message is cut out and replaced by a marker.

`fit_chat` also continues an answer: with `continue_final`, the last message is a partial
assistant answer the model goes on writing (no end-of-turn after it).

A chat with pictures (image parts) is fitted the same way, its prompt carrying the pictures'
spans (engine/vision/prompt.py; a text-only model refuses it with NoImageInput); a message
holding pictures is never cut, so messages are only left out for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from phoenix_chat.engine.generate import PromptIds
from phoenix_chat.engine.vision.spans import ImageSpan

if TYPE_CHECKING:
    from phoenix_chat.engine.loader import LoadedModel

OVERFLOW_POLICIES = ("drop_oldest", "truncate_middle")
CUT_MARK = "\n[…]\n"
MAX_CUT_ROUNDS = 6


@dataclass(frozen=True)
class FittedPrompt:
    prompt: PromptIds  # what the model reads
    total_tokens: int  # the whole conversation, before fitting
    dropped_messages: int = 0  # messages left out
    cut_tokens: int = 0  # tokens cut from the middle of a message
    cut_from: str = "middle"  # where they were cut: "middle" (of a message) or "start" (of a completion text)

    @property
    def changed(self) -> bool:
        return bool(self.dropped_messages or self.cut_tokens)


def answer_reserve(context_length: int, max_tokens: int) -> int:
    """Tokens kept free for the answer: max_tokens, but at most a quarter of the context."""
    return max(1, min(max_tokens, context_length // 4))


def encode_chat(model: LoadedModel, messages: Sequence[Mapping[str, Any]], continue_final: bool = False) -> list[int]:
    """The chat's prompt ids; with continue_final the last (assistant) message stays open."""
    if not continue_final:
        return model.chat.encode(messages, model.tokenizer)
    *before, last = messages
    partial = model.tokenizer.encode(str(last.get("content", "")), add_bos=False, parse_special=False)
    return model.chat.encode(before, model.tokenizer) + partial


def _encode(
    model: LoadedModel, messages: Sequence[Mapping[str, Any]], continue_final: bool
) -> tuple[list[int], tuple[ImageSpan, ...]]:
    """`encode_chat`'s ids, and the pictures' spans where the chat holds any."""
    from phoenix_chat.engine.vision.prompt import encode_chat as encode_with_images
    from phoenix_chat.engine.vision.prompt import has_images

    if not has_images(messages):
        return encode_chat(model, messages, continue_final), ()
    ids, spans = encode_with_images(model, messages[:-1] if continue_final else messages)
    if continue_final:
        ids += model.tokenizer.encode(str(messages[-1].get("content", "")), add_bos=False, parse_special=False)
    return ids, tuple(spans)


def fit_chat(
    model: LoadedModel,
    messages: Sequence[Mapping[str, Any]],
    policy: str = "drop_oldest",
    max_tokens: int = 256,
    continue_final: bool = False,
) -> FittedPrompt:
    """The prompt the model reads for `messages`: all of it when it fits the context with room
    for the answer (`answer_reserve`), else shortened by `policy` (see the module doc)."""
    if policy not in OVERFLOW_POLICIES:
        raise ValueError(f"policy must be one of {OVERFLOW_POLICIES}, got {policy!r}")
    ctx = model.backend.context_length
    limit = ctx - answer_reserve(ctx, max_tokens)
    msgs = [dict(m) for m in messages]
    ids, spans = _encode(model, msgs, continue_final)
    total = len(ids)
    if total <= limit:
        return FittedPrompt(PromptIds(tuple(ids), spans), total)

    system = msgs[:1] if msgs and msgs[0].get("role") == "system" else []
    rest = msgs[len(system) :]
    head = rest[:1] if policy == "truncate_middle" and len(rest) > 2 else []
    body = rest[len(head) :]
    protect = 2 if continue_final else 1  # the newest message (and the question of a continued answer)
    dropped = 0
    while len(ids) > limit and len(body) > protect:
        n = 2 if len(body) - protect >= 2 else 1
        body = body[n:]
        dropped += n
        ids, spans = _encode(model, system + head + body, continue_final)

    kept = system + head + body
    cut = 0
    for _ in range(MAX_CUT_ROUNDS):
        if len(ids) <= limit:
            break
        removed = _cut_middle_of_longest(model, kept, len(ids) - limit)
        if not removed:  # only pictures' messages are left: nothing to cut
            break
        cut += removed
        ids, spans = _encode(model, kept, continue_final)
    return FittedPrompt(PromptIds(tuple(ids), spans), total, dropped, cut)


def _cut_middle_of_longest(model: LoadedModel, messages: list[dict[str, Any]], excess: int) -> int:
    """Cut `excess` tokens (and a little slack) from the middle of the longest text message, in place
    (a message with pictures is not cut)."""
    tok = model.tokenizer
    lengths = [
        len(tok.encode(m["content"], add_bos=False, parse_special=False)) if isinstance(m.get("content"), str) else 0
        for m in messages
    ]
    i = max(range(len(messages)), key=lengths.__getitem__)
    if not lengths[i]:
        return 0
    content = tok.encode(str(messages[i].get("content", "")), add_bos=False, parse_special=False)
    remove = min(len(content), excess + len(tok.encode(CUT_MARK, add_bos=False)) + 8)
    keep = len(content) - remove
    head, tail = content[: keep // 2], content[len(content) - (keep - keep // 2) :] if keep else []
    messages[i]["content"] = tok.decode(head) + CUT_MARK + tok.decode(tail)
    return remove
