"""The name a user knows their GPU by, from what the Vulkan driver reports.

RADV names AMD GPUs by chip family ("RADV PHOENIX": the Radeon 780M and 760M of Ryzen 7040 /
8040 "Hawk Point" / 8000G, and the Ryzen Z1 Extreme; Mesa before 23.1 said "RADV GFX1103_R1"),
so a user with a "Radeon 780M" does not recognise it. AMD's own drivers (proprietary, AMDVLK)
report the marketing name with trademark marks ("AMD Radeon(TM) 780M Graphics"). One family
holds several products; on an APU the CPU's model string names the one present ("AMD Ryzen 7
7840U w/ Radeon 780M Graphics"), so it is used where it names a Radeon. The display form is
"<marketing name> (<driver>)", e.g. "AMD Radeon 780M (RADV PHOENIX)".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

AMD_VENDOR_ID = 0x1002

# VkDriverId values (VK_DRIVER_ID_*) that name a driver a user may have to tell apart
DRIVER_LABELS = {1: "AMD proprietary", 2: "AMDVLK", 3: "RADV", 4: "NVIDIA", 6: "Intel ANV", 13: "lavapipe"}

# RADV's family name -> the products built on it (what to say when the CPU string does not help)
RADV_FAMILIES = {
    "PHOENIX": "AMD Radeon 780M / 760M",  # Phoenix, Hawk Point, Ryzen Z1 Extreme (RDNA3, gfx1103)
    "GFX1103_R1": "AMD Radeon 780M / 760M",  # the same chip, Mesa < 23.1
    "PHOENIX2": "AMD Radeon 740M",  # Phoenix 2 (Ryzen 5 7545U, 8500G; Ryzen Z1)
    "GFX1103_R2": "AMD Radeon 740M",
    "REMBRANDT": "AMD Radeon 680M / 660M",  # RDNA2, gfx1035
    "YELLOW_CARP": "AMD Radeon 680M / 660M",  # Rembrandt, Mesa < 22.2
    "GFX1150": "AMD Radeon 890M / 880M",  # Strix Point (RDNA3.5)
    "STRIX1": "AMD Radeon 890M / 880M",
    "GFX1151": "AMD Radeon 8060S / 8050S / 8040S",  # Strix Halo
    "STRIX_HALO": "AMD Radeon 8060S / 8050S / 8040S",
}

# "RADV PHOENIX" (Mesa < 23.2) or "<amdgpu.ids name> (RADV PHOENIX)" (later Mesa)
_RADV_NAME = re.compile(r"^(?:(?P<prefix>.+?)\s+\()?RADV (?P<family>[A-Z0-9_]+)\)?$")
_CPU_RADEON = re.compile(r"\bRadeon\s+(\d{3,4}[A-Z]?)\s+Graphics\b", re.I)
_CPU_Z1 = re.compile(r"\bRyzen\s+Z1(\s+Extreme)?\b", re.I)
_MARKS = re.compile(r"\s*\((?:TM|R)\)", re.I)


@dataclass(frozen=True)
class GpuName:
    marketing: str  # "AMD Radeon 780M"; the reported name where nothing better is known
    driver: str  # "RADV PHOENIX", "AMDVLK", "AMD proprietary", ... ("" where nothing to add)
    reported: str  # VkPhysicalDeviceProperties.deviceName, unchanged

    def display(self) -> str:
        return f"{self.marketing} ({self.driver})" if self.driver else self.marketing


def radv_family(device_name: str) -> str | None:
    """ "PHOENIX" from "RADV PHOENIX" (and from newer Mesa's "AMD Radeon Graphics (RADV PHOENIX)")."""
    m = _RADV_NAME.match(device_name.strip())
    return m.group("family") if m else None


def marketing_part(device_name: str) -> str | None:
    """The product name a driver put in its device name, without trademark marks and the
    trailing "Graphics"; None where it is only the generic "AMD Radeon Graphics" or absent."""
    m = _RADV_NAME.match(device_name.strip())
    name = (m.group("prefix") or "") if m else device_name
    name = re.sub(r"\s+Graphics$", "", _MARKS.sub("", name).strip())
    return None if name.upper() in ("", "AMD RADEON", "AMD RADEON GRAPHICS", "AMD UNKNOWN") else name


def apu_graphics_from_cpu(cpu_model: str | None) -> str | None:
    """The iGPU an AMD APU's model string names: "AMD Radeon 780M" from "AMD Ryzen 7 7840U w/
    Radeon 780M Graphics"; the Ryzen Z1 (whose string names no Radeon) by the CPU's name."""
    if not cpu_model or "AMD" not in cpu_model.upper():
        return None
    m = _CPU_RADEON.search(cpu_model)
    if m:
        return f"AMD Radeon {m.group(1).upper()}"
    z1 = _CPU_Z1.search(cpu_model)
    if z1:
        return f"AMD Radeon Graphics (Ryzen Z1{' Extreme' if z1.group(1) else ''})"
    return None


def gpu_name(
    device_name: str, driver_id: int = 0, *, vendor_id: int = 0, integrated: bool = False, cpu_model: str | None = None
) -> GpuName:
    """The marketing name and the driver label for one Vulkan device. `cpu_model` is used only for
    an integrated AMD GPU (an APU's CPU string names its graphics, not a discrete card's)."""
    reported = device_name.strip()
    family = radv_family(reported)
    amd = vendor_id == AMD_VENDOR_ID or family is not None or driver_id in (1, 2)
    from_cpu = apu_graphics_from_cpu(cpu_model) if amd and integrated else None
    named = marketing_part(reported)
    if family is not None:
        return GpuName(from_cpu or named or RADV_FAMILIES.get(family, "AMD Radeon"), f"RADV {family}", reported)
    if driver_id in (1, 2):  # AMD's drivers: the marketing name already, with marks
        return GpuName(from_cpu or named or "AMD Radeon Graphics", DRIVER_LABELS[driver_id], reported)
    return GpuName(reported, "", reported)


def cpu_model_name() -> str | None:
    """/proc/cpuinfo's "model name" (Linux), or None."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None
