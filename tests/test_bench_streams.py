"""The many-stream bench's admission and alternating-chat runs (engine/bench_streams.py) on the
CPU backend and the embedded 270M, through `python -m bench.run`'s flags."""

import json

import pytest

from bench.run import main as bench_run
from phoenix_chat.engine.bench_streams import load_for_streams, run_streams_bench, scripted_chats
from phoenix_chat.engine.errors import PhoenixError
from phoenix_chat.engine.scheduler import Scheduler


def test_admitted_prompt_is_chunked_between_decodes_and_alternating_chats_keep_their_prefixes(tmp_path):
    out = tmp_path / "streams.json"
    argv = ["--backends", "cpu", "--only-streams", "--streams", "2", "--prompt-tokens", "8", "--gen-tokens", "3"]
    argv += ["--admit-tokens", "300", "--alternate-chats", "2", "--chat-turns", "3", "--json", str(out)]
    assert bench_run(argv) == 0
    [r] = json.loads(out.read_text())  # --only-streams: no single-stream bench, no peer
    assert r["kind"] == "streams"
    assert r["slots"] == 3 and r["context"] >= 300  # 2 streams + the admitted one; room for its prompt

    a = r["admission"]
    assert a["streams"] == 2 and a["admit_tokens"] == 300 and a["reused"] == 0
    assert a["chunks"] == 3  # 128 + 128 + 44: one chunk per scheduler step
    # between its submit and its first token both running streams kept receiving tokens: at least
    # one per step of the first two chunks each (the third chunk's step samples its first token)
    assert a["still_running"] == 2 and a["running_tokens"] >= 2 * 2
    # nobody waited for the whole prefill: the worst gap is a step, shorter than the admitted TTFT
    assert 0 < a["during_max_ms"] < a["ttft_ms"]
    assert a["before_p50_ms"] > 0 and a["during_p99_ms"] >= a["during_p50_ms"] > 0

    chats = r["chats"]
    assert len(chats) == 2  # A1, B1, A2, B2, A3, B3
    assert r["chat_recordings"] is None  # the CPU backend records nothing
    for c in chats:
        assert len(c["ttft_ms"]) == 3 and all(t > 0 for t in c["ttft_ms"])
        assert c["reused"][0] == 0
        # every later turn reused at least its own previous prompt: the other chat did not evict it
        for prev, reused in zip(c["prompt_tokens"], c["reused"][1:]):
            assert reused >= prev


def test_alternating_chats_on_one_slot_evict_each_other(cpu_model):
    """The control: where both conversations share one slot, B's turn replaces A's prefix, so the
    reuse the alternating run asserts is the slots' doing, not the measurement's."""
    s = Scheduler(cpu_model)
    try:
        a, b = scripted_chats(s, cpu_model.config, 2, 2)
    finally:
        s.close()
    assert a.reused[1] < a.prompt_tokens[0] and b.reused[1] < b.prompt_tokens[0]


def test_too_short_a_context_or_too_few_slots_is_refused(cpu_model):
    with pytest.raises(PhoenixError, match="--ctx 200 .* 310 tokens .*--admit-tokens 300"):
        load_for_streams(None, "cpu", [2], 8, 3, 0, admit_tokens=300, ctx=200)  # refused before loading
    with pytest.raises(PhoenixError, match="context of 4106 tokens .* loaded with 2048"):
        run_streams_bench(cpu_model, [1], 8, 3, 0, admit_tokens=4096)
    with pytest.raises(PhoenixError, match="needs 2 slots"):
        run_streams_bench(cpu_model, [1], 8, 3, 3, alternate_chats=2)
