"""Device layer: probing, buffers, ranges, pipelines from the table, recording and timestamps."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan.memory import row_ranges
from phoenix_chat.engine.backends.vulkan.pipelines import MAX_PUSH_BYTES, VARIANTS, PushLayout
from phoenix_chat.engine.errors import DeviceUnavailableError


def test_capabilities(vk_device):
    c = vk_device.caps
    assert c.subgroup_size >= 1
    assert c.max_storage_buffer_range >= 1 << 27
    assert c.shared_memory >= 16384
    assert c.device_local_bytes > 0
    assert c.storage16, "the kernels read weights through 16-bit storage"
    assert c.name in c.summary()


def test_software_device_needs_opt_in(vk_device):
    from phoenix_chat.engine.backends.vulkan.device import Device, list_devices

    devices = list_devices()
    if all(d.is_software for d in devices):
        with pytest.raises(DeviceUnavailableError, match="no Vulkan device"):
            Device.open()


def test_missing_loader_is_a_clean_error(monkeypatch):
    import builtins

    from phoenix_chat.engine.backends.vulkan import device as device_mod

    real_import = builtins.__import__

    def fake_import(name, *a, **kw):
        if name == "vulkan":
            raise OSError("cannot load library 'libvulkan.so.1'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(DeviceUnavailableError, match="^no Vulkan device: the Vulkan loader"):
        device_mod._vk()


def test_buffer_roundtrip_host_and_device(vk_device):
    data = np.arange(100_003, dtype=np.float32)
    for host in (False, True):
        b = vk_device.buffer(data.nbytes, host=host)
        vk_device.upload(b, data)
        assert np.array_equal(vk_device.download(b, np.float32, data.shape), data)
        b.destroy()


def test_staging_upload_in_pieces_reports_progress(vk_device, monkeypatch):
    monkeypatch.setattr(type(vk_device), "STAGING_BYTES", 1 << 16)
    vk_device._staging = None
    seen = []
    data = np.random.default_rng(0).integers(0, 255, 300_000, dtype=np.uint8)
    b = vk_device.buffer(data.nbytes)
    if b.mapped is not None:  # UMA: written in place; force the staging path
        b.mapped = None
    vk_device.upload(b, data, progress=lambda done, total: seen.append((done, total)))
    out = vk_device.download(b, np.uint8, data.shape)
    assert np.array_equal(out, data)
    assert seen[-1] == (data.size, data.size) and len(seen) >= 2
    b.destroy()
    vk_device._staging.destroy()
    vk_device._staging = None


def test_row_ranges_respect_limit_and_alignment():
    pieces = row_ranges(262144, 680, 1 << 27, 64)  # the 270M's Q8_0 embedding, lavapipe's limit
    assert sum(n for _, n in pieces) == 262144
    for start, n in pieces:
        assert n * 680 <= 1 << 27 and (start * 680) % 64 == 0
    assert row_ranges(10, 100, 1 << 20, 256) == [(0, 10)]


def test_push_layouts_fit_and_pack():
    for v in VARIANTS.values():
        assert v.push.size <= MAX_PUSH_BYTES
    lay = PushLayout("t", [("a", "u32"), ("b", "f32")])
    assert lay.size == 8 and len(lay.pack(a=1, b=2.0)) == 8
    with pytest.raises(KeyError):
        lay.pack(a=1)
    with pytest.raises(ValueError):
        PushLayout("big", [(f"f{i}", "u32") for i in range(33)])


def test_dispatch_replay_and_timestamps(vk_device):
    """A recorded command list replays; quantize_q8_1 doubles as a tiny real kernel."""
    from phoenix_chat.engine.backends.vulkan.matvec import record_quantize

    dev = vk_device
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    xb, qb = dev.buffer(x.nbytes), dev.buffer(2 * 40)
    dev.upload(xb, x)
    cl = dev.commands(timestamps=2)
    cl.timestamp(0)
    record_quantize(cl, dev, xb, qb, 64)
    cl.barrier()
    cl.timestamp(1)
    cl.end()
    for _ in range(3):
        cl.submit()
    words = dev.download(qb, np.uint32, (2, 10))
    d = words[:, 8].view(np.float32)
    q = words[:, :8].copy().view(np.int8).reshape(2, 32).astype(np.float32)
    assert np.allclose(q * d[:, None], x.reshape(2, 32), atol=d.max() / 2 + 1e-6)
    ts = cl.timestamps_ns()
    assert ts[1] >= 0
    cl.destroy()


def test_a_cloned_list_runs_the_same_commands(vk_device):
    """clone() records a list's commands again (fill, dispatch, barriers, copy, timestamps) into
    a list of its own that binds the same descriptor sets: it runs alike after the original is
    destroyed or re-recorded (the sets live while one list shares them); an unended list is
    refused."""
    from phoenix_chat.engine.backends.vulkan.matvec import record_quantize

    dev = vk_device
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    xb, qb, cb = dev.buffer(x.nbytes), dev.buffer(2 * 40), dev.buffer(2 * 40)
    dev.upload(xb, x)
    cl = dev.commands(timestamps=2)
    with pytest.raises(RuntimeError, match="ended"):
        cl.clone()
    cl.timestamp(0)
    cl.fill(qb, 0)
    cl.barrier()
    record_quantize(cl, dev, xb, qb, 64)
    cl.barrier()
    cl.copy(qb, cb, 2 * 40)
    cl.barrier()
    cl.timestamp(1)
    cl.end()
    cl.submit()
    want = dev.download(cb, np.uint32)
    assert want.any()
    twin, second = cl.clone(), cl.clone()
    assert (twin.dispatches, twin.barriers) == (cl.dispatches, cl.barriers)
    cl.destroy()  # the sets stay: the clones share them
    third = twin.clone()  # a clone of a clone
    for other in (twin, second, third):
        dev.upload(cb, np.zeros(20, np.uint32))
        other.submit()
        np.testing.assert_array_equal(dev.download(cb, np.uint32), want)
        assert other.timestamps_ns()[1] >= 0
    second.begin()  # re-recorded: its share released, twin still runs
    second.fill(cb, 7)
    second.submit()
    assert (dev.download(cb, np.uint32) == 7).all()
    twin.submit()
    np.testing.assert_array_equal(dev.download(cb, np.uint32), want)
    for other in (twin, second, third):
        other.destroy()
    for b in (xb, qb, cb):
        b.destroy()


def test_refused_cooperative_matrices_fall_back_loudly(caplog):
    """A driver that advertises cooperative matrices but refuses them at vkCreateDevice: the
    device still opens, without them, and says so (log + the prefill GEMM path)."""
    import logging

    from phoenix_chat.engine.backends.vulkan import device as d
    from phoenix_chat.engine.backends.vulkan import ops_gemm

    try:
        vk = d._vk()
        pds = d._physical_devices(vk)
    except DeviceUnavailableError as exc:  # no loader / device here
        pytest.skip(str(exc))
    if not pds:
        pytest.skip("no Vulkan device")
    caps = d._probe(vk, pds[0], 0)
    if caps.cooperative_matrix:
        pytest.skip(f"{caps.name} really has cooperative matrices")
    caps.cooperative_matrix = True  # claim what this driver will refuse
    with caplog.at_level(logging.WARNING):
        dev = d.Device(vk, pds[0], caps)
    try:
        assert dev.caps.cooperative_matrix is False
        kind = "register-tiled" if dev.caps.is_software else "tiled"
        assert f"falls back to the f32 {kind} kernel" in caplog.text
        assert ops_gemm.kernel(dev) == ("lanes" if dev.caps.is_software else "tiled")
    finally:
        dev.close()


def test_a_scratch_buffer_is_shared_by_name_and_kept_at_one_size(vk_device):
    """Device.scratch (the split-K GEMM's partial sums): one buffer per name, handed to every
    recording that asks, never replaced (a recording would hold a freed buffer), freed by close()."""
    before = vk_device.allocated_bytes
    a = vk_device.scratch("test scratch", 4096)
    assert vk_device.scratch("test scratch", 4096) is a
    assert vk_device.allocated_bytes > before
    with pytest.raises(ValueError, match="exists with 4096 B"):
        vk_device.scratch("test scratch", 8192)
    assert vk_device.scratch("other scratch", 256) is not a
