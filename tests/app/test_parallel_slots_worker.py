"""Devices → Parallel answers reaches the engine as KV slots, and the memory check stays honest:
the worker (in this process, its pipe a list) loads the embedded model on the CPU backend with the
slots asked for, or, where that many caches do not fit the memory the backend's own check reads,
with one slot and a note saying why (never more than fit, never silently fewer)."""

from __future__ import annotations

from types import SimpleNamespace

import psutil
import pytest

from phoenix_chat.app.worker import protocol as P
from phoenix_chat.app.worker.process import Worker
from phoenix_chat.engine.backends.cpu import f32_footprint
from phoenix_chat.engine.weights import embedded_model_path, open_weights

CONTEXT = 2048


class Pipe:
    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, msg: dict) -> None:
        self.sent.append(msg)


def load(slots: int, backend: str = "cpu") -> tuple[Worker, dict]:
    pipe = Pipe()
    worker = Worker(pipe)
    worker.load({"id": "load-1", "path": None, "backend": backend, "context_length": CONTEXT, "slots": slots})
    changed = [m for m in pipe.sent if m["type"] == P.MODEL_CHANGED]
    assert changed, [m for m in pipe.sent if m["type"] == P.LOAD_FAILED]
    return worker, changed[-1]["info"]


@pytest.mark.parametrize("slots", [1, 2])
def test_the_backend_holds_the_slots_asked_for(slots):
    worker, info = load(slots)
    try:
        assert worker.model is not None and worker.model.backend.n_slots == slots
        assert worker.scheduler is not None and len(worker.scheduler.slots) == slots
        assert info["slots"] == slots and info["slots_note"] == ""
    finally:
        worker._close_model()


def test_slots_that_do_not_fit_load_one_and_say_why(monkeypatch):
    weights = open_weights(embedded_model_path())
    one, two = f32_footprint(weights, CONTEXT, 1), f32_footprint(weights, CONTEXT, 2)
    weights.close()
    # memory the CPU backend's check (90% of what is available) finds room in for one cache, not two
    available = (one + two) / 2 / 0.9
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=available, total=real.total))
    worker, info = load(2)
    try:
        assert worker.model is not None and worker.model.backend.n_slots == 1
        assert info["slots"] == 1
        assert info["slots_note"].startswith("2 answers at once do not fit (the CPU backend needs")
        assert info["slots_note"].endswith("one at a time")
    finally:
        worker._close_model()
