"""Feeds the device panel: samples every REFRESH_MS on a pool thread, never on the GUI thread.

A sysfs read can stall when the GPU hangs; the sample then simply arrives late (or the
next tick is skipped), and the window stays responsive.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

from PySide6.QtCore import QObject, QTimer, Signal

from phoenix_chat.app.gauges.sampler import GaugeSampler, Snapshot
from phoenix_chat.app.views.gauges_view import DevicePanel
from phoenix_chat.app.worker.client import WorkerClient
from phoenix_chat.app.worker.protocol import GenerationStats

REFRESH_MS = 333  # 3 Hz


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


class GaugesController(QObject):
    updated = Signal(object)  # the Snapshot just shown (tests wait on it)

    def __init__(self, panel: DevicePanel, worker: WorkerClient, sampler: GaugeSampler):
        super().__init__(panel)
        self.panel, self.worker, self.sampler = panel, worker, sampler
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gauges")
        self._pending: asyncio.Future | None = None
        self._stopped = False
        self._timer = QTimer(self, interval=REFRESH_MS)
        self._timer.timeout.connect(self._tick)
        worker.stats_changed.connect(self._on_stats)
        worker.generation_finished.connect(lambda gen_id, _r, stats, _t: self._on_finished(gen_id, stats))
        worker.devices_changed.connect(
            lambda _d, npu: sampler.report_npu(bool(npu.get("present")), npu.get("reason", ""))
        )
        worker.model_changed.connect(self._on_model)
        self.backend: str | None = None
        worker.worker_died.connect(self._on_worker_died)
        self.last: Snapshot | None = None
        self.live: dict[str, GenerationStats] = {}  # generation id → latest figures of each answer being written

    def _on_model(self, _load_id: str, info: dict) -> None:
        self.backend = info.get("backend")
        self.live.clear()
        self.sampler.report_engine(None)
        self.panel.sparkline.clear()
        self.panel.tps_value.setText("—")
        if info.get("remote"):  # its devices are the server's: nothing of theirs is shown as ours
            self.panel.engine_label.setText(
                f"Engine — remote: {info['host']}, {info['model']}. Tokens/s measured here; "
                "the gauges below are this computer's."
            )
        else:
            self.panel.engine_label.setText(f"Engine — this computer: {info.get('backend')} on {info.get('device')}")

    def _on_worker_died(self, _reason: str) -> None:
        self.live.clear()
        self.sampler.report_engine(None)

    def start(self) -> None:
        self._timer.start()
        self._tick()

    def stop(self) -> None:
        self._stopped = True
        self._timer.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _tick(self) -> None:
        if self._stopped:
            return  # a tick already queued when the app shut the pool down
        if self._pending is not None and not self._pending.done():
            return  # the previous sample is still out (a stalled sysfs read): skip
        loop = asyncio.get_event_loop()
        self._pending = loop.run_in_executor(self._pool, self.sampler.sample)
        self._pending.add_done_callback(self._on_sample)

    def _on_sample(self, fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        self.show(fut.result())

    def _on_stats(self, gen_id: str, stats: GenerationStats) -> None:
        """Tokens/s is the engine's: the sum over the answers being written (chats answering at
        once each report their own rate); the busy gauges are the backend's, the same in each."""
        self.live[gen_id] = stats
        self.sampler.report_engine(stats)
        self._show_rate()

    def _on_finished(self, gen_id: str, stats: GenerationStats) -> None:
        self.live.pop(gen_id, None)
        if self.live:  # others still answer: their next figures update the panel
            return
        self.sampler.report_engine(stats)  # idle now (busy at 0)
        if stats.generation_tokens:
            self.panel.sparkline.add(stats.generation_tps)
            self.panel.tps_value.setText(f"{stats.generation_tps:.1f}")

    def _show_rate(self) -> None:
        rates = [s.generation_tps for s in self.live.values() if s.generation_tokens]
        if not rates:
            return
        total = sum(rates)
        self.panel.sparkline.add(total)
        self.panel.tps_value.setText(f"{total:.1f}" if len(rates) == 1 else f"{total:.1f} ({len(rates)} answers)")

    def show(self, snap: Snapshot) -> None:
        p = self.panel
        if snap.gpu_busy is None and self.backend == "vulkan":
            # A GPU is in use but nothing measures it: say so rather than "not present".
            p.gpu.set_value(
                None, "not reported", detail="No amdgpu sysfs files, and this Vulkan backend does not report busy time"
            )
        elif snap.gpu_busy is None:
            p.gpu.set_value(None, detail="No amdgpu sysfs, and the engine is not running on a GPU")
        else:
            src = "amdgpu sysfs" if snap.gpu_source == "amdgpu" else "engine timestamps"
            p.gpu.set_value(snap.gpu_busy, f"{snap.gpu_busy:.0%}", detail=f"source: {src}")
        for gauge, pair, name in ((p.vram, snap.vram, "VRAM"), (p.gtt, snap.gtt, "GTT")):
            if pair is None:
                gauge.set_value(None, detail=f"No amdgpu {name} figures on this machine")
            else:
                used, total = pair
                gauge.set_value(used / total, f"{_gib(used)} / {_gib(total)}")
        if snap.npu_present:
            p.npu.set_value(snap.npu_busy or 0.0, f"{(snap.npu_busy or 0.0):.0%}")
        else:
            p.npu.set_value(None, detail=snap.npu_reason or "No NPU found")
        p.cpu.set_value(snap.cpu, None if snap.cpu is None else f"{snap.cpu:.0%}")
        if snap.ram is None:
            p.ram.set_value(None)
        else:
            used, total = snap.ram
            p.ram.set_value(used / total, f"{_gib(used)} / {_gib(total)}")
        gpu_src = {"amdgpu": "amdgpu sysfs", "engine": "engine GPU timers"}.get(snap.gpu_source, "none")
        p.source_label.setText(
            f"Sources — GPU: {gpu_src} · NPU: {'runtime timing' if snap.npu_present else 'absent'} · CPU/RAM: psutil"
        )
        self.last = snap
        self.updated.emit(snap)
