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

from phoenix_chat.app.worker import protocol as P

STATS_INTERVAL_S = 0.25  # stats to the GUI at 4 Hz
DELTA_INTERVAL_S = 0.03  # coalesce token deltas to ~30 messages/s
PROGRESS_INTERVAL_S = 0.05


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
        self.model = None
        self.model_info: dict | None = None
        self.prompt_cache = None  # the loaded model's engine.prompt_cache.PromptCache: chats reuse their KV
        self.engine = None

    # -- plumbing -------------------------------------------------------------------------
    def send(self, type_: str, **fields) -> None:
        try:
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
            from phoenix_chat.engine.errors import CancelledError, PhoenixError
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
        self._close_model()  # one model in memory at a time: a later failure is reported as such
        kwargs = dict(
            path=msg.get("path"),
            backend=backend,
            context_length=msg.get("context_length"),
            quant=msg.get("quant"),
            device=msg.get("device"),
            progress=progress,
            cancel=cancel,
        )
        try:
            self.send(P.LOADING_CHANGED, id=load_id, fraction=0.0, message="Opening model")
            model = engine.load(**kwargs)
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
        self.prompt_cache = importlib.import_module(f"{engine.__name__}.prompt_cache").PromptCache(model.backend)
        self.model_info = describe_model(model)
        self.send(P.MODEL_CHANGED, id=load_id, info=self.model_info)

    def _load_failed(self, load_id: str, message: str, cancelled: bool = False, kept: dict | None = None) -> None:
        """kept: the info of the model still loaded (the request was refused before it was
        dropped); None: no model is loaded now."""
        self.send(P.LOAD_FAILED, id=load_id, message=message, cancelled=cancelled, kept=kept)

    def generate(self, msg: dict) -> None:
        gen_id = msg["id"]
        if self.model is None:
            self.send(P.ERROR_RAISED, id=gen_id, message="no model is loaded")
            self.send(
                P.GENERATION_FINISHED, id=gen_id, finish_reason="error", stats=P.GenerationStats().to_dict(), text=""
            )
            return
        from phoenix_chat.engine.errors import PhoenixError
        from phoenix_chat.engine.sampling import SamplingParams

        stream_generate = importlib.import_module(f"{self._engine().__name__}.generate").stream_generate
        from phoenix_chat.engine.prompt_fit import fit_chat

        params = SamplingParams(
            **{k: v for k, v in (msg.get("params") or {}).items() if k in P.SAMPLING_FIELDS and v is not None}
        )
        with self.lock:
            cancel = self.gen_cancels.setdefault(gen_id, threading.Event())
        text: list[str] = []
        pending: list[str] = []
        last_delta = last_stats = 0.0
        record = None
        reason = None
        gen = None
        max_tokens = int(msg.get("max_tokens") or 256)
        try:
            fitted = fit_chat(
                self.model,
                msg["messages"],
                msg.get("overflow") or "drop_oldest",
                max_tokens,
                continue_final=bool(msg.get("continue_answer")),
            )
            if fitted.changed:
                self.send(
                    P.PROMPT_FITTED,
                    id=gen_id,
                    dropped_messages=fitted.dropped_messages,
                    cut_tokens=fitted.cut_tokens,
                    total_tokens=fitted.total_tokens,
                    context_limit=self.model.backend.context_length,
                )
            self._report_start(gen_id, fitted.prompt.ids, params, max_tokens)
            gen = stream_generate(
                self.model,
                fitted.prompt,
                params=params,
                max_tokens=max_tokens,
                cancel=cancel.is_set,
                cache=self.prompt_cache,
            )
            for record in gen:
                if record.text:
                    pending.append(record.text)
                    text.append(record.text)
                now = time.monotonic()
                first = len(text) == 1 and bool(pending)
                if pending and (first or now - last_delta >= DELTA_INTERVAL_S):
                    self.send(P.TOKENS_CHANGED, id=gen_id, text="".join(pending))
                    pending.clear()
                    last_delta = now
                if now - last_stats >= STATS_INTERVAL_S:
                    self.send(P.STATS_CHANGED, id=gen_id, stats=self._stats(record).to_dict())
                    last_stats = now
                if record.finish_reason:
                    reason = record.finish_reason
                    break
        except PhoenixError as exc:
            reason = "error"
            self.send(P.ERROR_RAISED, id=gen_id, message=str(exc))
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            reason = "error"
            self.send(P.ERROR_RAISED, id=gen_id, message=f"{type(exc).__name__}: {exc}")
        finally:
            if gen is not None:
                gen.close()  # cancels the engine's loop between tokens
            with self.lock:
                self.gen_cancels.pop(gen_id, None)
        if pending:
            self.send(P.TOKENS_CHANGED, id=gen_id, text="".join(pending))
        stats = self._stats(record).idle() if record is not None else P.GenerationStats()
        self.send(
            P.GENERATION_FINISHED, id=gen_id, finish_reason=reason or "stop", stats=stats.to_dict(), text="".join(text)
        )

    # -- helpers --------------------------------------------------------------------------
    def _report_start(self, gen_id: str, prompt_ids, params, max_tokens: int) -> None:
        """Tell the GUI what the engine is given: the sampling applied and the prompt as text."""
        assert self.model is not None  # generate() returns early without one
        prompt = self.model.tokenizer.decode(prompt_ids)
        self.send(P.GENERATION_STARTED, id=gen_id, params=asdict(params), max_tokens=max_tokens, prompt=prompt)

    def _stats(self, r) -> P.GenerationStats:
        """`r`: the engine's latest GenerationResponse; the busy gauges from the backend."""
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
        )

    def _close_model(self) -> None:
        if self.model is not None:
            try:
                self.model.backend.close()
            except Exception:  # noqa: BLE001
                pass
            self.model = None
            self.model_info = None
            self.prompt_cache = None


def describe_model(model) -> dict:
    """The model info the GUI gets: the engine's own `LoadedModel.describe()` (which carries the
    quantization the backend applied and the weight types it holds, not what was asked for)."""
    return dict(model.describe())


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
