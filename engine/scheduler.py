"""The scheduler: owns one loaded model and serves `Request`s (engine/requests.py) by continuous
batching over the backend's K/V slots.

Every client — the GUI worker, the CLI, the bench, the local server — submits here and reads a
`RequestStream`. A bounded queue holds what waits for a slot: a full queue refuses at once
(`EngineBusy`), and a prompt that cannot fit the context is refused before it waits or takes a
slot (`PromptTooLong`).

One thread runs steps. A step (1) ends cancelled requests, freeing their slots, and admits
waiting ones into free slots; (2) prefills one chunk (PREFILL_CHUNK tokens) of the oldest prompt
still being read, so a long prompt never freezes the others for more than a chunk; (3) advances
every sequence that is generating by one token in one `decode_batch` (or `decode_batch_sampled`
where the device samples): one pass over the weights for all of them. When every running
sequence is decoding and none waits, the batch takes a pipelined run of steps instead
(`decode_batch_tokens`: the device feeds each step's ids to the next while the host hands out
the previous step's tokens), broken off as soon as a request arrives or one of them ends. Sequences join and leave
between steps; each samples with its own params and seeded `Sampler`, so a seeded request's
tokens do not depend on who shares its steps.

Prefix reuse per slot: a new request goes to the free slot holding its longest usable common
prefix (a conversation's earlier turns, a shared system prompt; the sliding-window rule of
engine/prompt_cache.py, with each slot's writes tracked by a `SlotPrefix`), else to the least
recently used free slot; only the rest of the prompt is prefilled.

Pictures (a chat with image parts, or `PromptIds` carrying its `images`): `submit` encodes them
on the caller's thread (`encode_prompt`; the encoder caches soft tokens per image hash,
engine/vision/encoder.py, so a regenerate does not run the tower again), the prefill chunks
never cut a picture's span and run through `backend.forward_slot_images` (soft tokens in place
of the placeholders, bidirectional within each picture), and a slot's record holds each
picture's placeholders keyed by its hash (engine/vision/spans.py `cache_keys`): a cached prefix
is reused past a picture only where the same picture sits at the same place, and never resumes
inside one. A backend without the image path (`takes_images` false) refuses such a request at
submit with one line.

A one-slot backend has nothing to batch: each request runs through `generate_step` with the
model's `PromptCache`, one token per step, so a backend that keeps the whole token step on the
device (Vulkan's `generate_tokens`) keeps doing so.

The scheduler must be the only writer to its model's K/V: a forward it does not see makes its
record of what a slot holds wrong.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from phoenix_chat.engine.backends.base import PREFILL_CHUNK, NoImageBackend, SeqStep, image_chunks
from phoenix_chat.engine.batch_policy import BatchPolicy
from phoenix_chat.engine.errors import CancelledError, PhoenixError
from phoenix_chat.engine.generate import Prompt, PromptIds, encode_prompt
from phoenix_chat.engine.prompt_cache import PromptCache, ReusePlan, SlotPrefix
from phoenix_chat.engine.requests import Delta, EngineBusy, FinishReason, PromptTooLong, Request, RequestStream, Usage
from phoenix_chat.engine.sampling import Sampler
from phoenix_chat.engine.stop_strings import StopMatcher
from phoenix_chat.engine.vision.spans import ImageSpan, cache_keys

if TYPE_CHECKING:
    from phoenix_chat.engine.loader import LoadedModel
    from phoenix_chat.engine.tokenizer import StreamingDetokenizer

log = logging.getLogger("phoenix.engine")

DEFAULT_MAX_QUEUE = 64
# tokens a lone decoding sequence takes from the device-resident decode before the scheduler
# looks round again (it also stops at once when a request waits or this one is cancelled)
SOLO_RUN = 64


def error_text(err: Exception) -> str:
    """The one line a failed request ends with: a PhoenixError's own message (what the user can
    act on, as the CLI and GUI show it), else the exception's type and message (a bug)."""
    return str(err) if isinstance(err, PhoenixError) else f"{type(err).__name__}: {err}"


def _log_failure(err: Exception, msg: str, *args: object) -> None:
    """A device or user-facing failure is logged as a line (the client shows it); a bug with its traceback."""
    if isinstance(err, PhoenixError):
        log.info(msg + ": %s", *args, err)
    else:
        log.exception(msg, *args)


# a request waiting for a slot: its stream, prompt ids, pictures and when it was queued
_Waiting = tuple[RequestStream, list[int], list[ImageSpan], float]


@dataclass
class _Seq:
    """One admitted request: its prompt, where its prefill stands, and its sampler."""

    stream: RequestStream
    ids: list[int]
    queued_at: float
    slot: _Slot
    sampler: Sampler
    seed: int
    detok: StreamingDetokenizer
    stops: StopMatcher
    budget: int  # answer tokens at most (max_tokens bounded by the context)
    reused: int  # prompt ids whose K/V the slot already held
    prefilled: int  # prompt ids whose K/V is in the slot
    token: int | None = None  # sampled, not yet fed: the next decode step feeds it
    count: int = 0  # answer tokens produced (the eos excluded)
    history: list[int] = field(default_factory=list)  # prompt + answer ids (repetition penalty)
    unsent: list[int] = field(default_factory=list)  # ids not yet handed out in a delta
    first_at: float | None = None
    tokens: Generator[int, None, None] | None = None  # a one-slot backend's generate_step
    images: list[ImageSpan] = field(default_factory=list)  # the pictures' spans in `ids`
    keys: list[int] = field(default_factory=list)  # `ids` as the slot's record holds them (cache_keys)

    @property
    def pos(self) -> int:
        """Where the pending token is fed."""
        return len(self.ids) + self.count - 1


@dataclass(frozen=True)
class DecodeStep:
    """One batched decode step as the scheduler ran it (`Scheduler.steps`, for the many-stream
    bench): when it ended, how many sequences it advanced, its wall time and the part of it spent
    in the backend's call — the rest is the scheduler's own host work for those rows."""

    ended: float  # time.perf_counter()
    rows: int
    seconds: float
    backend_s: float


STEP_HISTORY = 4096  # decode steps kept in Scheduler.steps


@dataclass
class _Slot:
    index: int
    prefix: SlotPrefix
    used_at: float = 0.0  # when a request last left it (least recently used is evicted first)
    seq: _Seq | None = None


class Scheduler:
    """Serves requests for one model on a thread of its own; `close()` ends it (pending and
    running requests end "cancelled")."""

    def __init__(self, model: LoadedModel, max_queue: int = DEFAULT_MAX_QUEUE) -> None:
        self.model = model
        self.backend = model.backend
        self.max_queue = max_queue
        self.slots = [_Slot(i, SlotPrefix()) for i in range(self.backend.n_slots)]
        # one slot: nothing to batch, requests run through generate_step and this cache
        self.cache = PromptCache(self.backend) if len(self.slots) == 1 else None
        self._eos = set(model.config.eos_token_ids)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: collections.deque[_Waiting] = collections.deque()
        self._live: set[str] = set()  # ids waiting or running (cancel ignores others)
        self._cancelled: set[str] = set()
        self._running: list[_Seq] = []  # admission order
        self._closed = False
        self._paused = 0  # exclusive() holders: nothing new is admitted while any holds the model
        self.max_batch = 0  # the most sequences one decode step advanced (tests, bench)
        self.solo_tokens = 0  # tokens a lone sequence took from the device-resident decode (_solo_run)
        self.run_steps = 0  # batched steps taken in pipelined runs (_batch_run)
        self.policy = BatchPolicy()  # how many ready sequences a step advances (measured)
        self.steps: collections.deque[DecodeStep] = collections.deque(maxlen=STEP_HISTORY)
        self._turn = 0  # where taking turns starts next (round robin)
        self._thread = threading.Thread(target=self._serve, name="phoenix-scheduler", daemon=True)
        self._thread.start()

    # ---- clients ----------------------------------------------------------------------------

    def submit(self, request: Request, loop: asyncio.AbstractEventLoop | None = None) -> RequestStream:
        """Queue `request`; its deltas arrive on the returned stream (async when `loop` is given).
        Raises PromptTooLong before queueing a prompt that leaves no room for an answer, and
        EngineBusy when `max_queue` requests already wait for a slot. Pictures are encoded
        here, on the caller's thread; a text-only model refuses them (NoImageInput), so does a
        backend without the image path (NoImageBackend), and a bad picture is an ImageError."""
        ids, images = self.encode(request.prompt, request.raw)
        limit = self.backend.context_length
        if len(ids) >= limit:
            raise PromptTooLong(len(ids), limit)
        if not ids:
            raise ValueError("an empty prompt has nothing to answer")
        stream = RequestStream(request, loop, self.cancel)
        with self._lock:
            if self._closed:
                raise EngineBusy("the engine is shutting down")
            # a burst of submits may outrun the admitting thread: free slots count as room too
            room = self.max_queue + max(0, len(self.slots) - len(self._running))
            if len(self._pending) >= room:
                raise EngineBusy(f"{len(self._pending)} requests are waiting (the limit): try again shortly")
            self._pending.append((stream, ids, images, time.perf_counter()))
            self._live.add(stream.id)
            self._wake.notify()
        return stream

    def encode(self, prompt: Prompt, raw: bool = False) -> tuple[list[int], list[ImageSpan]]:
        """Prompt ids and pictures' spans as `submit` takes them (the server calls this off its
        event loop, then submits `PromptIds` carrying the spans): a text-only model refuses
        pictures (NoImageInput), so does a backend without the image path (NoImageBackend),
        both before any picture is decoded."""
        from phoenix_chat.engine.vision.prompt import has_images, require_image_input

        if has_images(prompt) or isinstance(prompt, PromptIds) and prompt.images:
            require_image_input(self.model)
            if not self.backend.takes_images:
                raise NoImageBackend(self.backend.name)
        return encode_prompt(self.model, prompt, raw)

    def cancel(self, request_id: str) -> None:
        """Stop a waiting or running request (it ends with finish_reason "cancelled" within one step)."""
        with self._lock:
            if request_id in self._live:
                self._cancelled.add(request_id)
                self._wake.notify()

    @property
    def active(self) -> int:
        """Requests holding a slot now."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._pending)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the model for work outside the scheduler (speculative decoding runs its own loop):
        waits until no request runs, admits none meanwhile (they wait in the queue), and forgets
        what every slot held afterwards, since that work wrote K/V the scheduler did not see."""
        with self._lock:
            self._paused += 1
            self._wake.notify_all()
            while self._running and not self._closed:
                self._wake.wait()
        try:
            yield
        finally:
            for slot in self.slots:
                slot.prefix.forget()
            if self.cache is not None:
                self.cache.forget()
            with self._lock:
                self._paused -= 1
                self._wake.notify_all()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify()
        self._thread.join()

    # ---- the serving thread -------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._lock:
                # paused by exclusive(): only a cancelled waiting request needs the thread (to drop it)
                while (
                    not self._closed
                    and not self._running
                    and (not self._pending or self._paused and not self._cancelled)
                ):
                    self._wake.notify_all()  # an exclusive() caller waits for this: nothing runs
                    self._wake.wait()
                if self._closed:
                    pending, self._pending = list(self._pending), collections.deque()
                    break
                cancelled = set(self._cancelled)
                # a cancelled request leaves the queue at once, slot or no slot
                dropped = [item[0] for item in self._pending if item[0].id in cancelled]
                if dropped:
                    self._pending = collections.deque(i for i in self._pending if i[0].id not in cancelled)
                for stream in dropped:
                    self._done_with(stream.id)
            for stream in dropped:
                stream.put(Delta(stream.id, "", finish_reason="cancelled", usage=Usage(0, 0)))
            for seq in [s for s in self._running if s.stream.id in cancelled]:
                self._finish(seq, "cancelled")
            with self._lock:
                # after the cancelled ones left: a slot one of them held goes to a waiting request
                # in this same step, not a step later
                free = 0 if self._paused else sum(1 for s in self.slots if s.seq is None)
                admit = [self._pending.popleft() for _ in range(min(free, len(self._pending)))]
            for stream, ids, images, queued_at in admit:
                try:
                    self._admit(stream, ids, images, queued_at)
                except Exception as err:  # a bug: this request ends, the engine goes on
                    _log_failure(err, "request %s could not be admitted", stream.id)
                    with self._lock:
                        self._done_with(stream.id)
                    stream.put(Delta(stream.id, "", finish_reason="error", error=error_text(err)))
            self._step()
        for seq in list(self._running):
            self._finish(seq, "cancelled")
        for stream, _, _, _ in pending:
            stream.put(Delta(stream.id, "", finish_reason="cancelled", usage=Usage(0, 0)))

    def _done_with(self, request_id: str) -> None:
        """(lock held) forget a request that ended."""
        self._live.discard(request_id)
        self._cancelled.discard(request_id)

    def _is_cancelled(self, request_id: str) -> bool:
        return request_id in self._cancelled or self._closed

    def _admit(self, stream: RequestStream, ids: list[int], images: list[ImageSpan], queued_at: float) -> None:
        """Give a waiting request the free slot with its longest usable prefix (else the least
        recently used free one) and plan its prefill."""
        from phoenix_chat.engine.tokenizer import StreamingDetokenizer

        req = stream.request
        if self.cache is not None:
            slot, plan = self.slots[0], self.cache.plan(ids, images)
        else:
            slot, plan = self._pick_slot(ids, images)
        seed = req.params.seed if req.params.seed is not None else random.getrandbits(63)
        seq = _Seq(
            stream=stream,
            ids=ids,
            queued_at=queued_at,
            slot=slot,
            sampler=Sampler(req.params),
            seed=seed,
            detok=StreamingDetokenizer(self.model.tokenizer),
            stops=StopMatcher(req.stop),
            budget=min(req.max_tokens, self.backend.context_length - len(ids)),
            reused=plan.reused,
            prefilled=plan.reused,
            history=list(ids),
            images=images,
            keys=cache_keys(ids, images),
        )
        slot.seq = seq
        if self.cache is not None:
            seq.tokens = self.cache.generate(
                self.model,
                ids,
                req.params,
                seq.budget,
                plan,
                cancel=lambda: self._is_cancelled(stream.id),
                images=images,
            )
        else:
            slot.prefix.begin(seq.keys, plan.reused)
        self._running.append(seq)

    def _pick_slot(self, ids: list[int], images: list[ImageSpan]) -> tuple[_Slot, ReusePlan]:
        """The free slot to serve `ids` from. A slot continues when the prompt keeps at least
        half of what it holds (its conversation's next turn, a regenerate; an empty slot
        trivially): the continuing slot with the longest reuse wins. Otherwise the least
        recently used free slot is evicted — a conversation's prefix is not thrown away to
        save a few shared template tokens of another (llama.cpp's server picks by the same
        kind of similarity)."""
        free = [s for s in self.slots if s.seq is None]
        plans = {s.index: s.prefix.plan(ids, self.backend, images) for s in free}
        continuing = [s for s in free if 2 * plans[s.index].reused >= len(s.prefix.tokens)]
        if continuing:
            slot = max(continuing, key=lambda s: (plans[s.index].reused, -s.used_at))
        else:
            slot = min(free, key=lambda s: s.used_at)
        return slot, plans[slot.index]

    # ---- one step ----------------------------------------------------------------------------

    def _step(self) -> None:
        if self.cache is not None:
            self._serial_step()
            return
        decoding = [s for s in self._running if s.token is not None]
        reading = next((s for s in self._running if s.token is None), None)
        if reading is None and len(decoding) == 1 and not self._pending:
            try:
                if self._solo_run(decoding[0]):
                    return
            except Exception as err:
                _log_failure(err, "request %s failed in decode", decoding[0].stream.id)
                self._fail(decoding[0], err)
                return
        if reading is not None:
            try:
                self._prefill_chunk(reading)
            except CancelledError:
                self._finish(reading, "cancelled")
            except Exception as err:  # a bug or a device failure: this request ends, the engine goes on
                _log_failure(err, "request %s failed in prefill", reading.stream.id)
                self._fail(reading, err)
        if decoding:
            try:
                self._decode(decoding, run=reading is None)
            except Exception as err:
                _log_failure(err, "a decode step of %d sequences failed", len(decoding))
                for seq in decoding:
                    self._fail(seq, err)

    def _serial_step(self) -> None:
        """One token of the one running request (one-slot backend)."""
        if not self._running:
            return
        seq = self._running[0]
        assert seq.tokens is not None
        self.max_batch = max(self.max_batch, 1)
        try:
            token = next(seq.tokens)
        except StopIteration:  # generate_step ends at the budget, which _took ends first
            self._finish(seq, "length")
            return
        except CancelledError:
            self._finish(seq, "cancelled")
            return
        except Exception as err:
            _log_failure(err, "request %s failed", seq.stream.id)
            self._fail(seq, err)
            return
        if seq.first_at is None:
            seq.first_at = time.perf_counter()
        self._took(seq, token)

    def _prefill_chunk(self, seq: _Seq) -> None:
        """Feed the next chunk of `seq`'s prompt; the last chunk's logits give its first token.
        A chunk never cuts a picture's span (it grows to hold one longer than PREFILL_CHUNK)."""
        a = seq.prefilled
        pending = [s for s in seq.images if s.end > a]
        b = a + image_chunks(len(seq.ids) - a, a, pending, PREFILL_CHUNK)[0][1]
        chunk = seq.ids[a:b]
        pictured = any(s.start < b for s in pending)
        slot, params = seq.slot, seq.stream.request.params
        seq.slot.prefix.wrote(b)

        def cancel() -> bool:
            return self._is_cancelled(seq.stream.id)

        token: int | None = None
        if b == len(seq.ids) and not pictured:
            token = self.backend.prefill_sampled(slot.index, chunk, a, params, seq.seed, cancel)
        if token is None:
            if pictured:
                logits = self.backend.forward_slot_images(slot.index, chunk, a, pending, cancel=cancel)
            else:
                logits = self.backend.forward_slot(slot.index, chunk, a, cancel=cancel)
            if b == len(seq.ids):
                token = seq.sampler(logits, seq.history)
        seq.prefilled = b
        slot.prefix.fed(seq.keys[a:b])
        if token is not None:
            seq.first_at = time.perf_counter()
            self._took(seq, token)

    def _solo_run(self, seq: _Seq) -> bool:
        """The one decoding sequence, with nothing else to do: up to SOLO_RUN tokens from the
        backend's device-resident decode in its slot (submissions queued ahead, so the GPU does
        not wait for the host between tokens, as a one-slot backend's generate does), until a
        request waits, this one is cancelled or it ends — a new request waits at most the
        submissions in flight. False: the backend has none (the caller steps it in a batch of one)."""
        assert seq.token is not None
        req = seq.stream.request
        tokens = self.backend.decode_slot_tokens(
            seq.slot.index,
            seq.token,
            seq.pos,
            req.params,
            seq.seed,
            min(seq.budget - seq.count, SOLO_RUN),
            wrote=seq.slot.prefix.wrote,
        )
        if tokens is None:
            return False
        self.max_batch = max(self.max_batch, 1)
        took = 0
        try:
            for token in tokens:
                took += 1
                seq.history.append(seq.token)
                seq.slot.prefix.fed([seq.token])
                self.solo_tokens += 1
                self._took(seq, token)
                if seq.slot.seq is not seq or self._pending or self._is_cancelled(seq.stream.id):
                    break
        finally:
            tokens.close()  # waits for the submissions in flight (their K/V writes were announced)
        return took > 0  # none (no room left): the batched step of one row decides what happens

    def _decode(self, ready: list[_Seq], run: bool = False) -> None:
        """One decode step of `ready` (or of those whose turn it is); run: no prompt is being
        read, so a batch of all of them may take several pipelined steps (`_batch_run`)."""
        # no more rows than the backend's batched step holds (Vulkan: 32, however many slots)
        k = min(self.policy.rows(len(ready)), max(1, self.backend.max_batch_rows))
        if k < len(ready):  # turns: the batch is full, or taking turns beats this backend's batched step
            start = self._turn % len(ready)
            seqs = (ready[start:] + ready[:start])[:k]
            self._turn = start + k
        else:
            seqs = ready
            if run and k > 1 and not self._pending and self._batch_run(seqs):
                return
        t0 = time.perf_counter()
        backend_s = self._decode_rows(seqs)
        self._timed_step(len(seqs), t0, t0 + backend_s, time.perf_counter())

    def _timed_step(self, rows: int, started: float, backend_done: float, ended: float) -> None:
        """A decode step of `rows` sequences ran from `started` to `ended`, the backend's part
        until `backend_done`: the batch policy's measurement and the bench's record."""
        self.policy.record(rows, ended - started)
        self.steps.append(DecodeStep(ended, rows, ended - started, backend_done - started))

    @staticmethod
    def _seq_step(seq: _Seq) -> SeqStep:
        """The backend's view of `seq`'s next decode step: its pending token at its position."""
        assert seq.token is not None
        return SeqStep(seq.slot.index, seq.token, seq.pos, seq.stream.request.params, seq.seed)

    def _hand_out(self, seqs: list[_Seq], drawn: list[int]) -> None:
        """Each sequence's fed token is now in its slot, and `drawn` its next token (`_took`)."""
        for seq, token in zip(seqs, drawn):
            seq.slot.prefix.fed([seq.token])  # type: ignore[list-item]
            self._took(seq, token)

    def _batch_run(self, seqs: list[_Seq]) -> bool:
        """Every decoding sequence in one batch, and nothing else to do: up to SOLO_RUN steps from
        the backend's pipelined run (`decode_batch_tokens`: the device feeds each step's ids to
        the next, the host hands out one step's tokens while the next runs), until a request
        waits or one of them ends or is cancelled. False: the backend has none, or the shortest
        budget left allows one step (the caller takes it as a plain step)."""
        n = min(min(s.budget - s.count for s in seqs), SOLO_RUN)
        if n < 2:
            return False
        starts = [s.pos for s in seqs]

        def submitted(k: int) -> None:
            for seq, p in zip(seqs, starts):
                seq.slot.prefix.wrote(p + k)

        t0 = time.perf_counter()
        run = self.backend.decode_batch_tokens([self._seq_step(s) for s in seqs], n, submitted)
        if run is None:
            return False
        self.max_batch = max(self.max_batch, len(seqs))
        try:
            for drawn in run:
                t1 = time.perf_counter()
                self.run_steps += 1
                for seq in seqs:
                    seq.history.append(seq.token)  # type: ignore[arg-type]
                self._hand_out(seqs, drawn)
                t2 = time.perf_counter()
                self._timed_step(len(seqs), t0, t1, t2)
                t0 = t2
                if self._pending or any(s.slot.seq is not s or self._is_cancelled(s.stream.id) for s in seqs):
                    break
        finally:
            run.close()  # waits for the step in flight (its K/V writes were announced; its ids dropped)
        return True

    def _decode_rows(self, seqs: list[_Seq]) -> float:
        """One decode step of `seqs`; returns the seconds spent in the backend's call."""
        steps = [self._seq_step(seq) for seq in seqs]
        for seq in seqs:
            seq.slot.prefix.wrote(seq.pos + 1)
        self.max_batch = max(self.max_batch, len(steps))
        t0 = time.perf_counter()
        drawn = self.backend.decode_batch_sampled(steps)
        if drawn is None:
            logits = self.backend.decode_batch(steps)
            backend_s = time.perf_counter() - t0
            drawn = []
            for seq, row in zip(seqs, logits):
                seq.history.append(seq.token)  # type: ignore[arg-type]
                drawn.append(seq.sampler(row, seq.history))
        else:
            backend_s = time.perf_counter() - t0
            for seq in seqs:
                seq.history.append(seq.token)  # type: ignore[arg-type]
        self._hand_out(seqs, drawn)
        return backend_s

    def _took(self, seq: _Seq, token: int) -> None:
        """`token` was sampled for `seq`: hand out its text, end the sequence or queue it to be fed."""
        if token in self._eos:
            self._finish(seq, "stop")
            return
        seq.count += 1
        seq.unsent.append(token)
        text = seq.stops.feed(seq.detok.add(token))
        if seq.stops.stopped:
            self._finish(seq, "stop", text)
            return
        if text:
            seq.stream.put(Delta(seq.stream.id, text, tuple(seq.unsent)))
            seq.unsent = []
        if seq.count >= seq.budget:
            full = len(seq.ids) + seq.count >= self.backend.context_length
            self._finish(seq, "context" if full else "length")
            return
        seq.token = token

    def _finish(self, seq: _Seq, reason: FinishReason, text: str = "") -> None:
        """End `seq`: its last delta (held-back text, usage) and its slot freed."""
        if not seq.stops.stopped:
            text += seq.stops.feed(seq.detok.flush()) + seq.stops.flush()
        now = time.perf_counter()
        decode_s = now - seq.first_at if seq.first_at is not None else 0.0
        usage = Usage(
            prompt_tokens=len(seq.ids),
            completion_tokens=seq.count,
            prompt_reused=seq.reused,
            ttft_s=None if seq.first_at is None else seq.first_at - seq.queued_at,
            generation_tps=(seq.count - 1) / decode_s if seq.count > 1 and decode_s > 0 else 0.0,
        )
        self._release(seq)
        seq.stream.put(Delta(seq.stream.id, text, tuple(seq.unsent), finish_reason=reason, usage=usage))

    def _fail(self, seq: _Seq, err: Exception) -> None:
        if seq not in self._running:
            return  # it ended before the failure
        self._release(seq)
        seq.slot.prefix.forget()  # what a failed pass left in the slot is unknown
        if self.cache is not None:
            self.cache.forget()
        seq.stream.put(Delta(seq.stream.id, "", finish_reason="error", error=error_text(err)))

    def _release(self, seq: _Seq) -> None:
        if seq not in self._running:
            return
        self._running.remove(seq)
        if seq.tokens is not None:
            seq.tokens.close()  # the PromptCache records what the slot holds
        else:
            seq.slot.prefix.end(self.backend.kv_ring_slots)
        seq.slot.seq = None
        seq.slot.used_at = time.perf_counter()
        with self._lock:
            self._done_with(seq.stream.id)
