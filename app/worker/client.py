"""The GUI side of the worker channel.

`WorkerClient` starts the worker process ('spawn': a fresh interpreter, no inherited Qt
state), sends commands over a pipe and turns the events coming back into Qt signals on
the GUI thread. A reader thread blocks on the pipe and hands each message to the asyncio
(qasync) loop; one task pumps that queue, so every signal is emitted on the GUI thread.
When the pipe breaks the worker is gone: `worker_died` is emitted and the next command
starts a fresh process (the caller reloads the model).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading

from PySide6.QtCore import QObject, Signal

from phoenix_chat.app.qt_compat import guard_singleton_refcounts
from phoenix_chat.app.worker import protocol as P
from phoenix_chat.app.worker.process import worker_main

guard_singleton_refcounts()  # see app/qt_compat.py


class WorkerClient(QObject):
    worker_ready = Signal(int)  # pid
    devices_changed = Signal(list, dict)  # devices, npu status
    loading_changed = Signal(str, float, str)  # load id, fraction, message
    model_changed = Signal(str, dict)  # load id, model info
    load_failed = Signal(str, str, bool, object)  # load id, message, cancelled, info of the model kept (or None)
    # generation id, {params, max_tokens, prompt, images (each picture's encoder key)}: what the engine got
    generation_started = Signal(str, dict)
    prompt_ready = Signal(str, str, list)  # generation id, mode ("chat" | "completion"), prompt ids
    prompt_fitted = Signal(str, dict)  # generation id, {dropped_messages, cut_tokens, total_tokens, context_limit}
    tokens_changed = Signal(str, str)  # generation id, text delta
    stats_changed = Signal(str, object)  # generation id, GenerationStats
    generation_finished = Signal(str, str, object, str)  # id, finish reason, GenerationStats, full text
    error_raised = Signal(str, str)  # request id, message
    notice_raised = Signal(str, str)  # generation id, a remote engine's notice (retrying, a field refused)
    worker_died = Signal(str)  # what we know about why
    draft_changed = Signal(str, object)  # request id, the draft's info (None: no draft)
    draft_failed = Signal(str, str)  # request id, message
    draft_candidates_changed = Signal(str, list)  # the target's path, [{path, name, parameters}]
    server_changed = Signal(dict)  # {running, wanted, url, active, error}: the local server in the worker

    def __init__(self, parent=None):
        super().__init__(parent)
        self.process = None
        self._conn = None
        self._queue: asyncio.Queue | None = None
        self._pump_task: asyncio.Task | None = None
        self._reader: threading.Thread | None = None
        self._generation = 0  # bumps on every (re)start so stale readers are ignored
        self.model_info: dict | None = None
        self.generations: set[str] = set()  # ids sent and not finished: an answer is being written
        self._shutting_down = False

    # -- lifetime -------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        """Start the worker process if it is not running."""
        if self.alive:
            return
        self._cleanup_process()
        loop = asyncio.get_event_loop()
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._pump_task = loop.create_task(self._pump())  # reference kept: see STYLE 14
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=worker_main, args=(child_conn,), name="phoenix-engine", daemon=True)
        self.process.start()
        child_conn.close()  # so the parent sees EOF when the child dies
        self._conn = parent_conn
        self._generation += 1
        self._reader = threading.Thread(
            target=self._read, args=(parent_conn, self._generation, loop), name="worker-pipe-reader", daemon=True
        )
        self._reader.start()

    def stop(self, timeout: float = 3.0) -> None:
        """Ask the worker to exit; kill it if it does not."""
        self._shutting_down = True
        if self.process is not None:
            try:
                if self._conn is not None:
                    self._conn.send({"type": P.SHUTDOWN_REQUESTED})
            except (OSError, ValueError):
                pass
            self.process.join(timeout)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(1.0)
        self._cleanup_process()
        if self._pump_task is not None:
            self._pump_task.cancel()
            self._pump_task = None
            self._queue = None

    def _cleanup_process(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None
        if self.process is not None:
            if not self.process.is_alive():
                self.process.join(0)
            self.process = None

    # -- commands -------------------------------------------------------------------------
    def send(self, type_: str, **fields) -> None:
        if not self.alive:
            self.start()
        assert self._conn is not None  # start() opened it
        try:
            self._conn.send({"type": type_, **fields})
        except (BrokenPipeError, OSError):
            # The reader thread will report the death; nothing else to do here.
            pass

    def request_load(self, *, path, backend, device, quant, context_length, npu, slots: int = 1) -> str:
        """slots: answers the engine writes at once (its KV slots; the worker may load fewer and
        says why in the model info's slots_note)."""
        load_id = P.new_id("load")
        self.model_info = None
        self.send(
            P.LOAD_REQUESTED,
            id=load_id,
            path=path,
            backend=backend,
            device=device,
            quant=quant,
            context_length=context_length,
            npu=npu,
            slots=slots,
        )
        return load_id

    def request_remote(self, url: str, model: str | None, api_key: str | None, timeout_s: float) -> str:
        """Answer through the OpenAI-compatible server at `url` from now on (the worker drops its
        local model), waiting up to `timeout_s` for its next bytes; MODEL_CHANGED or LOAD_FAILED
        answers, as for a load."""
        load_id = P.new_id("load")
        self.model_info = None
        remote = {"url": url, "model": model, "api_key": api_key, "timeout_s": timeout_s}
        self.send(P.LOAD_REQUESTED, id=load_id, remote=remote)
        return load_id

    def cancel_load(self, load_id: str) -> None:
        if self.alive:
            self.send(P.CANCEL_LOAD_REQUESTED, id=load_id)

    def request_generation(
        self,
        messages: list[dict],
        params: dict,
        max_tokens: int,
        *,
        overflow: str = "drop_oldest",
        continue_answer: bool = False,
        mode: str = "chat",
    ) -> str:
        """continue_answer: the last message is a partial answer the model goes on writing;
        mode "completion": the conversation is one text the model continues (engine/completion.py)."""
        gen_id = P.new_id("gen")
        self.generations.add(gen_id)
        self.send(
            P.GENERATE_REQUESTED,
            id=gen_id,
            messages=messages,
            params=params,
            max_tokens=max_tokens,
            overflow=overflow,
            continue_answer=continue_answer,
            mode=mode,
        )
        return gen_id

    def cancel_generation(self, gen_id: str) -> None:
        if self.alive:
            self.send(P.CANCEL_REQUESTED, id=gen_id)

    def request_devices(self) -> None:
        self.send(P.DEVICES_REQUESTED)

    def request_draft(self, path: str | None) -> str:
        """Load `path` as the draft model for speculative decoding (None: drop the draft)."""
        draft_id = P.new_id("draft")
        self.send(P.DRAFT_REQUESTED, id=draft_id, path=path)
        return draft_id

    def request_server(self, enabled: bool, port: int) -> None:
        """Run (or stop) the local OpenAI-compatible server in the worker, on 127.0.0.1:`port`."""
        self.send(P.SERVER_REQUESTED, enabled=enabled, port=port)

    def request_draft_candidates(self, paths: list[str]) -> None:
        self.send(P.DRAFT_CANDIDATES_REQUESTED, id=P.new_id("drafts"), paths=paths)

    # -- events ---------------------------------------------------------------------------
    def _read(self, conn, generation: int, loop) -> None:
        """Reader thread: block on the pipe, hand messages to the GUI loop."""
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = {"type": P.WORKER_DIED}
            except Exception as exc:  # noqa: BLE001 — an unpicklable message: report, keep going
                msg = {"type": P.ERROR_RAISED, "id": "", "message": f"bad message from worker: {exc}"}
            msg["_generation"] = generation
            try:
                loop.call_soon_threadsafe(self._enqueue, msg)
            except RuntimeError:
                return  # loop closed: the app is exiting
            if msg["type"] == P.WORKER_DIED:
                return

    def _enqueue(self, msg: dict) -> None:
        if self._queue is not None:
            self._queue.put_nowait(msg)

    async def _pump(self) -> None:
        queue = self._queue
        assert queue is not None  # start() creates it before this task
        while True:
            msg = await queue.get()
            try:
                self._dispatch(msg)
            except Exception:  # noqa: BLE001 — a slot raised; keep the channel alive
                import traceback

                traceback.print_exc()

    def _dispatch(self, msg: dict) -> None:
        kind = msg["type"]
        if msg.get("_generation") != self._generation:
            return  # from a process we already replaced
        if kind == P.WORKER_READY:
            self.worker_ready.emit(msg["pid"])
        elif kind == P.DEVICES_CHANGED:
            self.devices_changed.emit(msg["devices"], msg["npu"])
        elif kind == P.LOADING_CHANGED:
            self.loading_changed.emit(msg["id"], msg["fraction"], msg["message"])
        elif kind == P.MODEL_CHANGED:
            self.model_info = msg["info"]
            self.model_changed.emit(msg["id"], msg["info"])
        elif kind == P.LOAD_FAILED:
            self.model_info = msg["kept"]
            self.load_failed.emit(msg["id"], msg["message"], msg["cancelled"], msg["kept"])
        elif kind == P.GENERATION_STARTED:
            started = {k: msg[k] for k in ("params", "max_tokens", "prompt", "images")}
            self.generation_started.emit(msg["id"], started)
        elif kind == P.PROMPT_READY:
            self.prompt_ready.emit(msg["id"], msg["mode"], msg["ids"])
        elif kind == P.DRAFT_CHANGED:
            self.draft_changed.emit(msg["id"], msg["info"])
        elif kind == P.DRAFT_FAILED:
            self.draft_failed.emit(msg["id"], msg["message"])
        elif kind == P.DRAFT_CANDIDATES_CHANGED:
            self.draft_candidates_changed.emit(msg["target"] or "", msg["candidates"])
        elif kind == P.PROMPT_FITTED:
            self.prompt_fitted.emit(msg["id"], {k: v for k, v in msg.items() if k not in ("type", "id", "_generation")})
        elif kind == P.TOKENS_CHANGED:
            self.tokens_changed.emit(msg["id"], msg["text"])
        elif kind == P.STATS_CHANGED:
            self.stats_changed.emit(msg["id"], P.GenerationStats.from_dict(msg["stats"]))
        elif kind == P.GENERATION_FINISHED:
            self.generations.discard(msg["id"])
            self.generation_finished.emit(
                msg["id"], msg["finish_reason"], P.GenerationStats.from_dict(msg["stats"]), msg["text"]
            )
        elif kind == P.SERVER_CHANGED:
            self.server_changed.emit({k: v for k, v in msg.items() if k not in ("type", "_generation")})
        elif kind == P.NOTICE_RAISED:
            self.notice_raised.emit(msg.get("id") or "", msg["message"])
        elif kind == P.ERROR_RAISED:
            self.error_raised.emit(msg.get("id") or "", msg["message"])
        elif kind == P.WORKER_DIED:
            self.model_info = None
            self.generations.clear()
            code = self.process.exitcode if self.process is not None else None
            if self.process is not None:
                self.process.join(1.0)
                code = self.process.exitcode
            self._cleanup_process()
            if not self._shutting_down:
                self.worker_died.emit(_death_reason(code))


def _death_reason(code) -> str:
    if code is None:
        return "the engine process stopped responding"
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the engine process was killed ({name})"
    return f"the engine process exited (code {code})"
