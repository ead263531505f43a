"""Completion mode: a conversation as one text that a base model continues.

Why: a base model (not instruction-tuned, like the embedded Gemma 3 270M) was never taught the
chat template; through it, "The capital of France is" comes back as template-shaped nonsense,
while as plain text (`phoenix-chat run --raw`) the model continues it sensibly. So the app's
completion mode hands the model the conversation as one text: the system prompt, then each
message; an answer continues the text before it directly, and a new message starts a new
paragraph. The answer ends at the first blank line (`ParagraphStop`), at the end-of-text
token, or at the length limit.

Unlike `run --raw`, special-token strings in the text stay text: "<end_of_turn>" typed by a
user is never a control token in the app.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from phoenix_chat.engine.generate import PromptIds
from phoenix_chat.engine.prompt_fit import CUT_MARK, OVERFLOW_POLICIES, FittedPrompt, answer_reserve
from phoenix_chat.engine.stop_strings import StopMatcher

if TYPE_CHECKING:
    from phoenix_chat.engine.loader import LoadedModel

PARAGRAPH = "\n\n"  # a blank line: where a completion ends


def completion_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The conversation as one text: answers run on from what precedes them, anything else
    (system prompt, a user's message) starts a new paragraph."""
    text = ""
    for m in messages:
        content = str(m.get("content", ""))
        if not content:
            continue
        if text and m.get("role") != "assistant":
            text = text.rstrip() + PARAGRAPH
        text += content
    return text


def fit_completion(
    model: LoadedModel, messages: Sequence[Mapping[str, Any]], policy: str = "drop_oldest", max_tokens: int = 256
) -> FittedPrompt:
    """The prompt ids of `messages` in completion mode, fitted to the context with room for the
    answer: "drop_oldest" keeps the end of the text, "truncate_middle" its start and end."""
    if policy not in OVERFLOW_POLICIES:
        raise ValueError(f"policy must be one of {OVERFLOW_POLICIES}, got {policy!r}")
    tok = model.tokenizer
    ids = tok.encode(completion_text(messages), add_bos=True, parse_special=False)
    ctx = model.backend.context_length
    limit = ctx - answer_reserve(ctx, max_tokens)
    total = len(ids)
    if total <= limit:
        return FittedPrompt(PromptIds(tuple(ids)), total)
    head = ids[:1] if tok.bos_id is not None and ids[:1] == [tok.bos_id] else []
    body = ids[len(head) :]
    keep = limit - len(head)
    if policy == "truncate_middle":
        mark = tok.encode(CUT_MARK, add_bos=False, parse_special=False)
        keep -= len(mark)
        first = keep // 2
        kept = body[:first] + mark + body[len(body) - (keep - first) :]
        where = "middle"
    else:
        kept = body[len(body) - keep :]
        where = "start"
    return FittedPrompt(PromptIds(tuple(head + kept)), total, cut_tokens=len(body) - keep, cut_from=where)


class ParagraphStop:
    """Ends a completion at its first blank line. Blank lines before any text do not count
    (a continuation may well begin a new line), and a "\\n\\n" split over several deltas is
    held back until it is known (engine/stop_strings.py)."""

    def __init__(self) -> None:
        self._matcher = StopMatcher([PARAGRAPH])
        self._started = False

    @property
    def stopped(self) -> bool:
        return self._matcher.stopped

    def feed(self, text: str) -> str:
        """The part of `text` that belongs to the answer (empty once the blank line came)."""
        if self._started:
            return self._matcher.feed(text)
        body = text.lstrip()
        if not body:
            return text
        self._started = True
        return text[: len(text) - len(body)] + self._matcher.feed(body)

    def flush(self) -> str:
        return self._matcher.flush()
