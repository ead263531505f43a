"""A chat in the terminal: history kept for the session, answers streamed as they come."""

from __future__ import annotations

import sys

from phoenix_chat.engine.generate import stream_generate
from phoenix_chat.engine.prompt_cache import PromptCache

HELP = "Type a message and press Enter. Commands: /reset (new conversation), /quit."


def terminal_chat(model, params, max_tokens: int, system: str | None = None, stdin=None, stdout=None) -> int:
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    print(f"Phoenix Chat — {model.config.name} on {model.backend.device_name}. {HELP}", file=stdout)
    if not model.is_instruction_tuned:
        print(
            "Note: this is a base model, not instruction-tuned: it continues text rather than "
            "following instructions, and often echoes the prompt.",
            file=stdout,
        )
    history = [{"role": "system", "content": system}] if system else []
    cache = PromptCache(model.backend)  # each turn prefills only what the last one did not
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
        last = None
        for r in stream_generate(model, history, params, max_tokens, cache=cache):
            stdout.write(r.text)
            stdout.flush()
            answer.append(r.text)
            last = r
        history.append({"role": "assistant", "content": "".join(answer)})
        stdout.write("\n")
        if last and last.finish_reason == "context":
            print("(context full: /reset to start over)", file=stdout)
