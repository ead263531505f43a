"""Each sampling flag of `run` reaches the engine (in this process, through cli.main, on the
real embedded model on the CPU: the session's loaded one, so that eight runs load it once), and
values outside a flag's range are refused before any load."""

from __future__ import annotations

import re

import pytest

from phoenix_chat.app.cli import main

PROMPT = "Name three colours."


@pytest.fixture(autouse=True)
def _loaded_once(monkeypatch, cpu_model):
    monkeypatch.setattr("phoenix_chat.app.cli._load", lambda args, **kw: cpu_model)


def run(capsys, *flags: str) -> tuple[str, int]:
    """(the answer, the prompt's tokens) of `run PROMPT --backend cpu --max-tokens 8 FLAGS`."""
    assert main(["run", PROMPT, "--backend", "cpu", "--max-tokens", "8", *flags]) == 0
    out, err = capsys.readouterr()
    prompt_tokens = re.search(r"prompt (\d+) tok", err)
    assert prompt_tokens, err
    return out, int(prompt_tokens.group(1))


def test_each_sampling_flag_changes_what_the_engine_draws(capsys):
    greedy, n_prompt = run(capsys, "--temperature", "0")
    hot = ("--temperature", "1.5", "--seed", "3")
    sampled, _ = run(capsys, *hot)
    assert sampled != greedy  # the control: this seed at this temperature leaves the greedy path
    # each of these keeps only the most likely token, so a hot draw is the greedy answer again
    assert run(capsys, *hot, "--top-k", "1")[0] == greedy
    assert run(capsys, *hot, "--top-p", "0.000001")[0] == greedy
    assert run(capsys, *hot, "--min-p", "1")[0] == greedy
    # a strong penalty on what the prompt already holds takes greedy decoding elsewhere
    assert run(capsys, "--temperature", "0", "--repeat-penalty", "8")[0] != greedy
    # the system prompt is folded into the first user turn: more prompt tokens, another answer
    answer, with_system = run(capsys, "--temperature", "0", "--system", "Answer in French, in one word.")
    assert with_system > n_prompt + 5


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-tokens", "0", "0: takes 1 or more"),
        ("--temperature", "-1", "-1: takes 0 or more"),
        ("--top-k", "-2", "-2: takes 0 or more"),
        ("--top-p", "1.5", "1.5: takes 0 to 1"),
        ("--min-p", "-0.1", "-0.1: takes 0 to 1"),
        ("--repeat-penalty", "0", "0: takes more than 0"),
        ("--seed", "-1", "-1: takes 0 or more"),
        ("--ctx", "0", "0: takes 1 or more"),
        ("--draft-tokens", "0", "0: takes 1 or more"),
        ("--temperature", "warm", "'warm' is not a number"),
        ("--max-tokens", "1.5", "'1.5' is not an integer"),
    ],
)
def test_a_value_out_of_a_flag_s_range_is_refused_with_the_range(capsys, flag, value, message):
    with pytest.raises(SystemExit) as stopped:
        main(["run", PROMPT, "--backend", "cpu", flag, value])
    assert stopped.value.code == 2
    assert f"argument {flag}: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("where", [(), ("--remote", "http://127.0.0.1:9")])
def test_system_with_raw_is_refused_not_dropped(capsys, where):
    """Raw text has no turns: --system was silently left out of the prompt (locally and remote)."""
    assert main(["run", PROMPT, "--raw", "--system", "Be brief.", *where]) == 2
    assert "--system needs the chat format" in capsys.readouterr().err


def test_the_chat_command_s_flags_reach_the_engine(capsys, monkeypatch, cpu_model):
    """`phoenix-chat chat` (cmd_chat, not terminal_chat called directly): --system, --max-tokens
    and --temperature shape the answer to a turn typed on stdin."""
    import io

    from phoenix_chat.engine.generate import generate
    from phoenix_chat.engine.sampling import SamplingParams

    monkeypatch.setattr("sys.stdin", io.StringIO("Name a colour.\n"))
    assert main(["chat", "--backend", "cpu", "--max-tokens", "5", "--temperature", "0", "--system", "Be brief."]) == 0
    talk = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    want = generate(cpu_model, talk, SamplingParams(temperature=0.0), max_tokens=5)
    plain = generate(cpu_model, talk[1:], SamplingParams(temperature=0.0), max_tokens=5)
    assert want != plain  # the system prompt changes this answer, so the test sees it arrive
    assert f"> {want}\n" in capsys.readouterr().out
