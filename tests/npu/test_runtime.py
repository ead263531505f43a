"""The pyxrt call sequence of the runtime, checked against the emulated API, and artifact lookup."""

from __future__ import annotations

import json

import numpy as np
import pytest

from phoenix_chat.npu.errors import NpuRunError
from phoenix_chat.npu.kernels import BUILD_DIR
from phoenix_chat.npu.kernels.spec import DEFAULT_SPECS
from phoenix_chat.npu.runtime import NpuDevice, find_kernels, kernel_search_dirs
from tests.npu.emulator import EmulatedXrt, EmulatorError, write_test_kernel

I8 = DEFAULT_SPECS[0]


def test_exact_call_sequence_for_one_run(artifacts, emu, device):
    art = artifacts[I8.name]
    n_words = art.read_insts().size
    kernel = device.load(art)
    a, b, c = kernel.buffer(0, I8.a_bytes), kernel.buffer(1, I8.b_bytes), kernel.buffer(2, I8.c_bytes)
    rng = np.random.default_rng(0)
    A = rng.integers(-128, 128, (I8.M, I8.K), dtype=np.int8)
    B = rng.integers(-128, 128, (I8.K, I8.N), dtype=np.int8)
    a.write(I8.pack_a(A))
    b.write(I8.pack_b(B))
    kernel.run(a, b, c)
    C = I8.unpack_c(c.read(np.int32))
    assert np.array_equal(C, A.astype(np.int64) @ B.astype(np.int64))
    uuid = emu.log[3][1]
    assert emu.log == [
        ("device", 0),
        ("xclbin", f"{I8.name}.xclbin"),
        ("register_xclbin", f"{I8.name}.xclbin"),  # never load_xclbin on the NPU
        ("hw_context", uuid),
        ("kernel", "MLIR_AIE"),
        ("group_id", 1),
        ("bo", 1, 4 * n_words, "cacheable", 0x101),  # instruction stream
        ("write", 1, 4 * n_words, 0),
        ("sync", 1, "to_device"),
        ("group_id", 3),
        ("bo", 2, I8.M * I8.K, "host_only", 0x103),  # A int8
        ("group_id", 4),
        ("bo", 3, I8.K * I8.N, "host_only", 0x104),  # B int8
        ("group_id", 5),
        ("bo", 4, I8.M * I8.N * 4, "host_only", 0x105),  # C int32
        ("write", 2, I8.a_bytes, 0),
        ("sync", 2, "to_device"),
        ("write", 3, I8.b_bytes, 0),
        ("sync", 3, "to_device"),
        ("run", 3, 1, n_words, 2, 3, 4),  # opcode 3, instr bo, words, a, b, c
        ("wait", "ERT_CMD_STATE_COMPLETED"),
        ("sync", 4, "from_device"),
        ("read", 4, I8.c_bytes, 0),
    ]
    assert device.stats["runs"] == 1
    assert device.stats["bytes_to_device"] == I8.a_bytes + I8.b_bytes
    assert device.stats["bytes_from_device"] == I8.c_bytes


def test_the_emulator_computes_from_device_memory(artifacts, device):
    kernel = device.load(artifacts[I8.name])
    a, b, c = kernel.buffer(0, I8.a_bytes), kernel.buffer(1, I8.b_bytes), kernel.buffer(2, I8.c_bytes)
    a.write(np.ones(I8.a_bytes, np.int8))
    b.bo.write(np.ones(I8.b_bytes, np.int8).view(np.uint8), 0)  # written but never synced
    kernel.run(a, b, c)
    assert not c.read(np.int32).any()  # the device saw zeros
    kernel.run(a, b, c)
    c.bo.write(np.full(I8.c_bytes, 7, np.uint8), 0)  # host copy now differs
    assert c.read(np.int32).sum() == 0  # sync from device wins


def test_unsynced_instruction_stream_is_rejected(artifacts, emu, device):
    kernel = device.load(artifacts[I8.name])
    kernel.instr_bo.write(np.zeros(kernel.n_instr_words * 4, np.uint8), 0)
    kernel.instr_bo.sync(emu.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
    bufs = [kernel.buffer(i, n) for i, n in enumerate((I8.a_bytes, I8.b_bytes, I8.c_bytes))]
    with pytest.raises(EmulatorError, match="instruction"):
        kernel.run(*bufs)


def test_wrong_buffer_contract_is_rejected(artifacts, device):
    kernel = device.load(artifacts[I8.name])
    a, b, c = kernel.buffer(0, I8.a_bytes), kernel.buffer(1, I8.b_bytes), kernel.buffer(2, I8.c_bytes)
    with pytest.raises(EmulatorError, match="group_id\\(3\\)"):
        kernel.run(b, a, c)  # A and B swapped
    small = kernel.buffer(2, I8.c_bytes // 2)
    with pytest.raises(EmulatorError, match="holds"):
        kernel.run(a, b, small)


def test_failed_run_raises(artifacts):
    device = NpuDevice(xrt=EmulatedXrt(fail_runs=True))
    kernel = device.load(artifacts[I8.name])
    bufs = [kernel.buffer(i, n) for i, n in enumerate((I8.a_bytes, I8.b_bytes, I8.c_bytes))]
    with pytest.raises(NpuRunError, match="ERT_CMD_STATE_ERROR"):
        kernel.run(*bufs)
    assert device.stats["runs"] == 0


def test_load_xclbin_is_what_the_npu_refuses(artifacts, emu):
    dev = emu.device(0)
    with pytest.raises(EmulatorError, match="Operation not supported"):
        dev.load_xclbin(emu.xclbin(str(artifacts[I8.name].xclbin)))


def test_kernel_name_must_start_with_mlir_aie(kernel_dir, device):
    manifest = kernel_dir / f"{I8.name}.json"
    data = json.loads(manifest.read_text())
    data["kernel_name"] = "DPU"
    manifest.write_text(json.dumps(data))
    found, _ = find_kernels([kernel_dir], allow_emulator=True)
    with pytest.raises(NpuRunError, match="no MLIR_AIE kernel"):
        device.load(found[I8.name])


def test_busy_fraction(device):
    device.record_run(10.0, 10.25)
    device.record_run(10.5, 10.75)
    assert device.busy_fraction(1.0, now=11.0) == pytest.approx(0.5)
    assert device.busy_fraction(0.5, now=11.0) == pytest.approx(0.5)
    assert device.busy_fraction(1.0, now=20.0) == 0.0


# ------------------------------------------------------------------ artifact lookup
def test_lookup_refuses_emulator_stand_ins_by_default(kernel_dir):
    found, problems = find_kernels([kernel_dir])
    assert not found
    assert all("emulator test stand-in" in p for p in problems) and len(problems) == len(DEFAULT_SPECS)


def test_lookup_reports_each_broken_artifact(tmp_path):
    for spec in DEFAULT_SPECS[:3]:
        write_test_kernel(tmp_path, spec)
    (tmp_path / f"{DEFAULT_SPECS[0].name}.insts.bin").unlink()
    (tmp_path / f"{DEFAULT_SPECS[1].name}.xclbin").write_bytes(b"not an xclbin")
    third = tmp_path / f"{DEFAULT_SPECS[2].name}.xclbin"
    third.write_bytes(third.read_bytes() + b"x")
    (tmp_path / "other.json").write_text('{"unrelated": true}')
    (tmp_path / "broken.json").write_text('{"kind": "phoenix-npu-gemm"}')
    (tmp_path / "no_files.json").write_text(json.dumps({**DEFAULT_SPECS[0].to_json(), "kind": "phoenix-npu-gemm"}))
    found, problems = find_kernels([tmp_path], allow_emulator=True)
    assert not found
    text = "\n".join(problems)
    assert f"missing {DEFAULT_SPECS[0].name}.insts.bin" in text
    assert "not an xclbin (no xclbin2 header)" in text
    assert "changed since the manifest was written" in text
    assert "broken.json: unreadable kernel manifest" in text
    assert "no_files.json: unreadable kernel manifest ('xclbin')" in text
    assert "other.json" not in text


def test_search_order_and_first_folder_wins(tmp_path, monkeypatch):
    first, second, user = tmp_path / "a", tmp_path / "b", tmp_path / "user"
    write_test_kernel(first, I8)
    write_test_kernel(second, I8)
    monkeypatch.setenv("PHOENIX_NPU_KERNELS", str(second))
    dirs = kernel_search_dirs([first], user_dir=user)
    assert dirs == [first, second, user, BUILD_DIR] and BUILD_DIR.parts[-3:] == ("npu", "kernels", "build")
    found, _ = find_kernels(dirs, allow_emulator=True)
    assert found[I8.name].xclbin.parent == first


def test_the_engine_passes_the_users_kernel_folder(monkeypatch):
    from phoenix_chat.engine.backends.npu_hybrid import npu_kernel_dirs
    from phoenix_chat.engine.paths import data_dir

    monkeypatch.delenv("PHOENIX_NPU_KERNELS", raising=False)
    assert kernel_search_dirs() == [BUILD_DIR]  # npu/ knows no per-user folder
    assert npu_kernel_dirs() == [data_dir() / "npu-kernels", BUILD_DIR]


def test_hex_text_instruction_streams(tmp_path):
    write_test_kernel(tmp_path, I8)
    found, _ = find_kernels([tmp_path], allow_emulator=True)
    words = found[I8.name].read_insts()
    txt = tmp_path / "insts.txt"
    txt.write_text("\n".join(f"{w:08x}" for w in words) + "\n")
    from dataclasses import replace

    assert np.array_equal(replace(found[I8.name], insts=txt).read_insts(), words)
