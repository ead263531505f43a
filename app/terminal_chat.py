"""A chat in the terminal: history kept for the session, answers streamed as they come."""

from __future__ import annotations

import sys

from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.scheduler import Scheduler

HELP = "Type a message and press Enter. Commands: /reset (new conversation), /quit."


def terminal_chat(model, params, max_tokens: int, system: str | None = None, stdin=None, stdout=None) -> int:
    """Through the engine's one API (engine/scheduler.py): its slot keeps the conversation's
    K/V, so each turn prefills only what the last one did not."""
    scheduler = Scheduler(model)
    try:
        return _chat_loop(scheduler, model, params, max_tokens, system, stdin or sys.stdin, stdout or sys.stdout)
    finally:
        scheduler.close()


def _chat_loop(scheduler, model, params, max_tokens: int, system: str | None, stdin, stdout) -> int:
    print(f"Phoenix Chat — {model.config.name} on {model.backend.device_name}. {HELP}", file=stdout)
    if not model.is_instruction_tuned:
        print(
            "Note: this is a base model, not instruction-tuned: it continues text rather than "
            "following instructions, and often echoes the prompt.",
            file=stdout,
        )
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
        if not text.strip():
            continue
        history.append({"role": "user", "content": text})
        answer = []
        stream = scheduler.submit(Request(list(history), params, max_tokens))
        for d in stream:
            stdout.write(d.text)
            stdout.flush()
            answer.append(d.text)
        history.append({"role": "assistant", "content": "".join(answer)})
        stdout.write("\n")
        if stream.final is not None and stream.final.finish_reason == "context":
            print("(context full: /reset to start over)", file=stdout)
        elif stream.final is not None and stream.final.finish_reason == "error":
            print(f"(error: {stream.final.error})", file=stdout)
