"""Is the Phoenix NPU usable here? `npu_status()` checks each piece and says precisely what is missing.

The pieces, in order: the XDNA1 NPU on the PCI bus (AMD 1022:1502) → the `amdxdna` kernel driver
loaded and bound to it (its firmware `amdnpu/1502_00/npu.sbin` loaded) → a `/dev/accel/accel*`
node we may open → `pyxrt` importable (XRT with the XDNA plugin) → built GEMM kernels. The CLI
`devices` command and the GUI Devices menu show the result; nothing here opens the device unless
`probe=True`. Roots are parameters so tests run on fake sysfs/dev trees.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

AMD_VENDOR = 0x1022
PHOENIX_DEVICE = 0x1502  # XDNA1, npu1: Phoenix and Hawk Point
XDNA2_DEVICES = {0x17F0: "XDNA2 (Strix Point / Strix Halo / Krackan Point)"}
FIRMWARE_NAME = "amdnpu/1502_00/npu.sbin"
DRIVER = "amdxdna"


@dataclass
class NpuStatus:
    available: bool
    reason: str  # one line: why not, or what is ready
    details: dict = field(default_factory=dict)  # every check and what it found

    def lines(self) -> list[str]:
        """One line per check, for `phoenix-chat devices`."""
        return [f"  [{'ok' if ok else '--'}] {name}: {msg}" for name, ok, msg in self.details.get("checks", [])]


def npu_status(
    sys_root="/sys",
    dev_root="/dev",
    firmware_roots=("/lib/firmware", "/usr/lib/firmware"),
    import_xrt=None,
    kernel_dirs=None,
    allow_emulator_kernels: bool = False,
    kernel_release: str | None = None,
    probe: bool = False,
) -> NpuStatus:
    """Check every piece the NPU backend needs; `available` only when all are there.

    import_xrt: a callable returning the pyxrt module (default: `import pyxrt`).
    kernel_dirs: where to look for built kernels (default: npu.runtime.kernel_search_dirs(), which
      knows no per-user folder: the engine passes its own list).
    probe: also open device 0 through pyxrt (cheap, but touches the driver).
    """
    sys_root, dev_root = Path(sys_root), Path(dev_root)
    release = kernel_release if kernel_release is not None else platform.release()
    checks: list[tuple[str, bool, str]] = []
    details: dict = {"checks": checks, "kernel_release": release, "name": "AMD XDNA NPU"}

    def done(available: bool, reason: str) -> NpuStatus:
        return NpuStatus(available, reason, details)

    # 1. the NPU on the PCI bus
    npus, others = _pci_npus(sys_root)
    details["pci"] = npus + others
    if not npus:
        if others:
            o = others[0]
            details["name"] = f"AMD {o['kind']} NPU"
            msg = (
                f"found an {o['kind']} NPU ({o['id']}) at {o['address']}; Phoenix Chat's NPU kernels are "
                f"compiled for XDNA1 (npu1, PCI 1022:1502: Ryzen 7040/8040 'Phoenix'/'Hawk Point')"
            )
        else:
            msg = (
                f"no AMD XDNA NPU (PCI 1022:1502) under {sys_root / 'bus/pci/devices'}: this is not a Ryzen AI "
                "Phoenix/Hawk Point machine, or the NPU ('IPU') is disabled in the firmware setup"
            )
        checks.append(("NPU", False, msg))
        return done(False, msg)
    npu = npus[0]
    details["name"] = "AMD XDNA1 NPU (Phoenix, npu1)"
    checks.append(("NPU", True, f"AMD XDNA1 (Phoenix, npu1) at {npu['address']}"))

    # 2. the driver, and through it the firmware
    module = sys_root / "module" / DRIVER
    fw_files = _firmware_files(firmware_roots)
    details["firmware_files"] = [str(p) for p in fw_files]
    details["driver_version"] = _read(module / "version")
    problems: list[str] = []
    if not module.exists():
        msg = (
            f"the {DRIVER} kernel driver is not loaded (Linux {release}; it is part of Linux 6.14 and later, "
            f"or build it from github.com/amd/xdna-driver): try `sudo modprobe {DRIVER}`"
        )
        checks.append(("driver", False, msg))
        problems.append(msg)
    elif npu["driver"] != DRIVER:
        bound = f"bound to {npu['driver']}" if npu["driver"] else "not bound to any driver"
        msg = (
            f"{DRIVER} is loaded but the NPU at {npu['address']} is {bound}: see `sudo dmesg | grep -i xdna` "
            "(usually missing firmware or an IOMMU problem)"
        )
        checks.append(("driver", False, msg))
        problems.append(msg)
    else:
        version = f" {details['driver_version']}" if details["driver_version"] else ""
        checks.append(("driver", True, f"{DRIVER}{version} bound to {npu['address']}"))

    fw_version = _read(Path(npu["path"]) / "fw_version")
    details["firmware_version"] = fw_version
    if fw_files:
        shown = fw_version or "version not exposed in sysfs (`xrt-smi examine` shows it)"
        checks.append(("firmware", True, f"{fw_files[0]} ({shown})"))
    elif npu["driver"] == DRIVER:
        checks.append(("firmware", True, f"loaded by {DRIVER} ({fw_version or 'version not exposed in sysfs'})"))
    else:
        roots = " or ".join(str(r) for r in firmware_roots)
        msg = (
            f"NPU firmware {FIRMWARE_NAME} is missing under {roots}: install a linux-firmware package from "
            "2024 or later (it carries amdnpu/), then reload the driver"
        )
        checks.append(("firmware", False, msg))
        problems.append(msg)

    # 3. the device node
    nodes = sorted((dev_root / "accel").glob("accel*")) if (dev_root / "accel").is_dir() else []
    details["accel_nodes"] = [str(n) for n in nodes]
    if not nodes:
        driver_bound = npu["driver"] == DRIVER
        why = " although amdxdna is bound (check udev)" if driver_bound else f" (it appears once {DRIVER} binds)"
        msg = f"no {dev_root / 'accel' / 'accel*'} device node{why}"
        checks.append(("device node", False, msg))
        problems.append(msg)
    elif not os.access(nodes[0], os.R_OK | os.W_OK):
        msg = (
            f"no permission to open {nodes[0]}: add your user to the group that owns it, usually `render` "
            "(`sudo usermod -aG render $USER`, then log in again)"
        )
        checks.append(("device node", False, msg))
        problems.append(msg)
    else:
        checks.append(("device node", True, str(nodes[0])))

    # 4. pyxrt
    xrt = None
    try:
        xrt = import_xrt() if import_xrt is not None else __import__("pyxrt")
        details["pyxrt"] = getattr(xrt, "__file__", None) or repr(xrt)
        checks.append(("pyxrt", True, f"importable ({details['pyxrt']})"))
    except ImportError as exc:
        msg = (
            f"pyxrt is not importable ({exc}): install XRT built with the XDNA plugin (github.com/amd/xdna-driver;"
            " not PyPI, not Debian's XRT 2.13) and `source /opt/xilinx/xrt/setup.sh` before starting"
        )
        checks.append(("pyxrt", False, msg))
        problems.append(msg)

    # 5. built kernels
    from phoenix_chat.npu.runtime import find_kernels, kernel_search_dirs

    dirs = list(kernel_dirs) if kernel_dirs is not None else kernel_search_dirs()
    found, kernel_problems = find_kernels(dirs, allow_emulator=allow_emulator_kernels)
    details["kernels"] = {n: str(a.xclbin) for n, a in found.items()}
    details["kernel_problems"] = kernel_problems
    if not any(a.spec.dtype_in == "i8" for a in found.values()):
        looked = ", ".join(str(d) for d in dirs)
        extra = f" ({'; '.join(kernel_problems)})" if kernel_problems else ""
        msg = (
            f"no built int8 GEMM kernel (.xclbin + instructions + manifest) in {looked}{extra}: build them with "
            "`python -m npu.kernels.build` where the mlir-aie toolchain is installed (docs/NPU.md), or set "
            "PHOENIX_NPU_KERNELS to a folder of built kernels"
        )
        checks.append(("kernels", False, msg))
        problems.append(msg)
    else:
        checks.append(("kernels", True, ", ".join(sorted(found))))

    if problems:
        return done(False, problems[0])

    if probe:
        try:
            assert xrt is not None  # a failed import is among `problems`, returned above
            xrt.device(0)
            checks.append(("open", True, "pyxrt opened device 0"))
        except Exception as exc:  # noqa: BLE001 — any failure here is the user's answer
            msg = f"pyxrt could not open the NPU ({exc}): is this XRT built with the XDNA plugin?"
            checks.append(("open", False, msg))
            return done(False, msg)

    fw = f", firmware {fw_version}" if fw_version else ""
    return done(True, f"ready: AMD XDNA1 NPU (Phoenix, npu1) at {npu['address']}{fw}, {len(found)} kernel(s)")


XRT_DIR = "/opt/xilinx/xrt"  # where XRT's packages install, with version.json beside setup.sh
COLUMN_LAYOUT = "npu1_4col"  # Phoenix / Hawk Point: 4 usable columns x 4 compute rows (mlir-aie NPU1Col4)


def xrt_version(xrt_dirs=None, pyxrt_path: str | None = None) -> dict:
    """The installed XRT's version from its version.json (BUILD_VERSION, BUILD_BRANCH, VERSION_HASH):
    looked for in `xrt_dirs` (default: $XILINX_XRT, set by XRT's setup.sh, then /opt/xilinx/xrt)
    and two folders above `pyxrt_path` (XRT puts pyxrt in <xrt>/python). {"version": None,
    "looked": [...]} where none is found; nothing is run or opened but those files."""
    dirs = [Path(d) for d in xrt_dirs] if xrt_dirs is not None else []
    if xrt_dirs is None:
        if os.environ.get("XILINX_XRT"):
            dirs.append(Path(os.environ["XILINX_XRT"]))
        dirs.append(Path(XRT_DIR))
    if pyxrt_path:
        dirs.append(Path(pyxrt_path).resolve().parent.parent)
    looked = []
    for d in dict.fromkeys(dirs):
        f = d / "version.json"
        looked.append(str(f))
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("BUILD_VERSION"):
            out = {"version": str(data["BUILD_VERSION"]), "file": str(f)}
            for key, name in (("BUILD_BRANCH", "branch"), ("VERSION_HASH", "hash"), ("BUILD_DATE", "date")):
                if data.get(key):
                    out[name] = str(data[key])
            return out
    return {"version": None, "looked": looked}


def column_layout(kernels: dict | None = None) -> dict:
    """The NPU column layout the runtime uses: the GEMM kernels are compiled for npu1's 4 usable
    columns x 4 compute rows (npu/kernels/spec.py); `kernels` ({name: KernelArtifact}, built ones
    found) adds the target each manifest records."""
    from phoenix_chat.npu.kernels.spec import CORE_COLS, CORE_ROWS

    out: dict = {
        "layout": COLUMN_LAYOUT,
        "columns": CORE_COLS,
        "core_rows": CORE_ROWS,
        "why": "Phoenix/Hawk Point (XDNA1) expose 4 usable columns; every kernel spans all 4 (npu/kernels/spec.py)",
    }
    targets = {n: (a.manifest.get("written_for") or {}).get("target") for n, a in (kernels or {}).items()}
    out["kernel_targets"] = {n: t or "not recorded" for n, t in sorted(targets.items())}
    return out


def _pci_npus(sys_root: Path) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(XDNA1 NPUs, other XDNA NPUs) on the PCI bus, each {address, id, driver, path, kind}."""
    npus: list[dict[str, str]] = []
    others: list[dict[str, str]] = []
    base = sys_root / "bus" / "pci" / "devices"
    if not base.is_dir():
        return npus, others
    for dev in sorted(base.iterdir()):
        try:
            vendor = int(_read(dev / "vendor") or "0", 16)
            device = int(_read(dev / "device") or "0", 16)
        except ValueError:
            continue
        if vendor != AMD_VENDOR or (device != PHOENIX_DEVICE and device not in XDNA2_DEVICES):
            continue
        driver_link = dev / "driver"
        driver = os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else ""
        entry = {
            "address": dev.name,
            "id": f"1022:{device:04x}",
            "driver": driver,
            "path": str(dev),
            "kind": "XDNA1" if device == PHOENIX_DEVICE else XDNA2_DEVICES[device],
        }
        (npus if device == PHOENIX_DEVICE else others).append(entry)
    return npus, others


def _firmware_files(roots) -> list[Path]:
    """Installed NPU firmware: npu.sbin, compressed (.zst/.xz) or versioned (npu.sbin.1.5.2.380)."""
    found = []
    for root in roots:
        folder = Path(root) / Path(FIRMWARE_NAME).parent
        if folder.is_dir():
            found += sorted(p for p in folder.iterdir() if p.name.startswith("npu.sbin"))
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
