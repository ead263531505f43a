"""Two conversations at once through the real worker and the embedded model: the worker answers
on the engine's scheduler, so a second generate is taken while the first streams, each Stop
stops only its own request, and both answers arrive."""

from __future__ import annotations

import pytest

from tests.app.conftest import ANSWER_TIMEOUT_MS, preset, wait_loaded

pytestmark = [pytest.mark.gui, pytest.mark.slow]

STORY = [{"role": "user", "content": "Tell me a long story about a phoenix."}]
HELLO = [{"role": "user", "content": "Say hello."}]
GREEDY = {"temperature": 0.0}


def _record(app):
    """Every event per generation id, in arrival order."""
    events: list[tuple[str, str]] = []
    finished: dict[str, tuple[str, object, str]] = {}
    w = app.worker
    w.generation_started.connect(lambda gid, _info: events.append(("started", gid)))
    w.tokens_changed.connect(lambda gid, _t: events.append(("tokens", gid)))
    w.generation_finished.connect(lambda gid, reason, stats, text: finished.__setitem__(gid, (reason, stats, text)))
    w.generation_finished.connect(lambda gid, *_: events.append(("finished", gid)))
    return events, finished


def test_a_second_generate_is_taken_while_the_first_streams_and_both_answer(qtbot, make_app, home):
    preset(home, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    events, finished = _record(app)
    a = app.worker.request_generation(STORY, GREEDY, 120)
    qtbot.waitUntil(lambda: ("tokens", a) in events, timeout=ANSWER_TIMEOUT_MS)
    b = app.worker.request_generation(HELLO, GREEDY, 8)
    # The worker's command loop is free while A streams: B is fitted and started before A ends
    # (the old worker ran A to its end on the command loop, so B started only after A finished).
    qtbot.waitUntil(lambda: ("started", b) in events, timeout=ANSWER_TIMEOUT_MS)
    assert ("finished", a) not in events[: events.index(("started", b))]
    qtbot.waitUntil(lambda: a in finished and b in finished, timeout=ANSWER_TIMEOUT_MS)
    for gid, limit in ((a, 120), (b, 8)):
        reason, stats, text = finished[gid]
        assert reason in ("length", "stop") and text.strip(), (gid, reason, text)
        assert 0 < stats.generation_tokens <= limit and stats.ttft_s is not None
    # each got what it gets alone (greedy): B queued or batched beside A, its tokens are its own
    alone = app.worker.request_generation(HELLO, GREEDY, 8)
    qtbot.waitUntil(lambda: alone in finished, timeout=ANSWER_TIMEOUT_MS)
    assert finished[alone][2] == finished[b][2]


def test_each_stop_stops_only_its_own_answer(qtbot, make_app, home):
    preset(home, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    events, finished = _record(app)
    a = app.worker.request_generation(STORY, GREEDY, 200)
    qtbot.waitUntil(lambda: ("tokens", a) in events, timeout=ANSWER_TIMEOUT_MS)
    b = app.worker.request_generation(HELLO, GREEDY, 8)
    qtbot.waitUntil(lambda: ("started", b) in events, timeout=ANSWER_TIMEOUT_MS)
    app.worker.cancel_generation(b)  # B's Stop: B ends, A goes on
    qtbot.waitUntil(lambda: b in finished, timeout=ANSWER_TIMEOUT_MS)
    assert finished[b][0] == "cancelled"
    assert a not in finished
    seen = sum(1 for e in events if e == ("tokens", a))
    qtbot.waitUntil(lambda: sum(1 for e in events if e == ("tokens", a)) > seen, timeout=ANSWER_TIMEOUT_MS)
    app.worker.cancel_generation(a)  # A's Stop
    qtbot.waitUntil(lambda: a in finished, timeout=ANSWER_TIMEOUT_MS)
    assert finished[a][0] == "cancelled" and finished[a][2].strip()
