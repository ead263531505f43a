"""Messages between the GUI and the engine worker process.

Every message is a plain dict with a "type" (picklable, no Qt, no engine objects); a typed
record crosses as a dict too (`GenerationStats.to_dict` / `from_dict`).
Commands go GUI → worker and are named `*_requested`; events come back named `*_changed`,
`*_finished`, `*_failed` or `*_raised`. Requests that get an answer carry an "id" string.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, replace

# GUI → worker
# id, path, backend, device, quant, context_length, npu, slots (answers written at once: the engine's KV
# slots; where that many do not fit or the backend holds one, one loads and MODEL_CHANGED's info says why);
# or id, remote ({url, model, api_key, timeout_s}: answers come from that OpenAI-compatible server,
# app/worker/remote_answer.py; the local model is dropped)
LOAD_REQUESTED = "load_requested"
CANCEL_LOAD_REQUESTED = "cancel_load_requested"  # id
# id, messages, params, max_tokens, overflow ("drop_oldest" | "truncate_middle"), continue_answer
# (the last message is a partial answer to go on with), mode ("chat" | "completion": engine/completion.py);
# a message with pictures has content parts: {"type": "image", "image": <the file's bytes>}, then
# {"type": "text", "text": ...} (the engine's image parts)
# The id names the answer in every event about it (and is the engine Request's id), so several
# answers stream at once and each event reaches its conversation.
GENERATE_REQUESTED = "generate_requested"
CANCEL_REQUESTED = "cancel_requested"  # id: stops that answer only
DEVICES_REQUESTED = "devices_requested"
DRAFT_REQUESTED = "draft_requested"  # id, path (None: no draft model)
DRAFT_CANDIDATES_REQUESTED = "draft_candidates_requested"  # id, paths (which could draft for the loaded model)
# enabled, port: run the local OpenAI-compatible server beside the scheduler (app/worker/server_host.py)
SERVER_REQUESTED = "server_requested"
SHUTDOWN_REQUESTED = "shutdown_requested"

# worker → GUI
WORKER_READY = "worker_ready"  # pid
DEVICES_CHANGED = "devices_changed"  # devices: [{id, name, kind}], npu: {present, reason}
LOADING_CHANGED = "loading_changed"  # id, fraction, message
MODEL_CHANGED = "model_changed"  # id, info (slots: answers at once; slots_note: why fewer than asked, or "")
LOAD_FAILED = "load_failed"  # id, message, cancelled, kept (info of the model still loaded, or None)
# id, params (the SamplingParams fields applied), max_tokens, prompt (the text the model reads,
# decoded from its fitted prompt ids), images (the encoder key, SHA-256 of the pixel values, of each
# picture the engine was given, in prompt order): what the engine really got, not what the GUI asked for
GENERATION_STARTED = "generation_started"
PROMPT_READY = "prompt_ready"  # id, mode ("chat" | "completion"), ids (the prompt ids the model reads)
PROMPT_FITTED = "prompt_fitted"  # id, dropped_messages, cut_tokens, cut_from, total_tokens, context_limit
TOKENS_CHANGED = "tokens_changed"  # id, text (a delta; several tokens may be coalesced)
STATS_CHANGED = "stats_changed"  # id, stats: GenerationStats (throttled to ~4 Hz)
GENERATION_FINISHED = "generation_finished"  # id, finish_reason, stats: GenerationStats, text
ERROR_RAISED = "error_raised"  # id, message
NOTICE_RAISED = "notice_raised"  # id, message: a remote engine's passing news (retrying after 429, a field refused)
DRAFT_CHANGED = "draft_changed"  # id, info (the draft's model info + baseline_tps, or None: no draft)
DRAFT_FAILED = "draft_failed"  # id, message (no draft is loaded now)
DRAFT_CANDIDATES_CHANGED = "draft_candidates_changed"  # id, target (path), candidates: [{path, name, parameters}]
# running, wanted, url (the OpenAI base URL, …/v1), active (requests served or queued), error (one line)
SERVER_CHANGED = "server_changed"
WORKER_DIED = "worker_died"  # made up by the GUI side when the pipe breaks

# Sampling fields the worker accepts from the GUI (engine.sampling.SamplingParams).
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")


@dataclass(frozen=True)
class GenerationStats:
    """A generation's figures, worker → GUI: the status bar (tok/s, TTFT, context), the
    gauges (the backend's `LiveStats`) and the saved answer read this one record.
    None: not measured (a busy share on a backend without that device or timer)."""

    prompt_tokens: int = 0
    prompt_reused: int = 0  # of those, the ones whose K/V the previous turn left in the cache
    generation_tokens: int = 0
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    ttft_s: float | None = None
    context_limit: int | None = None  # the loaded model's context length
    gpu_busy: float | None = None  # share of the last second the GPU worked for the engine
    npu_busy: float | None = None
    kv_cache_bytes: int = 0
    draft_acceptance: float | None = None  # speculative decoding: share of the draft's tokens the model kept
    draft_speedup: float | None = None  # decode speed over the model's own without the draft

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GenerationStats:
        return cls(**data)  # strict: a field one side lacks is an error, not a silent None

    def idle(self) -> GenerationStats:
        """The same figures with the busy gauges at 0 where they are measured (generation over)."""
        return replace(
            self, gpu_busy=None if self.gpu_busy is None else 0.0, npu_busy=None if self.npu_busy is None else 0.0
        )


_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"
