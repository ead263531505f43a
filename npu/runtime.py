"""A thin wrapper over `pyxrt` for the compiled GEMM kernels, and where their artifacts live.

The call order is the one the NPU needs (DESIGN.md "NPU facts"): device(0) → xclbin →
register_xclbin (not load_xclbin) → hw_context → kernel "MLIR_AIE…" → an instruction BO
(cacheable, group_id(1)) written and synced once → data BOs (host_only, group_id(3/4/5)) →
kernel(3, instr_bo, n_words, a, b, c) → wait → sync from device → read.

`xrt` is the pyxrt module, injected so that tests can pass `tests.npu.emulator` in its place.
Every run is timed, which feeds the NPU utilization gauge (`busy_fraction`).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from phoenix_chat.npu.errors import NpuRunError, NpuUnavailableError
from phoenix_chat.npu.kernels import BUILD_DIR
from phoenix_chat.npu.kernels.spec import GemmSpec

KERNELS_ENV = "PHOENIX_NPU_KERNELS"
RUN_OPCODE = 3  # "execute the instruction stream" in mlir-aie's NPU kernel ABI
INSTR_GROUP = 1
ARG_GROUPS = (3, 4, 5)  # A, B, C
XCLBIN_MAGIC = b"xclbin2\0"


# ---------------------------------------------------------------- artifacts
@dataclass(frozen=True)
class KernelArtifact:
    """A built kernel: `<name>.xclbin`, its instruction stream and the `<name>.json` manifest."""

    spec: GemmSpec
    xclbin: Path
    insts: Path
    manifest: dict = field(default_factory=dict, compare=False)

    def read_insts(self) -> np.ndarray:
        """The instruction stream as uint32 words: binary `.bin` or one hex word per line `.txt`."""
        if self.insts.suffix == ".txt":
            words = [int(line, 16) for line in self.insts.read_text().split() if line.strip()]
            return np.array(words, dtype=np.uint32)
        raw = self.insts.read_bytes()
        if len(raw) % 4:
            raise NpuRunError(f"{self.insts}: instruction stream is {len(raw)} bytes, not whole 32-bit words")
        return np.frombuffer(raw, dtype="<u4").astype(np.uint32)


def kernel_search_dirs(extra=None, user_dir=None) -> list[Path]:
    """Where kernels are looked up, in order: `extra`, $PHOENIX_NPU_KERNELS, `user_dir` (the
    application's per-user kernel folder, which the caller knows), then `npu/kernels/build`
    (what build.py writes)."""
    dirs = [Path(d) for d in (extra or [])]
    if os.environ.get(KERNELS_ENV, "").strip():
        dirs += [Path(p).expanduser() for p in os.environ[KERNELS_ENV].split(os.pathsep) if p]
    if user_dir is not None:
        dirs.append(Path(user_dir))
    dirs.append(BUILD_DIR)
    return dirs


def find_kernels(dirs=None, allow_emulator: bool = False) -> tuple[dict[str, KernelArtifact], list[str]]:
    """Every complete, consistent kernel found: ({name: artifact}, [problems with the others]).

    A kernel is complete when `<name>.json`, `<name>.xclbin` (with the xclbin2 magic) and its
    instruction stream exist and the manifest's sha256 sums match the files. Nothing is invented.
    Stand-ins the emulator's tests write are refused unless `allow_emulator` (tests only).
    """
    found: dict[str, KernelArtifact] = {}
    problems: list[str] = []
    for folder in (Path(d) for d in (dirs if dirs is not None else kernel_search_dirs())):
        if not folder.is_dir():
            continue
        for manifest_path in sorted(folder.glob("*.json")):
            try:
                data = json.loads(manifest_path.read_text())
                if data.get("kind") != "phoenix-npu-gemm":
                    continue
                spec = GemmSpec.from_json(data)
                xclbin, insts = folder / data["xclbin"], folder / data["insts"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                problems.append(f"{manifest_path}: unreadable kernel manifest ({exc})")
                continue
            if data.get("emulator_only") and not allow_emulator:
                problems.append(f"{manifest_path}: an emulator test stand-in, not a built kernel")
                continue
            if spec.name in found:
                continue  # an earlier folder wins
            missing = [p.name for p in (xclbin, insts) if not p.is_file()]
            if missing:
                problems.append(f"{manifest_path}: missing {', '.join(missing)}")
                continue
            with open(xclbin, "rb") as f:
                if f.read(8) != XCLBIN_MAGIC:
                    problems.append(f"{xclbin}: not an xclbin (no xclbin2 header)")
                    continue
            stale = [
                p.name
                for p, key in ((xclbin, "xclbin_sha256"), (insts, "insts_sha256"))
                if data.get(key) and _sha256(p) != data[key]
            ]
            if stale:
                problems.append(f"{manifest_path}: {', '.join(stale)} changed since the manifest was written")
                continue
            found[spec.name] = KernelArtifact(spec, xclbin, insts, data)
    return found, problems


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def import_pyxrt():
    """The real pyxrt module, or NpuUnavailableError saying how to get it."""
    try:
        import pyxrt
    except ImportError as exc:
        raise NpuUnavailableError(
            f"pyxrt is not importable ({exc}): install XRT with the XDNA plugin "
            "(github.com/amd/xdna-driver) and run `source /opt/xilinx/xrt/setup.sh`"
        ) from None
    return pyxrt


# ---------------------------------------------------------------- device and kernels
class NpuDevice:
    """`xrt.device(index)` plus the run log behind the utilization gauge."""

    def __init__(self, xrt=None, index: int = 0, history: int = 4096):
        self.xrt = xrt if xrt is not None else import_pyxrt()
        self.index = index
        self.handle = self.xrt.device(index)
        self._lock = threading.Lock()
        self._runs: deque[tuple[float, float]] = deque(maxlen=history)  # (start, end) perf_counter
        self.stats = {"runs": 0, "busy_s": 0.0, "bytes_to_device": 0, "bytes_from_device": 0, "sync_s": 0.0}

    def record_run(self, start: float, end: float):
        with self._lock:
            self._runs.append((start, end))
            self.stats["runs"] += 1
            self.stats["busy_s"] += end - start

    def busy_fraction(self, window_s: float = 1.0, now: float | None = None) -> float:
        """Fraction of the last `window_s` seconds the NPU spent inside runs (0..1)."""
        now = time.perf_counter() if now is None else now
        lo = now - window_s
        with self._lock:
            busy = sum(max(0.0, min(end, now) - max(start, lo)) for start, end in self._runs if end > lo)
        return min(1.0, busy / window_s)

    def load(self, artifact: KernelArtifact) -> NpuKernel:
        return NpuKernel(self, artifact)


class NpuKernel:
    """One registered xclbin: hardware context, kernel handle and its instruction buffer."""

    def __init__(self, device: NpuDevice, artifact: KernelArtifact):
        xrt, dev = device.xrt, device.handle
        self.device, self.artifact, self.spec = device, artifact, artifact.spec
        self.xclbin = xrt.xclbin(str(artifact.xclbin))
        names = [k.get_name() for k in self.xclbin.get_kernels()]
        aie = [n for n in names if n.startswith("MLIR_AIE")]
        if not aie:
            raise NpuRunError(f"{artifact.xclbin}: no MLIR_AIE kernel inside (has {names or 'none'})")
        dev.register_xclbin(self.xclbin)  # load_xclbin is not supported on the NPU
        self.context = xrt.hw_context(dev, self.xclbin.get_uuid())
        self.kernel = xrt.kernel(self.context, aie[0])
        self.kernel_name = aie[0]

        insts = artifact.read_insts()
        self.n_instr_words = int(insts.size)
        self.instr_bo = xrt.bo(dev, insts.nbytes, xrt.bo.cacheable, self.kernel.group_id(INSTR_GROUP))
        self.instr_bo.write(insts.view(np.uint8), 0)
        self.instr_bo.sync(xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)

    def buffer(self, arg: int, nbytes: int) -> NpuBuffer:
        """A host_only data BO for argument 0 (A), 1 (B) or 2 (C)."""
        return NpuBuffer(self, arg, nbytes)

    def run(self, a: NpuBuffer, b: NpuBuffer, c: NpuBuffer) -> float:
        """One call of the kernel on BOs already synced to the device; blocks, returns seconds."""
        xrt = self.device.xrt
        start = time.perf_counter()
        handle = self.kernel(RUN_OPCODE, self.instr_bo, self.n_instr_words, a.bo, b.bo, c.bo)
        state = handle.wait()  # the form mlir-aie's own python/utils/xrt.py uses
        end = time.perf_counter()
        if state != xrt.ert_cmd_state.ERT_CMD_STATE_COMPLETED:
            name = getattr(state, "name", state)
            raise NpuRunError(f"NPU kernel {self.spec.name} ended in state {name}, not COMPLETED")
        self.device.record_run(start, end)
        return end - start


class NpuBuffer:
    """A data BO on the group id the kernel expects for its argument."""

    def __init__(self, kernel: NpuKernel, arg: int, nbytes: int):
        xrt = kernel.device.xrt
        self.kernel, self.arg, self.nbytes = kernel, arg, int(nbytes)
        self.group = ARG_GROUPS[arg]
        self.bo = xrt.bo(kernel.device.handle, self.nbytes, xrt.bo.host_only, kernel.kernel.group_id(self.group))

    def write(self, data: np.ndarray):
        """Copy `data` in and sync it to the device."""
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if raw.size != self.nbytes:
            raise ValueError(f"writing {raw.size} bytes into a {self.nbytes}-byte buffer")
        dev, xrt = self.kernel.device, self.kernel.device.xrt
        t = time.perf_counter()
        self.bo.write(raw, 0)
        self.bo.sync(xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
        dev.stats["sync_s"] += time.perf_counter() - t
        dev.stats["bytes_to_device"] += raw.size

    def read(self, dtype) -> np.ndarray:
        """Sync from the device and return the contents as a flat array of `dtype`."""
        dev, xrt = self.kernel.device, self.kernel.device.xrt
        t = time.perf_counter()
        self.bo.sync(xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE)
        raw = np.asarray(self.bo.read(self.nbytes, 0)).view(np.uint8).reshape(-1).copy()
        dev.stats["sync_s"] += time.perf_counter() - t
        dev.stats["bytes_from_device"] += self.nbytes
        return raw.view(dtype)
