"""Device gauges: the amdgpu sysfs reader on a fake tree (real file formats), and "not present"."""

from __future__ import annotations

import pytest

from phoenix_chat.app.gauges.amdgpu import AmdGpuSysfs
from phoenix_chat.app.gauges.sampler import GaugeSampler
from phoenix_chat.app.views.gauges_view import NOT_PRESENT
from phoenix_chat.app.worker.protocol import GenerationStats
from tests.app.conftest import ANSWER_TIMEOUT_MS, preset, wait_loaded


def make_amdgpu_tree(root, busy=37, vram=(512 * 2**20, 4 * 2**30), gtt=(1536 * 2**20, 12 * 2**30)):
    """What amdgpu exposes: one decimal integer and a newline per file (bytes for memory)."""
    (root / "card0-eDP-1").mkdir(parents=True)  # a connector entry, not a card
    dev = root / "card0" / "device"
    dev.mkdir(parents=True)
    (root / "renderD128").mkdir()
    (dev / "gpu_busy_percent").write_text(f"{busy}\n")
    (dev / "mem_info_vram_used").write_text(f"{vram[0]}\n")
    (dev / "mem_info_vram_total").write_text(f"{vram[1]}\n")
    (dev / "mem_info_gtt_used").write_text(f"{gtt[0]}\n")
    (dev / "mem_info_gtt_total").write_text(f"{gtt[1]}\n")
    return dev


def test_sysfs_reader_parses_amdgpu_files(tmp_path):
    dev = make_amdgpu_tree(tmp_path / "drm")
    reader = AmdGpuSysfs(tmp_path / "drm")
    assert reader.present and reader.device_dir == dev
    r = reader.read()
    assert r.card == "card0"
    assert r.busy == 0.37
    assert (r.vram_used, r.vram_total) == (512 * 2**20, 4 * 2**30)
    assert (r.gtt_used, r.gtt_total) == (1536 * 2**20, 12 * 2**30)
    (dev / "gpu_busy_percent").write_text("88\n")  # values are re-read every sample
    assert reader.read().busy == 0.88


def test_sampler_without_gpu_or_npu_reports_absence_not_zero(tmp_path):
    snap = GaugeSampler(str(tmp_path / "nothing")).sample()
    assert snap.gpu_busy is None and snap.vram is None and snap.gtt is None
    assert snap.npu_busy is None and not snap.npu_present
    assert 0.0 <= snap.cpu <= 1.0
    used, total = snap.ram
    assert 0 < used < total


def test_engine_busy_fills_in_when_there_is_no_sysfs(tmp_path):
    sampler = GaugeSampler(str(tmp_path / "nothing"))
    sampler.report_engine(GenerationStats(gpu_busy=0.42))
    snap = sampler.sample()
    assert (snap.gpu_busy, snap.gpu_source) == (0.42, "engine")


def test_panel_shows_fake_sysfs_values(qtbot, qloop, make_app, home):
    make_amdgpu_tree(home / "drm")
    app = make_app(sysfs_root=str(home / "drm"), autoload=False)
    panel = app.window.devices
    qtbot.waitUntil(lambda: app.gauges.last is not None, timeout=10_000)
    assert panel.gpu.text == "37%" and panel.gpu.fraction == 0.37
    assert panel.vram.text == "0.5 GiB / 4.0 GiB"
    assert panel.gtt.text == "1.5 GiB / 12.0 GiB"
    assert panel.cpu.present and panel.ram.present
    # The NPU gauge: the device probe in the worker finds no NPU on the test machines.
    assert panel.npu.text == NOT_PRESENT and not panel.npu.present
    (home / "drm" / "card0" / "device" / "gpu_busy_percent").write_text("5\n")
    with qtbot.waitSignal(app.gauges.updated, timeout=5_000):
        pass
    qtbot.waitUntil(lambda: panel.gpu.text == "5%", timeout=5_000)


def test_panel_says_not_present_without_a_gpu(qtbot, qloop, make_app, home):
    app = make_app(autoload=False)
    panel = app.window.devices
    qtbot.waitUntil(lambda: app.gauges.last is not None, timeout=10_000)
    for gauge in (panel.gpu, panel.vram, panel.gtt, panel.npu):
        assert gauge.text == NOT_PRESENT and gauge.fraction is None
    assert panel.cpu.text.endswith("%")


def test_gpu_in_use_without_a_busy_source_says_not_reported(qtbot, qloop, make_app):
    app = make_app(autoload=False)
    app.gauges._on_model("load-1", {"backend": "vulkan"})
    with qtbot.waitSignal(app.gauges.updated, timeout=5_000):
        pass
    assert app.window.devices.gpu.text == "not reported" and not app.window.devices.gpu.present


def test_npu_busy_from_the_engine_and_idle_once_the_generation_is_over(tmp_path):
    sampler = GaugeSampler(str(tmp_path / "nothing"))
    sampler.report_npu(True, "")
    working = GenerationStats(generation_tokens=3, gpu_busy=0.5, npu_busy=0.25)
    sampler.report_engine(working)
    assert (sampler.sample().gpu_busy, sampler.sample().npu_busy) == (0.5, 0.25)
    sampler.report_engine(working.idle())
    assert (sampler.sample().gpu_busy, sampler.sample().npu_busy) == (0.0, 0.0)
    assert GenerationStats.from_dict(working.to_dict()) == working  # what crosses the pipe


@pytest.mark.gui
def test_a_real_generations_stats_record_reaches_the_gauges(qtbot, make_app, home):
    preset(home, max_tokens=5, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    records = []
    app.worker.stats_changed.connect(lambda _id, stats: records.append(stats))
    app.chat.set_chat_mode("chat")  # completion mode (the base model's default) would end at a blank line
    with qtbot.waitSignal(app.worker.generation_finished, timeout=ANSWER_TIMEOUT_MS) as done:
        app.chat.send("Hello")
    final = done.args[2]
    assert all(isinstance(r, GenerationStats) for r in records + [final])
    assert final.generation_tokens == 5 and final.generation_tps > 0
    panel = app.window.devices
    assert panel.sparkline.values[-1] == final.generation_tps
    assert panel.tps_value.text() == f"{final.generation_tps:.1f}"
    assert app.window.tps_label.text() == f"{final.generation_tps:.1f} tok/s"
    assert app.window.context_label.text() == (
        f"context {final.prompt_tokens + final.generation_tokens:,}/{final.context_limit:,}"
    )
