"""The worker channel on its own, on the real engine and the embedded model (CPU backend):
progress, ordering, cancel, errors, a dead worker replaced."""

from __future__ import annotations

import pytest

from phoenix_chat.app.worker.client import WorkerClient
from phoenix_chat.app.worker.protocol import GenerationStats

pytestmark = pytest.mark.gui


@pytest.fixture
def worker(qloop):
    client = WorkerClient()
    client.start()
    yield client
    client.stop()


def load(qtbot, worker, **kw):
    args = dict(path=None, backend="cpu", device=None, quant=None, context_length=2048, npu=None)
    args.update(kw)
    with qtbot.waitSignal(worker.model_changed, timeout=300_000) as blocker:
        worker.request_load(**args)
    return blocker.args[1]


def test_load_reports_progress_then_the_model(qtbot, worker):
    progress = []
    worker.loading_changed.connect(lambda _id, f, _m: progress.append(f))
    info = load(qtbot, worker)
    assert progress[0] == 0.0 and progress[-1] == 1.0 and progress == sorted(progress) and len(progress) > 2
    assert info["context_length"] == 2048
    assert info["is_instruction_tuned"] is False and worker.model_info == info
    # LoadedModel.describe() as the engine gives it, plus the quantization asked for
    from phoenix_chat.engine.weights import embedded_model_path

    assert info["path"] == str(embedded_model_path()) and info["quant"] == "file" and info["load_s"] > 0
    assert info["backend"] == "cpu" and info["parameters"] > 0 and info["tensor_types"]


def test_deltas_arrive_in_order_and_add_up_to_the_answer(qtbot, worker):
    load(qtbot, worker)
    deltas = []
    worker.tokens_changed.connect(lambda _id, t: deltas.append(t))
    with qtbot.waitSignal(worker.generation_finished, timeout=300_000) as done:
        gen_id = worker.request_generation(
            [{"role": "user", "content": "Write one sentence about the ocean."}], {"temperature": 0.0}, 12
        )
    fid, reason, stats, text = done.args
    assert fid == gen_id and reason == "length"
    assert "".join(deltas) == text and text.startswith("Write one sentence about the ocean.")  # greedy, see goldens
    # one typed record from the backend's live_stats() through the worker (CPU: no busy timers)
    assert isinstance(stats, GenerationStats) and stats.generation_tokens == 12
    assert stats.prompt_tokens > 0 and stats.generation_tps > 0 and stats.ttft_s > 0
    assert stats.context_limit == worker.model_info["context_length"] == 2048
    assert stats.kv_cache_bytes > 0 and stats.gpu_busy is None and stats.npu_busy is None


def test_the_next_turn_reuses_the_conversations_kv_cache(qtbot, worker):
    """The worker keeps a PromptCache per loaded model: turn 2 prefills only what turn 1 did not
    leave in the cache, regenerate only the last prompt token (engine/prompt_cache.py)."""
    load(qtbot, worker)

    def generate(messages):
        with qtbot.waitSignal(worker.generation_finished, timeout=300_000) as done:
            worker.request_generation(messages, {"temperature": 0.0}, 6)
        return done.args[2], done.args[3]

    chat = [{"role": "user", "content": "Name a colour."}]
    first, text = generate(chat)
    assert first.prompt_reused == 0 and first.generation_tokens == 6
    chat += [{"role": "assistant", "content": text}, {"role": "user", "content": "Another one?"}]
    second, _ = generate(chat)
    # the first prompt and the 5 answer tokens fed back (the 6th never was) came from the cache
    assert second.prompt_reused == first.prompt_tokens + 5 < second.prompt_tokens
    again, _ = generate(chat)  # regenerate
    assert again.prompt_reused == again.prompt_tokens - 1


def test_cancel_stops_between_tokens(qtbot, worker):
    load(qtbot, worker)
    with qtbot.waitSignal(worker.tokens_changed, timeout=300_000):
        gen_id = worker.request_generation([{"role": "user", "content": "hi"}], {}, 1500)
    with qtbot.waitSignal(worker.generation_finished, timeout=60_000) as done:
        worker.cancel_generation(gen_id)
    assert done.args[1] == "cancelled" and done.args[2].generation_tokens < 1500


def test_generate_without_a_model_is_an_error_not_a_crash(qtbot, worker):
    with qtbot.waitSignal(worker.error_raised, timeout=30_000) as err:
        worker.request_generation([{"role": "user", "content": "hi"}], {}, 5)
    assert "no model" in err.args[1]
    assert worker.alive


def test_a_dead_worker_is_reported_and_replaced_on_the_next_command(qtbot, worker):
    load(qtbot, worker)
    pid = worker.process.pid
    with qtbot.waitSignal(worker.worker_died, timeout=10_000) as died:
        worker.process.kill()
    assert "killed" in died.args[0] and worker.model_info is None
    load(qtbot, worker)
    assert worker.process.pid != pid


def test_a_dropped_model_s_memory_goes_back_to_the_os(qtbot, worker):
    """Switching to a server drops the local model first; its heap goes back (engine/heap.py)
    rather than staying in the worker for as long as the app runs."""
    import socket

    import psutil

    load(qtbot, worker, quant="f16")  # ~1.4 GiB of weights in the worker
    proc = psutil.Process(worker.process.pid)
    loaded = proc.memory_info().rss
    with socket.socket() as s:  # a port nobody listens on: the connect fails after the drop
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with qtbot.waitSignal(worker.load_failed, timeout=60_000) as failed:
        worker.request_remote(f"http://127.0.0.1:{port}/v1", None, None, 5.0)
    assert failed.args[3] is None  # no local model kept
    # measured: of 2,071 MiB, 1,153 stayed with gc alone (the tokenizer built in this worker)
    assert proc.memory_info().rss < loaded / 6, (loaded >> 20, proc.memory_info().rss >> 20)
