"""A chat in the terminal: history kept for the session, answers streamed as they come — from
this computer's engine or from a remote server (`chat --remote`). `/retry` asks the same history
again and replaces the last answer with the new one; `/reset` starts over."""

from __future__ import annotations

import sys
from collections.abc import Callable

from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.scheduler import Scheduler

HELP = (
    "Type a message and press Enter. Commands: /retry (a new answer to your last message), "
    "/reset (new conversation), /quit."
)

# one turn: (history, stdout) → (the answer's text, a note to print after it or None)
Answer = Callable[[list[dict], object], tuple[str, str | None]]


def terminal_chat(model, params, max_tokens: int, system: str | None = None, stdin=None, stdout=None) -> int:
    """Through the engine's one API (engine/scheduler.py): its slot keeps the conversation's
    K/V, so each turn prefills only what the last one did not."""
    scheduler = Scheduler(model)
    stdout = stdout or sys.stdout
    print(f"Phoenix Chat — {model.config.name} on {model.backend.device_name}. {HELP}", file=stdout)
    if not model.is_instruction_tuned:
        print(
            "Note: this is a base model, not instruction-tuned: it continues text rather than "
            "following instructions, and often echoes the prompt.",
            file=stdout,
        )

    def answer(history: list[dict], out) -> tuple[str, str | None]:
        parts = []
        stream = scheduler.submit(Request(list(history), params, max_tokens))
        for d in stream:
            out.write(d.text)
            out.flush()
            parts.append(d.text)
        note = None
        if stream.final is not None and stream.final.finish_reason == "context":
            note = "(context full: /reset to start over)"
        elif stream.final is not None and stream.final.finish_reason == "error":
            note = f"(error: {stream.final.error})"
        return "".join(parts), note

    try:
        return _chat_loop(answer, system, stdin or sys.stdin, stdout)
    finally:
        scheduler.close()


def remote_terminal_chat(engine, params, max_tokens: int, system: str | None = None, stdin=None, stdout=None) -> int:
    """The same chat through a RemoteEngine (engine/remote/): the whole history goes to the
    server each turn; a cut or failed answer is a note, the chat goes on."""
    from phoenix_chat.app.remote_cli import print_stream

    stdout = stdout or sys.stdout
    print(f"Phoenix Chat — remote: {engine.target.host}, {engine.resolved_model()}. {HELP}", file=stdout)

    def answer(history: list[dict], out) -> tuple[str, str | None]:
        text, final = print_stream(engine.stream_chat(list(history), params, max_tokens), out, notices=out)
        note = None
        if final.finish_reason == "cut":
            note = f"(cut: {final.error})"
        elif final.finish_reason == "error":
            note = f"(error: {final.error})"
        return text, note

    return _chat_loop(answer, system, stdin or sys.stdin, stdout)


def _chat_loop(answer: Answer, system: str | None, stdin, stdout) -> int:
    history = [{"role": "system", "content": system}] if system else []
    while True:
        stdout.write("> ")
        stdout.flush()
        line = stdin.readline()
        if not line:
            stdout.write("\n")
            return 0
        text = line.rstrip("\n")
        if text.strip() in ("/quit", "/exit"):
            return 0
        if text.strip() == "/reset":
            history = history[:1] if system else []
            print("(new conversation)", file=stdout)
            continue
        if text.strip() == "/retry":
            if not history or history[-1]["role"] != "assistant":
                print("(nothing to retry: send a message first)", file=stdout)
                continue
            history.pop()  # the last answer goes; the same history is asked again
        elif not text.strip():
            continue
        else:
            history.append({"role": "user", "content": text})
        reply, note = answer(history, stdout)
        history.append({"role": "assistant", "content": reply})
        stdout.write("\n")
        if note:
            print(note, file=stdout)
