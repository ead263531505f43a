"""What the terminal chat asks a RemoteEngine: `record_chats(engine, monkeypatch)` keeps, for each
stream_chat call, the messages sent (a copy) and the text that came back."""

from __future__ import annotations

import copy
import io

from phoenix_chat.app.terminal_chat import remote_terminal_chat


def record_chats(engine, monkeypatch) -> list[dict]:
    sent: list[dict] = []
    real = engine.stream_chat

    def stream_chat(messages, params, max_tokens, **kw):
        record = {"messages": copy.deepcopy(messages), "text": ""}
        sent.append(record)
        for d in real(messages, params, max_tokens, **kw):  # a generator: print_stream's close() reaches it
            record["text"] += d.text
            yield d

    monkeypatch.setattr(engine, "stream_chat", stream_chat)
    return sent


def retry_chat(engine, params, max_tokens: int, monkeypatch, question: str, follow_up: str) -> tuple[list[dict], str]:
    """`question`, /retry, `follow_up` through remote_terminal_chat: (the three requests, the output).
    Asserts what /retry must do: the retry sends the first request's messages again, and the
    next turn's history holds the retried answer in place of the first."""
    sent = record_chats(engine, monkeypatch)
    out = io.StringIO()
    script = io.StringIO(f"{question}\n/retry\n{follow_up}\n")
    assert remote_terminal_chat(engine, params, max_tokens, stdin=script, stdout=out) == 0
    first, retried, third = sent
    asked = [{"role": "user", "content": question}]
    assert first["messages"] == retried["messages"] == asked
    assert retried["text"].strip()
    assert third["messages"] == [
        *asked,
        {"role": "assistant", "content": retried["text"]},
        {"role": "user", "content": follow_up},
    ]
    assert f"> {first['text']}\n> {retried['text']}\n> {third['text']}\n" in out.getvalue()
    return sent, out.getvalue()
