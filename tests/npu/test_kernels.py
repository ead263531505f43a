"""The kernel build script and the IRON design's data movement, checked without the toolchain.

The design is run against a recording stand-in of the `aie.iron` API: this checks the plan
(which core gets which tiles, which bytes each shim transfer moves), not that aiecc accepts it.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from phoenix_chat.npu.kernels import build
from phoenix_chat.npu.kernels.gemm_design import build_module, kernel_symbols, object_name
from phoenix_chat.npu.kernels.spec import CORE_COLS, CORE_ROWS, DEFAULT_SPECS


class Rec:
    """Records every IRON call the design makes."""

    def __init__(self):
        self.fifos, self.workers, self.fills, self.drains, self.kernels = [], [], [], [], []


@pytest.fixture
def fake_iron(monkeypatch):
    rec = Rec()

    class Tile:
        def __init__(self, col, row):
            self.col, self.row = col, row

    class Handle:
        def __init__(self, fifo, end):
            self.fifo, self.end = fifo, end

        def forward(self, obj_type=None, name=None, placement=None, dims_to_stream=None):
            f = ObjectFifo(obj_type, name=name)
            f.source, f.placement = self.fifo, placement
            return f

        def join(self, offsets, obj_types, names, depths, placement):
            parts = []
            for off, ty, nm in zip(offsets, obj_types, names):
                f = ObjectFifo(ty, name=nm)
                f.joined_into, f.offset, f.placement = self.fifo, off, placement
                parts.append(f)
            return parts

    class ObjectFifo:
        def __init__(self, obj_type, name=None, default_depth=2, dims_to_stream=None):
            self.obj_type, self.name, self.depth = obj_type, name, default_depth
            rec.fifos.append(self)

        def prod(self):
            return Handle(self, "prod")

        def cons(self):
            return Handle(self, "cons")

    class Kernel:
        def __init__(self, symbol, obj, arg_types):
            rec.kernels.append((symbol, obj, arg_types))

    class Worker:
        def __init__(self, fn, args, placement=None):
            rec.workers.append((fn, args, placement))

    class Runtime:
        def sequence(self, *types_):
            class Ctx:
                def __enter__(self_inner):
                    return ("A", "B", "C")

                def __exit__(self_inner, *exc):
                    return False

            return Ctx()

        def start(self, *workers):
            pass

        def task_group(self):
            return object()

        def finish_task_group(self, tg):
            pass

        def fill(self, handle, buf, tap, task_group=None, placement=None):
            rec.fills.append((handle.fifo, buf, tap, placement))

        def drain(self, handle, buf, tap, wait=False, task_group=None, placement=None):
            rec.drains.append((handle.fifo, buf, tap, placement))

    class Program:
        def __init__(self, dev, rt):
            pass

        def resolve_program(self, placer):
            return "module"

    class TAP:
        def __init__(self, dims, offset, sizes, strides):
            self.dims, self.offset, self.sizes, self.strides = dims, offset, sizes, strides

    mods = {
        "aie": types.ModuleType("aie"),
        "aie.iron": types.ModuleType("aie.iron"),
        "aie.iron.controlflow": types.ModuleType("aie.iron.controlflow"),
        "aie.iron.device": types.ModuleType("aie.iron.device"),
        "aie.iron.placers": types.ModuleType("aie.iron.placers"),
        "aie.helpers": types.ModuleType("aie.helpers"),
        "aie.helpers.taplib": types.ModuleType("aie.helpers.taplib"),
        "ml_dtypes": types.ModuleType("ml_dtypes"),
    }
    it = mods["aie.iron"]
    it.Kernel, it.ObjectFifo, it.Program, it.Runtime, it.Worker = Kernel, ObjectFifo, Program, Runtime, Worker
    mods["aie.iron.controlflow"].range_ = range
    mods["aie.iron.device"].NPU1Col4, mods["aie.iron.device"].Tile = object, Tile
    mods["aie.iron.placers"].SequentialPlacer = object
    mods["aie.helpers.taplib"].TensorAccessPattern = TAP
    mods["ml_dtypes"].bfloat16 = np.uint16
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return rec


def _elements(tap):
    """Flat element indices a tap touches, in order."""
    idx = np.array([tap.offset])
    for size, stride in zip(tap.sizes, tap.strides):
        idx = (idx[:, None] + np.arange(size)[None, :] * stride).reshape(-1)
    return idx


@pytest.mark.parametrize("spec", DEFAULT_SPECS, ids=lambda s: s.name)
def test_design_moves_exactly_the_packed_blocks_each_core_needs(fake_iron, spec):
    assert build_module(spec) == "module"
    rec = fake_iron
    assert len(rec.workers) == CORE_ROWS * CORE_COLS
    assert {(w[2].col, w[2].row) for w in rec.workers} == {(c, r) for c in range(4) for r in range(2, 6)}
    assert [k[0] for k in rec.kernels] == list(kernel_symbols(spec))
    assert all(k[1] == object_name(spec) for k in rec.kernels)

    # every transfer is a short-rowed contiguous run (A's repeated once per output block of a core);
    # together they cover each buffer exactly once
    for taps, total, repeat in (
        ([f for f in rec.fills if f[1] == "A"], spec.M * spec.K, spec.tn),
        ([f for f in rec.fills if f[1] == "B"], spec.K * spec.N, 1),
        (rec.drains, spec.M * spec.N, 1),
    ):
        runs = []
        for t in taps:
            e = _elements(t[2])
            one = e[: e.size // repeat]
            assert np.array_equal(e, np.tile(one, repeat)) and t[2].sizes[0] == repeat
            assert np.array_equal(one, np.arange(one[0], one[0] + one.size))
            assert t[2].sizes[2] <= 1023 and t[3].row == 0
            runs.append(one)
        assert np.array_equal(np.sort(np.concatenate(runs)), np.arange(total))

    # worker (row i, col j) reads the fifo fed by shim i's A run and shim j's B run, writes C part i of col j
    a_fill = {f[0]: f for f in rec.fills if f[1] == "A"}
    b_fill = {f[0]: f for f in rec.fills if f[1] == "B"}
    c_drain = {d[0]: d for d in rec.drains}
    for _fn, args, tile in rec.workers:
        i, j = tile.row - 2, tile.col
        a_src, b_src, c_part = args[0].fifo.source, args[1].fifo.source, args[2].fifo
        assert a_fill[a_src][2].offset == i * spec.m * spec.K  # A packed row block i
        assert b_fill[b_src][2].offset == j * spec.tn * spec.K * spec.n  # B packed blocks j*tn..
        assert c_drain[c_part.joined_into][2].offset == j * spec.tn * spec.M * spec.n
        assert c_part.offset == i * spec.m * spec.n  # row i's tile within column j
        assert c_part.placement.col == j and c_part.placement.row == 1


def test_build_commands_use_the_documented_flags(tmp_path):
    tc = {"aiecc": "aiecc.py", "clang": "clang++", "peano_dir": "/peano", "include": "/inc", "versions": {}}
    spec = DEFAULT_SPECS[1]
    (kernel, _), (emit, _), (aiecc, cwd) = build.commands(spec, tmp_path, tc)
    assert kernel[:4] == ["clang++", "-O2", "-std=c++20", "--target=aie2-none-unknown-elf"]
    assert "-DTILE_K=64" in kernel and kernel[-1] == object_name(spec)
    assert emit[-2:] == [">", str(tmp_path / f"{spec.name}.mlir")]
    assert aiecc[:6] == [
        "aiecc.py",
        "--no-xchesscc",
        "--no-xbridge",
        "--aie-generate-xclbin",
        "--aie-generate-npu-insts",
        "--no-compile-host",
    ]
    assert f"--xclbin-name={spec.name}.xclbin" in aiecc and f"--npu-insts-name={spec.name}.insts.bin" in aiecc
    assert aiecc[-1] == f"{spec.name}.mlir" and cwd == tmp_path


def test_build_without_toolchain_says_what_is_missing(monkeypatch, capsys):
    monkeypatch.delenv("PEANO_INSTALL_DIR", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setitem(sys.modules, "aie", None)
    assert build.main([]) == 2
    err = capsys.readouterr().err
    assert "aiecc.py is not on PATH" in err and "`aie` Python package" in err and "PEANO_INSTALL_DIR" in err
