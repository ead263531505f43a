"""The Vulkan backend's options in one record: what the user picks (device, quant) and what
benchmarks and tests force (int8 activations, load-time timing, the few-token path)."""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as QType

QUANT_TYPES = {"q4_0": QType.Q4_0, "q8_0": QType.Q8_0, "f16": QType.F16}


@dataclass(frozen=True)
class VulkanOptions:
    device_index: int | None = None  # None: the best device found
    allow_software: bool = False  # accept a CPU Vulkan device (lavapipe)
    quant: str | None = None  # re-quantize every matrix on load (QUANT_TYPES), else the file's types
    int_dot: bool | None = None  # int8 activations; None: where the dot instruction is real hardware
    autotune: bool | None = None  # time matvec candidates at load; None: on GPUs, not CPU devices
    # forwards of 2..MAX_COLUMNS tokens through the multi-column matvecs: all (True), none
    # (False), or None: timed both ways at load on GPUs (autotune.choose_few_token_path)
    few_token_matvec: bool | None = None

    def __post_init__(self) -> None:
        if self.quant is not None and self.quant not in QUANT_TYPES:
            raise ValueError(f"quant must be one of {sorted(QUANT_TYPES)}, got {self.quant!r}")
