"""AMD GPU figures from the amdgpu driver's sysfs files.

For each `card*/device` under the DRM root: `gpu_busy_percent` (an integer 0–100),
`mem_info_vram_used` / `mem_info_vram_total` and `mem_info_gtt_used` / `mem_info_gtt_total`
(bytes). The root is a parameter so tests can point it at a fake tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = "/sys/class/drm"


@dataclass
class AmdGpuReading:
    card: str
    busy: float | None  # 0..1
    vram_used: int | None
    vram_total: int | None
    gtt_used: int | None
    gtt_total: int | None


class AmdGpuSysfs:
    def __init__(self, root: str | Path = DEFAULT_ROOT):
        self.root = Path(root)
        self.device_dir = self._find()

    def _find(self) -> Path | None:
        """The first card whose device folder has amdgpu's busy or memory files."""
        try:
            cards = sorted(
                (p for p in self.root.glob("card*") if re.fullmatch(r"card\d+", p.name)), key=lambda p: int(p.name[4:])
            )
        except OSError:
            return None
        for card in cards:
            dev = card / "device"
            if (dev / "gpu_busy_percent").exists() or (dev / "mem_info_vram_total").exists():
                return dev
        return None

    @property
    def present(self) -> bool:
        return self.device_dir is not None

    def read(self) -> AmdGpuReading | None:
        if self.device_dir is None:
            return None
        dev = self.device_dir
        busy = _read_int(dev / "gpu_busy_percent")
        return AmdGpuReading(
            card=dev.parent.name,
            busy=None if busy is None else busy / 100.0,
            vram_used=_read_int(dev / "mem_info_vram_used"),
            vram_total=_read_int(dev / "mem_info_vram_total"),
            gtt_used=_read_int(dev / "mem_info_gtt_used"),
            gtt_total=_read_int(dev / "mem_info_gtt_total"),
        )


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
