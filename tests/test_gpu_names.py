"""The GPU names users know, from the strings the drivers really report (engine/gpu_names.py)."""

from __future__ import annotations

import dataclasses

import pytest

from phoenix_chat.engine.gpu_names import apu_graphics_from_cpu, gpu_name, radv_family

RADV, AMDVLK, AMD_PRO, NVIDIA, LAVAPIPE = 3, 2, 1, 4, 13
AMD = 0x1002
CPU_780M = "AMD Ryzen 7 7840U w/ Radeon 780M Graphics"
CPU_760M = "AMD Ryzen 5 7640U w/ Radeon 760M Graphics"
CPU_HAWK = "AMD Ryzen 7 8840HS w/ Radeon 780M Graphics"


@pytest.mark.parametrize(
    ("reported", "driver", "cpu", "shown"),
    [
        # RADV: the chip family, the product from the APU's CPU string
        ("RADV PHOENIX", RADV, CPU_780M, "AMD Radeon 780M (RADV PHOENIX)"),
        ("RADV PHOENIX", RADV, CPU_760M, "AMD Radeon 760M (RADV PHOENIX)"),
        ("RADV PHOENIX", RADV, CPU_HAWK, "AMD Radeon 780M (RADV PHOENIX)"),  # Hawk Point: the same chip
        ("RADV GFX1103_R1", RADV, CPU_780M, "AMD Radeon 780M (RADV GFX1103_R1)"),  # Mesa < 23.1
        ("RADV PHOENIX", RADV, "AMD Ryzen Z1 Extreme", "AMD Radeon Graphics (Ryzen Z1 Extreme) (RADV PHOENIX)"),
        ("RADV PHOENIX2", RADV, "AMD Ryzen Z1", "AMD Radeon Graphics (Ryzen Z1) (RADV PHOENIX2)"),
        ("RADV PHOENIX", RADV, None, "AMD Radeon 780M / 760M (RADV PHOENIX)"),  # no CPU string: the family
        ("RADV PHOENIX", RADV, "Intel(R) Xeon(R) CPU", "AMD Radeon 780M / 760M (RADV PHOENIX)"),
        # later Mesa: libdrm's name in front of the family
        ("AMD Radeon 780M (RADV GFX1103_R1)", RADV, None, "AMD Radeon 780M (RADV GFX1103_R1)"),
        ("AMD Radeon Graphics (RADV PHOENIX)", RADV, CPU_760M, "AMD Radeon 760M (RADV PHOENIX)"),
        ("AMD Radeon Graphics (RADV PHOENIX)", RADV, None, "AMD Radeon 780M / 760M (RADV PHOENIX)"),
        ("RADV REMBRANDT", RADV, "AMD Ryzen 7 6800U with Radeon Graphics", "AMD Radeon 680M / 660M (RADV REMBRANDT)"),
        ("RADV NAVI31", RADV, None, "AMD Radeon (RADV NAVI31)"),  # a family the table lacks
        # AMD's proprietary driver and AMDVLK: the marketing name with marks
        ("AMD Radeon(TM) 780M Graphics", AMD_PRO, None, "AMD Radeon 780M (AMD proprietary)"),
        ("AMD Radeon(TM) 780M Graphics", AMDVLK, None, "AMD Radeon 780M (AMDVLK)"),
        ("AMD Radeon(TM) Graphics", AMDVLK, CPU_760M, "AMD Radeon 760M (AMDVLK)"),
        ("AMD Radeon(TM) Graphics", AMD_PRO, None, "AMD Radeon Graphics (AMD proprietary)"),
        # everything else is shown as reported
        ("NVIDIA H100 80GB HBM3", NVIDIA, None, "NVIDIA H100 80GB HBM3"),
        ("llvmpipe (LLVM 15.0.6, 256 bits)", LAVAPIPE, CPU_780M, "llvmpipe (LLVM 15.0.6, 256 bits)"),
    ],
)
def test_display_names(reported, driver, cpu, shown):
    vendor = AMD if driver in (RADV, AMDVLK, AMD_PRO) else 0x10DE
    assert gpu_name(reported, driver, vendor_id=vendor, integrated=True, cpu_model=cpu).display() == shown


def test_a_discrete_card_ignores_the_apu_string():
    """An APU's string names its iGPU, not a Radeon card beside it."""
    name = gpu_name("RADV PHOENIX", RADV, vendor_id=AMD, integrated=False, cpu_model=CPU_760M)
    assert name.display() == "AMD Radeon 780M / 760M (RADV PHOENIX)"
    assert name.reported == "RADV PHOENIX" and name.driver == "RADV PHOENIX"


def test_pieces():
    assert radv_family("RADV PHOENIX") == "PHOENIX"
    assert radv_family("AMD Radeon 780M (RADV GFX1103_R1)") == "GFX1103_R1"
    assert radv_family("AMD Radeon(TM) 780M Graphics") is None
    assert radv_family("NVIDIA GeForce RTX 4090") is None
    assert apu_graphics_from_cpu("AMD Ryzen 9 8945HS w/ Radeon 780M Graphics") == "AMD Radeon 780M"
    assert apu_graphics_from_cpu("AMD Ryzen 7 8700G w/ Radeon 780M Graphics") == "AMD Radeon 780M"
    assert apu_graphics_from_cpu("Intel(R) Core(TM) Ultra 7 155H") is None
    assert apu_graphics_from_cpu(None) is None


def test_devices_doctor_and_the_app_list_show_the_marketing_name(monkeypatch):
    """`devices`, the GUI's device list (the worker's list_devices) and `doctor` all name a
    Phoenix iGPU under RADV as the user knows it, keeping the driver's own string beside it."""
    from phoenix_chat.app.worker.process import list_devices as app_devices
    from phoenix_chat.engine import devices, doctor, gpu_names
    from phoenix_chat.engine.backends.vulkan import device as vk_device_mod
    from phoenix_chat.engine.errors import DeviceUnavailableError

    try:
        real = vk_device_mod.list_devices()[0]
    except (DeviceUnavailableError, IndexError):
        pytest.skip("no Vulkan device to take the capability fields from")
    radv = dataclasses.replace(
        real, name="RADV PHOENIX", driver_id=RADV, vendor_id=AMD, device_type="integrated", driver="radv Mesa 24.2.8"
    )
    monkeypatch.setattr(vk_device_mod, "list_devices", lambda: [radv])
    monkeypatch.setattr(gpu_names, "cpu_model_name", lambda: CPU_780M)
    entry = devices.vulkan_entries()[0]
    assert entry.name == "AMD Radeon 780M (RADV PHOENIX)"
    assert entry.details["vulkan_name"] == "RADV PHOENIX" and entry.details["driver_id"] == RADV
    assert "AMD Radeon 780M (RADV PHOENIX)" in entry.details["summary"]
    assert any(d["name"] == "AMD Radeon 780M (RADV PHOENIX)" for d in app_devices([entry]))
    rep = {"system": {}, "vulkan": [doctor._device_report(radv, self_test=False)], "npu": {}}
    assert rep["vulkan"][0]["name"] == "AMD Radeon 780M (RADV PHOENIX)"
    md = doctor.markdown(rep)
    assert "### [0] AMD Radeon 780M (RADV PHOENIX) (integrated)" in md.replace(f"[{radv.index}]", "[0]")
    assert "reported as: RADV PHOENIX; driver: radv Mesa 24.2.8 (id 3)" in md
