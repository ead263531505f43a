"""Messages between the GUI and the engine worker process.

Every message is a plain dict with a "type" (picklable, no Qt, no engine objects).
Commands go GUI → worker and are named `*_requested`; events come back named `*_changed`,
`*_finished`, `*_failed` or `*_raised`. Requests that get an answer carry an "id" string.
"""
from __future__ import annotations

import itertools

# GUI → worker
LOAD_REQUESTED = "load_requested"            # id, path, backend, device, quant, context_length, npu
CANCEL_LOAD_REQUESTED = "cancel_load_requested"  # id
GENERATE_REQUESTED = "generate_requested"    # id, messages, params, max_tokens
CANCEL_REQUESTED = "cancel_requested"        # id
DEVICES_REQUESTED = "devices_requested"
SHUTDOWN_REQUESTED = "shutdown_requested"

# worker → GUI
WORKER_READY = "worker_ready"                # pid
DEVICES_CHANGED = "devices_changed"          # devices: [{id, name, kind}], npu: {present, reason}
LOADING_CHANGED = "loading_changed"          # id, fraction, message
MODEL_CHANGED = "model_changed"              # id, info
LOAD_FAILED = "load_failed"                  # id, message, cancelled
TOKENS_CHANGED = "tokens_changed"            # id, text (a delta; several tokens may be coalesced)
STATS_CHANGED = "stats_changed"              # id, stats (throttled to ~4 Hz)
GENERATION_FINISHED = "generation_finished"  # id, finish_reason, stats, text
ERROR_RAISED = "error_raised"                # id, message
WORKER_DIED = "worker_died"                  # made up by the GUI side when the pipe breaks

# Sampling fields the worker accepts from the GUI (engine.sampling.SamplingParams).
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"
