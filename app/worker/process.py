"""The engine worker: a separate process that owns the model (no Qt here).

A GPU hang or a crash in native code kills this process, not the window. The main thread
runs one command at a time (load, generate); a reader thread receives commands and turns
the two cancel commands into flags at once, so Stop works while a generation is running.
"""

from __future__ import annotations

import importlib
import os
import queue
import threading
import time
import traceback
from dataclasses import asdict
from typing import Any

from phoenix_chat.app.worker import protocol as P
from phoenix_chat.app.worker import remote_answer
from phoenix_chat.app.worker.server_host import ServerHost

STATS_INTERVAL_S = 0.25  # stats to the GUI at 4 Hz
DELTA_INTERVAL_S = 0.03  # coalesce token deltas to ~30 messages/s
PROGRESS_INTERVAL_S = 0.05
# completion mode reads the chat as one text: no template places a picture there
CHAT_MODE_ONLY = "pictures are read in chat mode only: turn Completion mode off for this chat"
BASELINE_TOKENS = 16  # the target alone decodes this many tokens when a draft loads: the speed-up's base


def worker_main(conn) -> None:
    """Entry point of the worker process (multiprocessing 'spawn' target)."""
    import signal

    # Ctrl+C in the terminal reaches the whole process group; the GUI decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Worker(conn).run()


class Worker:
    def __init__(self, conn):
        self.conn = conn
        self.commands: queue.Queue = queue.Queue()
        self.gen_cancels: dict[
            str, threading.Event
        ] = {}  # Stop: asked by the engine between prefill layers/chunks and tokens
        self.load_cancels: dict[str, threading.Event] = {}
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()  # the draft-candidates scan sends from its own thread
        self.model = None
        self.load_args: dict = {}  # backend, device, quant of the loaded model: a draft loads the same way
        self.draft = None  # a smaller model with the same tokenizer: speculative decoding (engine/speculative.py)
        self.draft_baseline_tps: float | None = None  # the target's own decode speed, measured with the draft
        self.model_info: dict | None = None
        self.scheduler = None  # engine.scheduler.Scheduler of the loaded model: every answer goes through it
        self.streams: dict = {}  # generation id -> its engine RequestStream (Stop cancels it)
        self.answers: dict[str, threading.Thread] = {}  # generation id -> the thread pumping its answer
        self.draft_lock = threading.Lock()  # speculative answers run one at a time
        self.server = ServerHost(lambda status: self.send(P.SERVER_CHANGED, **status))
        self.engine = None
        self.remote = None  # engine.remote RemoteEngine: answers come from a server (app/worker/remote_answer.py)

    # -- plumbing -------------------------------------------------------------------------
    def send(self, type_: str, **fields) -> None:
        try:
            with self.send_lock:
                self.conn.send({"type": type_, **fields})
        except (BrokenPipeError, OSError):
            os._exit(0)  # the GUI is gone

    def _reader(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.commands.put({"type": P.SHUTDOWN_REQUESTED})
                return
            kind = msg.get("type")
            if kind == P.CANCEL_REQUESTED:
                with self.lock:
                    self.gen_cancels.setdefault(msg.get("id"), threading.Event()).set()
                    stream = self.streams.get(msg.get("id"))
                if stream is not None:
                    stream.cancel()  # ends "cancelled" within one scheduler step
            elif kind == P.CANCEL_LOAD_REQUESTED:
                with self.lock:
                    self.load_cancels.setdefault(msg.get("id"), threading.Event()).set()
            else:
                self.commands.put(msg)

    def run(self) -> None:
        threading.Thread(target=self._reader, name="worker-reader", daemon=True).start()
        self.send(P.WORKER_READY, pid=os.getpid())
        handlers = {
            P.LOAD_REQUESTED: self.load,
            P.GENERATE_REQUESTED: self.generate,
            P.DEVICES_REQUESTED: self.devices,
            P.DRAFT_REQUESTED: self.load_draft,
            P.DRAFT_CANDIDATES_REQUESTED: self.draft_candidates,
            P.SERVER_REQUESTED: lambda msg: self.server.want(bool(msg.get("enabled")), int(msg.get("port") or 0)),
        }
        while True:
            msg = self.commands.get()
            kind = msg.get("type")
            if kind == P.SHUTDOWN_REQUESTED:
                break
            handler = handlers.get(kind)
            if handler is None:
                self.send(P.ERROR_RAISED, id=msg.get("id"), message=f"unknown command {kind!r}")
                continue
            handler(msg)
        self.server.close()
        self._close_model()

    def _engine(self):
        if self.engine is None:
            self.engine = importlib.import_module("phoenix_chat.engine")
            importlib.import_module("phoenix_chat.engine.generate")
        return self.engine

    # -- commands -------------------------------------------------------------------------
    def devices(self, msg: dict) -> None:
        try:
            entries = _probe_devices()
        except Exception:  # noqa: BLE001 — reported as "CPU only"
            entries = []
        self.send(P.DEVICES_CHANGED, devices=list_devices(entries), npu=npu_status(entries))

    def load(self, msg: dict) -> None:
        load_id = msg["id"]
        if msg.get("remote"):
            self._load_remote(load_id, msg["remote"])
            return
        with self.lock:
            cancel = self.load_cancels.setdefault(load_id, threading.Event())
        last = [0.0]

        def progress(fraction, message=""):
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL_S or fraction >= 1.0:
                last[0] = now
                self.send(P.LOADING_CHANGED, id=load_id, fraction=float(fraction), message=str(message))

        try:
            engine = self._engine()
            from phoenix_chat.engine.errors import CancelledError, OutOfMemoryError, PhoenixError
            from phoenix_chat.engine.loader import check_loadable
        except Exception as exc:  # noqa: BLE001 — reported to the user, worker stays up
            self._load_failed(load_id, f"engine unavailable: {exc}", kept=self.model_info)
            return
        backend = msg.get("backend") or "auto"
        if msg.get("npu") == "prefill":
            backend = "npu-hybrid"  # prompt prefill on the NPU, decode on the GPU
        try:  # a file that cannot even be opened must not cost the model we have
            check_loadable(msg.get("path"), backend, msg.get("quant"))
        except PhoenixError as exc:
            self._load_failed(load_id, str(exc), kept=self.model_info)
            return
        self._close_model()  # running answers stop first; one model in memory at a time
        kwargs = dict(
            path=msg.get("path"),
            backend=backend,
            context_length=msg.get("context_length"),
            quant=msg.get("quant"),
            device=msg.get("device"),
            progress=progress,
            cancel=cancel,
        )
        slots, slots_note = max(1, int(msg.get("slots") or 1)), ""
        if slots > 1 and backend == "npu-hybrid":
            slots, slots_note = 1, "the NPU prefill backend writes one answer at a time"
        try:
            self.send(P.LOADING_CHANGED, id=load_id, fraction=0.0, message="Opening model")
            try:
                model = engine.load(**kwargs, slots=slots)
            except OutOfMemoryError as exc:
                if slots == 1:
                    raise
                # each slot holds a whole context of KV cache: one answer at a time rather than no model
                slots_note = f"{slots} answers at once do not fit ({exc}): one at a time"
                slots = 1
                model = engine.load(**kwargs, slots=1)
            if cancel.is_set():
                raise CancelledError("loading cancelled")
        except CancelledError as exc:
            self._load_failed(load_id, str(exc) or "cancelled", cancelled=True)
            return
        except PhoenixError as exc:
            self._load_failed(load_id, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 — a bug, but the user still needs to see it
            traceback.print_exc()
            self._load_failed(load_id, f"{type(exc).__name__}: {exc}")
            return
        finally:
            with self.lock:
                self.load_cancels.pop(load_id, None)
        self.model = model
        self.load_args = {"backend": "auto" if backend == "npu-hybrid" else backend, "device": msg.get("device")}
        self.load_args["quant"] = msg.get("quant")
        self.scheduler = importlib.import_module(f"{engine.__name__}.scheduler").Scheduler(model)
        wanted_ctx = msg.get("context_length")
        if slots > 1 and not wanted_ctx and model.backend.context_length < model.config.context_length:
            # "auto" context: the largest that fits `slots` KV caches, so fewer slots may give a longer one
            slots_note = (
                f"{slots} answers at once share the memory: the context is {model.backend.context_length:,} "
                "tokens (Devices → Parallel answers → 1 may allow a longer one)"
            )
        self.model_info = {**describe_model(model), "slots_note": slots_note}
        self.send(P.MODEL_CHANGED, id=load_id, info=self.model_info)
        self.server.attach(self.scheduler)  # serves the new model when the server is on

    def _load_remote(self, load_id: str, remote: dict) -> None:
        """Answer through a remote server from now on: the local model is dropped first (one
        engine at a time), then the server is asked which model it serves."""
        self._close_model()
        self.send(P.LOADING_CHANGED, id=load_id, fraction=0.0, message="Connecting to the server")
        try:
            from phoenix_chat.engine.errors import PhoenixError

            engine, info = remote_answer.connect(remote)
        except PhoenixError as exc:  # RemoteError: one line, never the key
            self._load_failed(load_id, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 — a bug, but the user still needs to see it
            traceback.print_exc()
            self._load_failed(load_id, f"{type(exc).__name__}: {exc}")
            return
        self.remote = engine
        self.model_info = info
        self.send(P.MODEL_CHANGED, id=load_id, info=info)

    def _load_failed(self, load_id: str, message: str, cancelled: bool = False, kept: dict | None = None) -> None:
        """kept: the info of the model still loaded (the request was refused before it was
        dropped); None: no model is loaded now."""
        self.send(P.LOAD_FAILED, id=load_id, message=message, cancelled=cancelled, kept=kept)

    def generate(self, msg: dict) -> None:
        """Fit the prompt here (quick), then answer on a thread of its own so the command loop
        stays free: a second chat's generate queues or batches in the scheduler meanwhile."""
        gen_id = msg["id"]
        if self.remote is not None:
            self._generate_remote(msg)
            return
        if self.model is None or self.scheduler is None:
            self._finish_failed(gen_id, "no model is loaded")
            return
        from phoenix_chat.engine.completion import ParagraphStop, fit_completion
        from phoenix_chat.engine.errors import PhoenixError
        from phoenix_chat.engine.prompt_fit import fit_chat
        from phoenix_chat.engine.sampling import SamplingParams
        from phoenix_chat.engine.vision.prompt import has_images

        params = SamplingParams(
            **{k: v for k, v in (msg.get("params") or {}).items() if k in P.SAMPLING_FIELDS and v is not None}
        )
        max_tokens = int(msg.get("max_tokens") or 256)
        completion = msg.get("mode") == "completion"
        overflow = msg.get("overflow") or "drop_oldest"
        messages, left_out = msg["messages"], ""
        try:
            if has_images(messages):
                messages, left_out = self._readable_pictures(messages, completion)
            if completion:  # the conversation as one text the model continues (no chat template)
                fitted = fit_completion(self.model, messages, overflow, max_tokens)
            else:
                fitted = fit_chat(
                    self.model, messages, overflow, max_tokens, continue_final=bool(msg.get("continue_answer"))
                )
        except Exception as exc:  # noqa: BLE001 — reported; the worker goes on
            if not isinstance(exc, PhoenixError):
                traceback.print_exc()
            self._finish_failed(gen_id, str(exc) if isinstance(exc, PhoenixError) else f"{type(exc).__name__}: {exc}")
            return
        if left_out:
            self.send(P.NOTICE_RAISED, id=gen_id, message=left_out)
        self.send(P.PROMPT_READY, id=gen_id, mode="completion" if completion else "chat", ids=list(fitted.prompt.ids))
        if fitted.changed:
            self.send(
                P.PROMPT_FITTED,
                id=gen_id,
                dropped_messages=fitted.dropped_messages,
                cut_tokens=fitted.cut_tokens,
                cut_from=fitted.cut_from,
                total_tokens=fitted.total_tokens,
                context_limit=self.model.backend.context_length,
            )
        self._report_start(gen_id, fitted.prompt, params, max_tokens)
        stop = ParagraphStop() if completion else None  # a completion ends at a blank line
        with self.lock:
            cancel = self.gen_cancels.setdefault(gen_id, threading.Event())
        # speculative decoding reads text prompts only: a chat with pictures goes through the scheduler
        if self.draft is not None and not fitted.prompt.images:
            target = self._answer_with_draft
        else:
            target = self._answer_on_scheduler
        thread = threading.Thread(
            target=target, args=(gen_id, fitted.prompt, params, max_tokens, stop, cancel), name=f"answer-{gen_id}"
        )
        with self.lock:
            self.answers[gen_id] = thread
        thread.start()

    def _readable_pictures(self, messages: list[dict], completion: bool) -> tuple[list[dict], str]:
        """The chat as this model reads it. A turn whose own message (the last user message)
        holds pictures the model or mode cannot read is refused (`_check_pictures`); pictures
        only in earlier messages are then left out of the prompt, with a note saying how many
        and why, so a chat that once held a picture goes on with a text-only model or in
        completion mode (the pictures stay in the history)."""
        from phoenix_chat.engine.chat import is_image_part
        from phoenix_chat.engine.errors import PhoenixError
        from phoenix_chat.engine.vision.prompt import has_images

        try:
            self._check_pictures(completion)
            return messages, ""
        except PhoenixError as exc:
            users = [m for m in messages if m.get("role") == "user"]
            if users and has_images([users[-1]]):
                raise
            reason = str(exc)
        kept, left = [], 0
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                text = [part for part in content if not is_image_part(part)]
                left += len(content) - len(text)
                m = {**m, "content": text or ""}
            kept.append(m)
        return kept, f"{left} earlier picture{'s' if left != 1 else ''} left out of the prompt: {reason}"

    def _check_pictures(self, completion: bool) -> None:
        """Before any picture is decoded, the one-line refusals of a chat with pictures: a
        text-only model (NoImageInput), a backend without the image path (NoImageBackend) and
        completion mode (no template places a picture). `fit_chat` then encodes the pictures
        (the encoder's cache makes a regenerate or the next turn cheap) and fits the chat as it
        fits a text one, leaving out its oldest messages; a message with pictures is never cut."""
        from phoenix_chat.engine.backends.base import NoImageBackend
        from phoenix_chat.engine.errors import PhoenixError
        from phoenix_chat.engine.vision.prompt import require_image_input

        assert self.model is not None  # generate() checked
        require_image_input(self.model)
        if not self.model.backend.takes_images:
            raise NoImageBackend(self.model.backend.name)
        if completion:
            raise PhoenixError(CHAT_MODE_ONLY)

    def _answer_on_scheduler(self, gen_id: str, prompt, params, max_tokens: int, stop, cancel) -> None:
        """Submit to the scheduler and pump its deltas to the GUI (tokens ~30/s, stats 4 Hz)."""
        from phoenix_chat.engine.requests import Request

        scheduler = self.scheduler
        assert scheduler is not None and self.model is not None
        pump = _AnswerPump(self, gen_id, stop)
        reason: str | None = None
        stream = None
        try:
            stream = scheduler.submit(Request(prompt, params, max_tokens, id=gen_id))
            with self.lock:
                self.streams[gen_id] = stream
            if cancel.is_set():  # Stop came before the stream existed
                stream.cancel()
            pump.prompt_tokens = len(prompt.ids)
            for delta in stream:
                if delta.usage is not None:
                    pump.usage = delta.usage
                if pump.feed(delta.text, len(delta.token_ids), bool(delta.finish_reason)):
                    reason = "stop"  # the completion's blank line: the paragraph is complete
                    stream.cancel()
                    for rest in stream:  # drain to its end: the slot is free before we report
                        pump.usage = rest.usage or pump.usage
                    break
                if delta.finish_reason is not None:
                    reason = delta.finish_reason
                    if delta.error:
                        self.send(P.ERROR_RAISED, id=gen_id, message=delta.error)
        except Exception as exc:  # noqa: BLE001 — PromptTooLong, EngineBusy, or a bug: reported
            from phoenix_chat.engine.errors import PhoenixError

            if not isinstance(exc, PhoenixError):
                traceback.print_exc()
            reason = "error"
            self.send(P.ERROR_RAISED, id=gen_id, message=str(exc) if isinstance(exc, PhoenixError) else repr(exc))
        finally:
            with self.lock:
                self.streams.pop(gen_id, None)
                self.gen_cancels.pop(gen_id, None)
                self.answers.pop(gen_id, None)
        pump.finish(reason or "stop")

    def _answer_with_draft(self, gen_id: str, prompt, params, max_tokens: int, stop, cancel) -> None:
        """Speculative decoding runs its own loop (engine/speculative.py), one conversation at a
        time: it holds the model exclusively (the scheduler admits nothing meanwhile and forgets
        its prefixes afterwards, since this loop writes K/V behind its back)."""
        from phoenix_chat.engine.generate import stream_generate
        from phoenix_chat.engine.speculative import SpeculativeStats

        assert self.scheduler is not None and self.model is not None
        spec = SpeculativeStats()
        pump = _AnswerPump(self, gen_id, stop)
        reason: str | None = None
        record = None
        gen: Any = None
        try:
            with self.draft_lock, self.scheduler.exclusive():
                gen = stream_generate(
                    self.model,
                    prompt,
                    params=params,
                    max_tokens=max_tokens,
                    cancel=cancel.is_set,
                    cache=None,  # a draft does not combine with prefix reuse: the whole prompt is read again
                    draft=self.draft,
                    spec_stats=spec,
                )
                for record in gen:
                    pump.record = record
                    pump.spec = spec
                    if pump.feed(record.text, 1 if record.token is not None else 0, bool(record.finish_reason)):
                        reason = "stop"
                        break
                    if record.finish_reason:
                        reason = record.finish_reason
                        break
                gen.close()  # ends the engine's loop while the model is still held
        except Exception as exc:  # noqa: BLE001
            from phoenix_chat.engine.errors import PhoenixError

            if not isinstance(exc, PhoenixError):
                traceback.print_exc()
            reason = "error"
            message = str(exc) if isinstance(exc, PhoenixError) else f"{type(exc).__name__}: {exc}"
            self.send(P.ERROR_RAISED, id=gen_id, message=message)
        finally:
            if gen is not None:
                gen.close()
            with self.lock:
                self.gen_cancels.pop(gen_id, None)
                self.answers.pop(gen_id, None)
        pump.finish(reason or "stop")

    def _generate_remote(self, msg: dict) -> None:
        """An answer from the remote server, on a thread of its own (Stop sets its cancel flag,
        which closes the HTTP stream)."""
        from phoenix_chat.engine.completion import ParagraphStop, completion_text
        from phoenix_chat.engine.sampling import SamplingParams
        from phoenix_chat.engine.vision.prompt import has_images

        gen_id = msg["id"]
        if has_images(msg["messages"]) and msg.get("mode") == "completion":
            self._finish_failed(gen_id, CHAT_MODE_ONLY)
            return
        params = SamplingParams(
            **{k: v for k, v in (msg.get("params") or {}).items() if k in P.SAMPLING_FIELDS and v is not None}
        )
        max_tokens = int(msg.get("max_tokens") or 256)
        completion = msg.get("mode") == "completion"
        with self.lock:
            cancel = self.gen_cancels.setdefault(gen_id, threading.Event())
        # the text the server reads: known in completion mode; a chat is templated on the server
        prompt = completion_text(msg["messages"]) if completion else ""
        self.send(
            P.GENERATION_STARTED, id=gen_id, params=asdict(params), max_tokens=max_tokens, prompt=prompt, images=[]
        )
        pump = _AnswerPump(self, gen_id, ParagraphStop() if completion else None)
        thread = threading.Thread(
            target=self._answer_remotely,
            args=(self.remote, pump, msg, params, max_tokens, cancel),
            name=f"answer-{gen_id}",
        )
        with self.lock:
            self.answers[gen_id] = thread
        thread.start()

    def _answer_remotely(self, engine, pump: _AnswerPump, msg: dict, params, max_tokens: int, cancel) -> None:
        from phoenix_chat.engine.errors import PhoenixError

        gen_id = msg["id"]
        try:
            reason, error = remote_answer.stream_answer(
                engine,
                pump,
                msg,
                params,
                max_tokens,
                cancel,
                lambda line: self.send(P.NOTICE_RAISED, id=gen_id, message=line),
            )
        except PhoenixError as exc:  # RemoteError before the first byte (unreachable, auth, model…)
            reason, error = ("cut" if pump.text else "error"), str(exc)
        except Exception as exc:  # noqa: BLE001 — a bug; what came is kept
            traceback.print_exc()
            reason, error = ("cut" if pump.text else "error"), f"{type(exc).__name__}: {exc}"
        finally:
            with self.lock:
                self.gen_cancels.pop(gen_id, None)
                self.answers.pop(gen_id, None)
        if error:
            self.send(P.ERROR_RAISED, id=gen_id, message=error)
        pump.finish(reason)

    def _finish_failed(self, gen_id: str, message: str) -> None:
        self.send(P.ERROR_RAISED, id=gen_id, message=message)
        self.send(P.GENERATION_FINISHED, id=gen_id, finish_reason="error", stats=P.GenerationStats().to_dict(), text="")

    def _stop_answers(self) -> None:
        """Stop every running answer and wait for each to report its end (before a reload)."""
        with self.lock:
            for event in self.gen_cancels.values():
                event.set()
            for stream in self.streams.values():
                stream.cancel()
            threads = list(self.answers.values())
        for thread in threads:
            thread.join()

    def load_draft(self, msg: dict) -> None:
        """Load (path) or drop (None) the draft model for speculative decoding: it must share the
        loaded model's tokenizer and be smaller; it loads on the same backend, device and
        quantization, and the target alone decodes BASELINE_TOKENS to measure the speed-up against."""
        draft_id, path = msg["id"], msg.get("path")
        self._stop_answers()  # a speculative answer may be using the draft this replaces
        self._close_draft()
        if path is None:
            self.send(P.DRAFT_CHANGED, id=draft_id, info=None)
            return
        target = self.model
        if target is None:
            self.send(P.DRAFT_FAILED, id=draft_id, message="no model is loaded to draft for")
            return
        from phoenix_chat.engine.errors import PhoenixError
        from phoenix_chat.engine.generate import PromptIds, stream_generate
        from phoenix_chat.engine.sampling import SamplingParams
        from phoenix_chat.engine.speculative import check_draft, check_draft_file

        draft = None
        try:
            check_draft_file(target, path)  # refused before a weight is read
            draft = self._engine().load(path=path, context_length=target.backend.context_length, **self.load_args)
            check_draft(target, draft)
            probe = PromptIds(tuple(target.tokenizer.encode("The", add_bos=True)))
            assert self.scheduler is not None  # built with the model
            with self.scheduler.exclusive():  # the probe writes K/V behind the scheduler's back
                *_, last = stream_generate(target, probe, SamplingParams(temperature=0.0), BASELINE_TOKENS)
        except Exception as exc:  # noqa: BLE001 — reported to the user; the target stays loaded
            if draft is not None:
                draft.close()
            if not isinstance(exc, PhoenixError):
                traceback.print_exc()
            message = str(exc) if isinstance(exc, PhoenixError) else f"{type(exc).__name__}: {exc}"
            self.send(P.DRAFT_FAILED, id=draft_id, message=message)
            return
        self.draft = draft
        self.draft_baseline_tps = last.generation_tps or None
        info = {**describe_model(draft), "baseline_tps": self.draft_baseline_tps}
        self.send(P.DRAFT_CHANGED, id=draft_id, info=info)

    def draft_candidates(self, msg: dict) -> None:
        """Which of `paths` could draft for the loaded model (same tokenizer, fewer parameters).
        Reading a tokenizer takes a second or two a file, so a thread does it and answers
        DRAFT_CANDIDATES_CHANGED while the worker goes on with its commands."""
        target = self.model
        if target is None:
            self.send(P.DRAFT_CANDIDATES_CHANGED, id=msg["id"], target=None, candidates=[])
            return
        threading.Thread(
            target=self._scan_drafts, args=(msg["id"], target, list(msg.get("paths") or [])), daemon=True
        ).start()

    def _scan_drafts(self, request_id: str, target, paths: list[str]) -> None:
        from phoenix_chat.engine.errors import PhoenixError
        from phoenix_chat.engine.speculative import check_draft_file

        found = []
        for path in paths:
            if path == str(target.path):
                continue
            try:
                config = check_draft_file(target, path)
            except (PhoenixError, OSError):  # another tokenizer, too big, or a file that cannot be read
                continue
            found.append({"path": path, "name": config.name, "parameters": config.parameter_count()})
        self.send(P.DRAFT_CANDIDATES_CHANGED, id=request_id, target=str(target.path), candidates=found)

    def _close_draft(self) -> None:
        if self.draft is not None:
            try:
                self.draft.close()
            except Exception:  # noqa: BLE001
                pass
            self.draft = None
            self.draft_baseline_tps = None
            _release_freed_memory()

    # -- helpers --------------------------------------------------------------------------
    def _report_start(self, gen_id: str, prompt, params, max_tokens: int) -> None:
        """Tell the GUI what the engine is given: the sampling applied, the prompt as text and
        the pictures in it (each one's encoder key: the SHA-256 of its pixel values)."""
        assert self.model is not None  # generate() returns early without one
        text = self.model.tokenizer.decode(prompt.ids)
        images = [span.key for span in prompt.images]
        self.send(
            P.GENERATION_STARTED, id=gen_id, params=asdict(params), max_tokens=max_tokens, prompt=text, images=images
        )

    def _stats(self, r, spec=None) -> P.GenerationStats:
        """`r`: the engine's latest GenerationResponse; the busy gauges from the backend;
        `spec`: the SpeculativeStats of a generation with the draft model."""
        assert self.model is not None  # generate() returns early without one
        backend = self.model.backend
        live = backend.live_stats()
        return P.GenerationStats(
            prompt_tokens=r.prompt_tokens,
            prompt_reused=r.prompt_reused,
            generation_tokens=r.generation_tokens,
            prompt_tps=r.prompt_tps,
            generation_tps=r.generation_tps,
            ttft_s=r.ttft_s,
            context_limit=backend.context_length,
            gpu_busy=live.gpu_busy,
            npu_busy=live.npu_busy,
            kv_cache_bytes=live.kv_cache_bytes,
            draft_acceptance=spec.acceptance if spec is not None and spec.proposed else None,
            draft_speedup=(
                r.generation_tps / self.draft_baseline_tps
                if spec is not None and self.draft_baseline_tps and r.generation_tps
                else None
            ),
        )

    def _close_model(self) -> None:
        self.server.detach()  # it serves this model's scheduler; a load starts it again
        self._stop_answers()
        if self.remote is not None:
            self.remote.close()
            self.remote = None
            self.model_info = None
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None
        self._close_draft()  # it drafted for this model; the GUI asks again after a load
        if self.model is not None:
            try:
                self.model.backend.close()
            except Exception:  # noqa: BLE001
                pass
            self.model = None
            self.model_info = None
            _release_freed_memory()  # the next model (or none: a remote server) must not sit on this one's heap


class _AnswerPump:
    """One answer's way to the GUI: text coalesced to ~30 messages/s, stats at 4 Hz, and the
    finish. The stats are measured here from the deltas (tokens counted, TTFT at the first
    text, tok/s after it) unless a `record` of the engine's own (speculative path) is set.
    Text held back to coalesce goes out within DELTA_INTERVAL_S even when no more comes (a
    timer sends it): a remote server that stalls mid-answer must not hide what it already sent."""

    def __init__(self, worker: Worker, gen_id: str, stop) -> None:
        self.worker = worker
        self.gen_id = gen_id
        self.stop = stop  # a completion's ParagraphStop, or None
        self.text: list[str] = []
        self.pending: list[str] = []
        self.last_delta = self.last_stats = 0.0
        self.started = time.perf_counter()
        self.first_at: float | None = None
        self.tokens = 0
        self.prompt_tokens = 0
        self.usage = None  # the engine's Usage, from the final delta: its figures win
        self.remote_usage = None  # a remote engine's RemoteUsage (client-side TTFT and tok/s, server's counts)
        self.record: Any = None  # the engine's GenerationResponse (speculative path)
        self.spec: Any = None  # its SpeculativeStats
        self._pending_lock = threading.Lock()  # the feeding thread and the flush timer share `pending`
        self._flush_timer: threading.Timer | None = None

    def _send_pending(self) -> None:
        """Send the held-back text now (the caller holds _pending_lock)."""
        if self.pending:
            self.worker.send(P.TOKENS_CHANGED, id=self.gen_id, text="".join(self.pending))
            self.pending.clear()
            self.last_delta = time.monotonic()

    def _flush_later(self) -> None:
        with self._pending_lock:
            self._flush_timer = None
            self._send_pending()

    def feed(self, text: str, tokens: int, final: bool) -> bool:
        """Hand on `text` (`tokens` new ids); True when the completion's blank line ended it."""
        self.tokens += tokens
        if tokens and self.first_at is None:
            self.first_at = time.perf_counter()
        piece = self.stop.feed(text) if self.stop is not None else text
        if self.stop is not None and final:
            piece += self.stop.flush()  # the end: held-back text was not a blank line after all
        now = time.monotonic()
        with self._pending_lock:
            if piece:
                self.pending.append(piece)
                self.text.append(piece)
            first = len(self.text) == 1 and bool(self.pending)
            if self.pending and (first or now - self.last_delta >= DELTA_INTERVAL_S):
                self._send_pending()
            elif self.pending and self._flush_timer is None:
                self._flush_timer = threading.Timer(DELTA_INTERVAL_S, self._flush_later)
                self._flush_timer.daemon = True
                self._flush_timer.start()
        if now - self.last_stats >= STATS_INTERVAL_S:
            self.worker.send(P.STATS_CHANGED, id=self.gen_id, stats=self.stats().to_dict())
            self.last_stats = now
        return self.stop is not None and self.stop.stopped

    def stats(self) -> P.GenerationStats:
        if self.record is not None:
            return self.worker._stats(self.record, self.spec)
        model = self.worker.model
        if model is None:  # a remote engine: measured here, and no device figures of ours
            return self._remote_stats()
        live = model.backend.live_stats()
        ttft = None if self.first_at is None else self.first_at - self.started
        decode_s = time.perf_counter() - self.first_at if self.first_at is not None else 0.0
        tps = (self.tokens - 1) / decode_s if self.tokens > 1 and decode_s > 0 else 0.0
        reused = 0
        if self.usage is not None:  # the scheduler's own figures (queueing counts in its TTFT too)
            reused, tps = self.usage.prompt_reused, self.usage.generation_tps
            ttft = self.usage.ttft_s if self.usage.ttft_s is not None else ttft
        computed = self.prompt_tokens - reused
        return P.GenerationStats(
            prompt_tokens=self.prompt_tokens,
            prompt_reused=reused,
            generation_tokens=self.tokens,
            prompt_tps=computed / ttft if ttft else 0.0,
            generation_tps=tps,
            ttft_s=ttft,
            context_limit=model.backend.context_length,
            gpu_busy=live.gpu_busy,
            npu_busy=live.npu_busy,
            kv_cache_bytes=live.kv_cache_bytes,
        )

    def _remote_stats(self) -> P.GenerationStats:
        """Client-side figures of a remote answer: TTFT from the request to the first text, tok/s
        after it; the final delta's usage (the server's token counts) wins where it came."""
        ttft = None if self.first_at is None else self.first_at - self.started
        decode_s = time.perf_counter() - self.first_at if self.first_at is not None else 0.0
        tps = (self.tokens - 1) / decode_s if self.tokens > 1 and decode_s > 0 else 0.0
        tokens, prompt = self.tokens, 0
        usage = self.remote_usage
        if usage is not None:
            tokens, prompt = usage.completion_tokens or tokens, usage.prompt_tokens or 0
            tps = usage.generation_tps if usage.generation_tps else tps
            ttft = usage.ttft_s if usage.ttft_s is not None else ttft
        return P.GenerationStats(
            prompt_tokens=prompt,
            generation_tokens=tokens,
            prompt_tps=prompt / ttft if ttft and prompt else 0.0,
            generation_tps=tps,
            ttft_s=ttft,
        )

    def finish(self, reason: str) -> None:
        with self._pending_lock:  # the last text goes before the finish, and the timer sends nothing after it
            if self._flush_timer is not None:
                self._flush_timer.cancel()
                self._flush_timer = None
            self._send_pending()
        measured = self.tokens or self.prompt_tokens or self.record is not None
        stats = self.stats().idle() if measured else P.GenerationStats()
        self.worker.send(
            P.GENERATION_FINISHED, id=self.gen_id, finish_reason=reason, stats=stats.to_dict(), text="".join(self.text)
        )


def describe_model(model) -> dict:
    """The model info the GUI gets: the engine's own `LoadedModel.describe()` (which carries the
    quantization the backend applied and the weight types it holds, not what was asked for),
    whether it reads pictures (`image_input`: it has a vision encoder) and how many answers its
    backend holds K/V for at once (`slots`)."""
    return {**model.describe(), "image_input": model.vision is not None, "slots": model.backend.n_slots}


def _probe_devices() -> list:
    from phoenix_chat.engine.devices import list_devices as engine_list_devices

    return engine_list_devices()


def _field(entry, key, default=None):
    return entry.get(key, default) if isinstance(entry, dict) else getattr(entry, key, default)


def list_devices(entries=None) -> list[dict]:
    """The compute backends a user can pick, as [{id, name, kind, index}]: Vulkan GPUs, CPU."""
    try:
        entries = _probe_devices() if entries is None else entries
    except Exception:  # noqa: BLE001 — no devices module, or the probe failed
        entries = []
    out = []
    for i, d in enumerate(entries):
        kind = str(_field(d, "kind", "vulkan"))
        if kind == "npu" or _field(d, "available", True) is False:
            continue
        index = _field(d, "index")
        name = str(_field(d, "name") or f"{kind} {i}")
        dev_id = kind if kind == "cpu" else (f"{kind}:{index}" if index is not None else kind)
        status = str(_field(d, "status", "") or "")
        if kind == "vulkan" and "software" in status:
            name += " (software, slow)"
        out.append({"id": dev_id, "name": name, "kind": kind, "index": index})
    if not any(d["kind"] == "cpu" for d in out):
        out.append({"id": "cpu", "name": "CPU", "kind": "cpu", "index": None})
    return out


def npu_status(entries=None) -> dict:
    """{present, reason, name}: whether the XDNA NPU can be used for prefill here."""
    try:
        entries = _probe_devices() if entries is None else entries
    except Exception as exc:  # noqa: BLE001
        return {"present": False, "reason": f"device probe failed: {exc}", "name": None}
    for d in entries:
        if _field(d, "kind") == "npu":
            return {
                "present": bool(_field(d, "available", False)),
                "reason": str(_field(d, "status", "") or ""),
                "name": _field(d, "name"),
            }
    return {"present": False, "reason": "no NPU support in this engine", "name": None}


def _release_freed_memory() -> None:
    """gc + glibc's malloc_trim after a model is dropped (engine/heap.py says why); imported here,
    not at the top, since the worker starts before it imports the engine."""
    from phoenix_chat.engine.heap import release_freed_memory

    release_freed_memory()
