"""One snapshot of every gauge, taken off the GUI thread.

Sources, in order of preference for the GPU: amdgpu sysfs, then the engine's own busy
fraction (Vulkan timestamp queries, reported by the worker). NPU busy comes from the NPU
runtime's kernel timing via the worker. CPU and RAM from psutil. Anything absent is None.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psutil

from phoenix_chat.app.gauges.amdgpu import DEFAULT_ROOT, AmdGpuSysfs
from phoenix_chat.app.worker.protocol import GenerationStats

ENGINE_STALE_S = 1.5  # engine figures older than this mean the engine is idle


@dataclass
class Snapshot:
    gpu_busy: float | None = None
    gpu_source: str = ""  # "amdgpu" | "engine" | ""
    vram: tuple[int, int] | None = None  # used, total (bytes)
    gtt: tuple[int, int] | None = None
    npu_busy: float | None = None
    npu_present: bool = False
    npu_reason: str = ""
    cpu: float | None = None
    ram: tuple[int, int] | None = None


class GaugeSampler:
    """Thread-safe: `report_engine` from the GUI thread, `sample` from a pool thread."""

    def __init__(self, sysfs_root: str = DEFAULT_ROOT):
        self.amdgpu = AmdGpuSysfs(sysfs_root)
        self._lock = threading.Lock()
        self._engine: GenerationStats | None = None
        self._engine_at = 0.0
        self._npu_present = False
        self._npu_reason = "not detected yet"
        psutil.cpu_percent(None)  # first call primes the counter

    def report_engine(self, stats: GenerationStats | None) -> None:
        """The worker's latest figures; None: no engine figures (no model, or the worker died)."""
        with self._lock:
            self._engine, self._engine_at = stats, time.monotonic()

    def report_npu(self, present: bool, reason: str) -> None:
        with self._lock:
            self._npu_present, self._npu_reason = present, reason

    def sample(self) -> Snapshot:
        snap = Snapshot()
        reading = self.amdgpu.read()
        if reading is not None:
            if reading.busy is not None:
                snap.gpu_busy, snap.gpu_source = reading.busy, "amdgpu"
            if reading.vram_used is not None and reading.vram_total:
                snap.vram = (reading.vram_used, reading.vram_total)
            if reading.gtt_used is not None and reading.gtt_total:
                snap.gtt = (reading.gtt_used, reading.gtt_total)
        with self._lock:
            fresh = time.monotonic() - self._engine_at < ENGINE_STALE_S
            engine = self._engine or GenerationStats()
            snap.npu_present, snap.npu_reason = self._npu_present, self._npu_reason
        if snap.gpu_busy is None and engine.gpu_busy is not None:
            # The engine measures its own GPU time; when it stops reporting it is idle.
            snap.gpu_busy, snap.gpu_source = (engine.gpu_busy if fresh else 0.0), "engine"
        if snap.npu_present:
            snap.npu_busy = engine.npu_busy if (fresh and engine.npu_busy is not None) else 0.0
        snap.cpu = psutil.cpu_percent(None) / 100.0
        vm = psutil.virtual_memory()
        snap.ram = (vm.total - vm.available, vm.total)
        return snap
