"""The Vulkan backend's options in one record: what the user picks (device, quant) and what
benchmarks and tests force (int8 activations, load-time timing, the few-token path)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, TypeAlias, get_args

from phoenix_chat.engine.quantization import WeightQuant

# what a load does with the record of its kernel timing (tuning_record.py)
TuningRecordMode: TypeAlias = Literal["use", "refresh", "off"]


@dataclass(frozen=True)
class VulkanOptions:
    device_index: int | None = None  # None: the best device found
    allow_software: bool = False  # accept a CPU Vulkan device (lavapipe)
    # re-quantize every matrix on load, else the file's types; a string ("q8_0", "Q8_0") is
    # read by WeightQuant.parse, which rejects anything else with a PhoenixError
    quant: WeightQuant | None = None
    int_dot: bool | None = None  # int8 activations; None: where the dot instruction is real hardware
    autotune: bool | None = None  # time matvec candidates at load; None: on GPUs, not CPU devices
    # forwards of 2..MAX_COLUMNS tokens through the multi-column matvecs: all (True), none
    # (False), or None: timed both ways at load on GPUs (autotune.choose_few_token_path)
    few_token_matvec: bool | None = None
    # forwards of 2..FEW_TOKENS tokens and batched decode steps through the int8 multi-column
    # matvecs (matvec_cols.py; needs int8 activations): all (True), none (False), or None: timed
    # at load on GPUs beside the paths above
    few_token_int8: bool | None = None
    # every reachable bucket's batched step recorded at load for a batch of greedy rows and one
    # of top-k rows (the two mixes like requests make), both copies a pipelined run keeps in
    # flight: True, False, or None: on GPUs with 2+ slots (PHOENIX_VULKAN_PRERECORD=0 turns
    # that default off, for comparisons)
    prerecord_batches: bool | None = None
    # a prefill chunk runs in the recording of its bucket (plan.prefill_bucket) rather than one
    # recorded for its exact length: True, False, or None: on GPUs, not on CPU devices, where the
    # pad rows cost more than a recording (PHOENIX_VULKAN_PREFILL_BUCKETS=0 turns that default off)
    prefill_buckets: bool | None = None
    # a chat's first turn recorded at load: the prefill buckets up to 128 tokens ending in the
    # top-k sampler (SamplingParams' default, the app's) or the greedy one, and their decode steps: True,
    # False, or None: on GPUs where prefill buckets are on (PHOENIX_VULKAN_PRERECORD=0 turns that
    # default off, as it does the batched steps')
    prerecord_chat: bool | None = None
    # the load-time timing's results kept on disk for later loads (tuning_record.py): "use" (read
    # a matching record, else time and write one), "refresh" (time afresh and rewrite it: the
    # doctor), "off", or None: "use" unless PHOENIX_VULKAN_TUNING_RECORD=0
    tuning_record: TuningRecordMode | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "quant", WeightQuant.parse(self.quant))
        if self.tuning_record is not None and self.tuning_record not in get_args(TuningRecordMode):
            raise ValueError(f"tuning_record={self.tuning_record!r}: one of {get_args(TuningRecordMode)} or None")


def chosen(option: bool | None, env: str, default: bool) -> bool:
    """A load-time default that an option forces either way and `env=0` turns off (comparisons)."""
    if option is not None:
        return option
    return default and os.environ.get(env) != "0"
