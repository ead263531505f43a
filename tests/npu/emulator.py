"""An emulator of the compiled GEMM kernels behind a fake `pyxrt` API — for tests only.

`EmulatedXrt()` stands in for the `pyxrt` module (device, xclbin, hw_context, kernel, bo, run,
the sync-direction and command-state enums). Running the kernel executes what the compiled
design computes, in numpy, from the *device-side* copy of each buffer object:

  * int8: A and B are unpacked from the kernel's buffer layout (npu/kernels/spec.py), multiplied
    exactly (int8·int8 products summed in f32/f64 only where every partial sum is an exactly
    representable integer) and wrapped to int32 as the 32-bit accumulators would; C is packed
    back into the kernel layout.
    This is bit-exact with the design's arithmetic.
  * bf16: inputs are bf16 bit patterns, products accumulate in f32. Not bit-exact: the order
    of f32 additions on the AIE differs from numpy's.

Host and device copies of every BO are separate, so a missing `sync` shows up as stale data,
just as on hardware. It checks the argument contract (opcode 3, instruction BO cacheable on
group_id(1) holding the artifact's instruction words, data BOs host_only on group_id(3/4/5) and
large enough) and records every call in `log` for tests. It cannot interpret the instruction
stream itself: the layout comes from the kernel manifest, not from decoding the DMA program.

This is never offered as a device to users: nothing outside tests constructs it.
"""

from __future__ import annotations

import enum
import hashlib
import json
from pathlib import Path

import numpy as np

from phoenix_chat.npu.kernels.spec import GemmSpec
from phoenix_chat.npu.quant import bf16_bits_to_f32


class EmulatorError(RuntimeError):
    """A call the real NPU stack would reject or mis-execute."""


class _SyncDirection(enum.IntEnum):
    XCL_BO_SYNC_BO_TO_DEVICE = 0
    XCL_BO_SYNC_BO_FROM_DEVICE = 1


class _CmdState(enum.IntEnum):
    ERT_CMD_STATE_NEW = 1
    ERT_CMD_STATE_QUEUED = 2
    ERT_CMD_STATE_RUNNING = 3
    ERT_CMD_STATE_COMPLETED = 4
    ERT_CMD_STATE_ERROR = 5
    ERT_CMD_STATE_ABORT = 6
    ERT_CMD_STATE_TIMEOUT = 10


BO_FLAGS = {"normal": 0, "cacheable": 1 << 24, "svm": 1 << 27, "device_only": 1 << 28, "host_only": 1 << 29}


def _group_value(arg: int) -> int:
    # Real values come from the xclbin's connectivity; distinct made-up ones let tests see
    # that the runtime passes group_id(i) for argument i rather than a guessed number.
    return 0x100 + arg


class EmulatedXrt:
    """Use an instance where the `pyxrt` module would go: `NpuDevice(xrt=EmulatedXrt())`."""

    xclBOSyncDirection = _SyncDirection
    ert_cmd_state = _CmdState
    emulated = True  # not a real NPU: the backend accepts emulator_only kernels for it

    def __init__(self, n_devices: int = 1, fail_runs: bool = False):
        self.log: list[tuple] = []
        self.n_devices = n_devices
        self.fail_runs = fail_runs
        self.runs = 0
        emu = self

        class device:  # noqa: N801 — mirrors pyxrt's names
            def __init__(self, index: int):
                if not 0 <= index < emu.n_devices:
                    raise EmulatorError(f"no device {index}")
                self.index, self.registered = index, {}
                emu.log.append(("device", index))

            def register_xclbin(self, xb):
                self.registered[xb.uuid] = xb
                emu.log.append(("register_xclbin", xb.path.name))

            def load_xclbin(self, xb):
                raise EmulatorError("load_xclbin: Operation not supported (the NPU needs register_xclbin)")

        class xclbin:  # noqa: N801
            def __init__(self, path: str):
                self.path = Path(path)
                manifest = self.path.with_suffix(".json")
                if not manifest.is_file():
                    raise EmulatorError(f"{path}: the emulator needs the kernel manifest {manifest.name}")
                self.manifest = json.loads(manifest.read_text())
                self.spec = GemmSpec.from_json(self.manifest)
                self.insts = _read_words(self.path.parent / self.manifest["insts"])
                self.uuid = hashlib.sha256(self.path.read_bytes()).hexdigest()[:32]
                emu.log.append(("xclbin", self.path.name))

            def get_kernels(self):
                return [_XKernel(self.manifest.get("kernel_name", "MLIR_AIE"))]

            def get_uuid(self):
                return self.uuid

        class hw_context:  # noqa: N801
            def __init__(self, dev, uuid):
                if uuid not in dev.registered:
                    raise EmulatorError("hw_context: xclbin not registered on this device")
                self.device, self.xclbin = dev, dev.registered[uuid]
                emu.log.append(("hw_context", uuid))

        class kernel:  # noqa: N801
            def __init__(self, ctx, name: str):
                names = [k.get_name() for k in ctx.xclbin.get_kernels()]
                if name not in names:
                    raise EmulatorError(f"kernel {name!r} not in xclbin ({names})")
                self.ctx, self.name, self.spec = ctx, name, ctx.xclbin.spec
                emu.log.append(("kernel", name))

            def group_id(self, arg: int) -> int:
                emu.log.append(("group_id", arg))
                return _group_value(arg)

            def __call__(self, opcode, instr_bo, n_words, a, b, c):
                emu.log.append(("run", opcode, instr_bo.id, n_words, a.id, b.id, c.id))
                emu._execute(self, opcode, instr_bo, n_words, a, b, c)
                return _Run(emu, _CmdState.ERT_CMD_STATE_ERROR if emu.fail_runs else _CmdState.ERT_CMD_STATE_COMPLETED)

        class bo:  # noqa: N801
            normal, cacheable, svm = BO_FLAGS["normal"], BO_FLAGS["cacheable"], BO_FLAGS["svm"]
            device_only, host_only = BO_FLAGS["device_only"], BO_FLAGS["host_only"]
            _next_id = 0

            def __init__(self, dev, size: int, flags: int, group: int):
                self.size_, self.flags, self.group = int(size), flags, group
                self.host = np.zeros(self.size_, np.uint8)
                self.dev = np.zeros(self.size_, np.uint8)
                bo._next_id += 1
                self.id = bo._next_id
                emu.log.append(("bo", self.id, self.size_, _flag_name(flags), group))

            def size(self):
                return self.size_

            def write(self, data, offset: int):
                raw = np.asarray(data).view(np.uint8).reshape(-1)
                if offset + raw.size > self.size_:
                    raise EmulatorError(f"bo {self.id}: write of {raw.size} bytes at {offset} overflows {self.size_}")
                self.host[offset : offset + raw.size] = raw
                emu.log.append(("write", self.id, raw.size, offset))

            def read(self, size: int, offset: int):
                emu.log.append(("read", self.id, size, offset))
                return self.host[offset : offset + size].view(np.int8).copy()

            def map(self):
                return self.host

            def sync(self, direction, size: int | None = None, offset: int = 0):
                end = self.size_ if size is None else offset + size
                if direction == _SyncDirection.XCL_BO_SYNC_BO_TO_DEVICE:
                    self.dev[offset:end] = self.host[offset:end]
                    emu.log.append(("sync", self.id, "to_device"))
                elif direction == _SyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE:
                    self.host[offset:end] = self.dev[offset:end]
                    emu.log.append(("sync", self.id, "from_device"))
                else:
                    raise EmulatorError(f"bad sync direction {direction!r}")

        self.device, self.xclbin, self.hw_context, self.kernel, self.bo = device, xclbin, hw_context, kernel, bo

    # ------------------------------------------------------------ the kernel's semantics
    def _execute(self, krn, opcode, instr_bo, n_words, a, b, c):
        spec: GemmSpec = krn.spec
        if opcode != 3:
            raise EmulatorError(f"opcode {opcode}: mlir-aie NPU kernels run their instruction stream with opcode 3")
        insts = krn.ctx.xclbin.insts
        if instr_bo.flags != BO_FLAGS["cacheable"] or instr_bo.group != _group_value(1):
            raise EmulatorError("the instruction BO must be cacheable on group_id(1)")
        if (
            n_words != insts.size
            or instr_bo.size_ < insts.nbytes
            or not np.array_equal(instr_bo.dev[: insts.nbytes].view(np.uint32), insts)
        ):
            raise EmulatorError(
                "the device copy of the instruction BO does not hold the kernel's instruction stream"
                " (not written, not synced to the device, or the wrong word count)"
            )
        for arg, buf, need in ((3, a, spec.a_bytes), (4, b, spec.b_bytes), (5, c, spec.c_bytes)):
            if buf.flags != BO_FLAGS["host_only"] or buf.group != _group_value(arg):
                raise EmulatorError(f"data BO for group {arg} must be host_only on group_id({arg})")
            if buf.size_ < need:
                raise EmulatorError(f"BO for group {arg} holds {buf.size_} bytes, the kernel moves {need}")
        self.runs += 1
        A = spec.unpack_a(a.dev[: spec.a_bytes].view(spec.in_dtype))
        B = spec.unpack_b(b.dev[: spec.b_bytes].view(spec.in_dtype))
        C = np.zeros((spec.M, spec.N), spec.out_dtype)
        # Padding rows of A / columns of B are zero and give exact zeros: skip them to save time.
        rows, cols = np.flatnonzero(A.any(axis=1)), np.flatnonzero(B.any(axis=0))
        A, B = A[rows], B[:, cols]
        if spec.dtype_in == "i8":
            # Every partial sum is an integer of magnitude ≤ 128*128*K: exact in f32 while that is
            # ≤ 2**24 (K ≤ 1024), in f64 (≤ 2**53) beyond, whatever order BLAS adds in.
            ftype = np.float32 if 128 * 128 * spec.K <= 2**24 else np.float64
            exact = A.astype(ftype) @ B.astype(ftype)
            C[np.ix_(rows, cols)] = exact.astype(np.int64).astype(np.int32)  # 32-bit accumulators wrap
        else:
            C[np.ix_(rows, cols)] = bf16_bits_to_f32(A) @ bf16_bits_to_f32(B)
        c.dev[: spec.c_bytes] = spec.pack_c(C).view(np.uint8)


class _XKernel:
    def __init__(self, name):
        self._name = name

    def get_name(self):
        return self._name


class _Run:
    def __init__(self, emu, state):
        self.emu, self._state = emu, state

    def wait(self, timeout_ms: int = 0):
        self.emu.log.append(("wait", self._state.name))
        return self._state

    def state(self):
        return self._state


def _flag_name(flags: int) -> str:
    return next((k for k, v in BO_FLAGS.items() if v == flags), hex(flags))


def _read_words(path: Path) -> np.ndarray:
    if path.suffix == ".txt":
        return np.array([int(w, 16) for w in path.read_text().split()], dtype=np.uint32)
    return np.frombuffer(path.read_bytes(), dtype="<u4").astype(np.uint32)


def write_test_kernel(folder, spec: GemmSpec) -> Path:
    """Write a manifest, a stand-in xclbin and instruction stream for `spec` into `folder`.

    For tests with the emulator only: the xclbin holds no design (hardware would reject it) and
    the manifest says `emulator_only`, which the real artifact lookup refuses.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    xclbin = folder / f"{spec.name}.xclbin"
    insts = folder / f"{spec.name}.insts.bin"
    xclbin.write_bytes(b"xclbin2\0" + b"PHOENIX EMULATOR STAND-IN: no hardware design inside\n")
    words = np.array([0x06030100, spec.M, spec.K, spec.N, spec.m, spec.k, spec.n] + list(range(32)), dtype="<u4")
    insts.write_bytes(words.tobytes())
    manifest = {
        **spec.to_json(),
        "kind": "phoenix-npu-gemm",
        "xclbin": xclbin.name,
        "insts": insts.name,
        "kernel_name": "MLIR_AIE",
        "emulator_only": True,
        "xclbin_sha256": hashlib.sha256(xclbin.read_bytes()).hexdigest(),
        "insts_sha256": hashlib.sha256(insts.read_bytes()).hexdigest(),
    }
    (folder / f"{spec.name}.json").write_text(json.dumps(manifest, indent=2))
    return folder
