"""The load-time timing kept on disk (tuning_record.py): a later load of the same model on the same
device reads the choices instead of timing them, runs what the record says, and never reads a
record written for anything else.

On lavapipe the load times only where `autotune=True` forces it (matvec shapes, the decode
fusions): that is the path a GPU load takes, on a tiny synthetic model. The GPU-only parts of a
record (GEMM tiles, batched steps and their tile search) go through the same reader and writer in
the round-trip test.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from phoenix_chat.engine.backends.vulkan import tuning_record
from phoenix_chat.engine.backends.vulkan.autotune import MatvecChoice, Tuning
from phoenix_chat.engine.backends.vulkan.profiling import profile_step
from phoenix_chat.engine.backends.vulkan.step_tiles import Trials

CTX = 64


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh cache for each test: records of other tests are never seen."""
    monkeypatch.setenv("PHOENIX_CHAT_HOME", str(tmp_path))
    return tmp_path


def _load(weights, vk_device, record: str | None = "use", ctx: int = CTX, progress=None):
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    options = VulkanOptions(autotune=True, tuning_record=record)
    return VulkanBackend(weights, ctx, options, device=vk_device, progress=progress)


def _info(weights, vk_device, **kw) -> dict:
    """Load, and what stats() say of the record (the backend closed again)."""
    be = _load(weights, vk_device, **kw)
    try:
        return be.stats()["tuning_record"]
    finally:
        be.close()


def _every_field_set() -> Tuning:
    """A Tuning with every field away from its default, in the shapes the timing leaves."""
    spec = {"WG": 8, "ROWS": 4, "THREAD_ROWS": 1, "SUBGROUP_ROWS": 0}
    return Tuning(
        matvec={"qkv": MatvecChoice(12.5, "regs", spec), "lm": MatvecChoice(80.0, True, None)},
        norm_tail={"o": True, "down": False},
        geglu_q8_1=(True, spec),
        geglu_q8_1_timing={"fused_us": 40.1, "separate_us": 44.0},
        qkv_rope=("regs", spec),
        qkv_rope_timing={"fused_us": 20.0, "qkv_and_rope_us": 23.5},
        prologue_groups=128,
        prologue_spec={"WG": 1024},
        prologue_down=False,
        prologue_timing={"off": 8000.0, "128": 7900.0},
        prologue_note="a note",
        few_token_matvec=frozenset({2, 3}),
        few_token_int8=frozenset({4, 8, 32}),
        cols_specs={"geglu": {8: {"ROWS": 2, "NCOLS": 8}, 32: {"ROWS": 1, "NCOLS": 16}}},
        cols_timing={"geglu": {8: {"r2t8": 90.0}}},
        few_token_timing={8: {"matvec_ms": 1.5, "gemm_ms": 1.2}},
        gemm_kernel="coopmat_p",
        gemm_timing={"coopmat_p": 3.0, "tiled": 9.0},
        gemm_kernel_few="cmw1_4",
        gemm_few_timing={"cmw1_4": 0.9},
        gemm_kernels_few={8: {"27b_down": "cmw1_4_k4"}, 32: {"27b_down": "cmw2_8_k8"}},
        gemm_shape_timing_few={8: {"27b_down": {"cmw1_4_k4": 67.0, "cmw1_4": 109.0}}},
        gemm_kernels={"27b_down": "cpd3_16"},
        gemm_shape_timing={"27b_down": {"cpd3_16": 934.0}},
        gemm_kernels_note="a note",
    )


def test_every_field_of_a_record_reads_back_as_written(tmp_path):
    t = _every_field_set()
    unset = [f.name for f in dataclasses.fields(Tuning) if getattr(t, f.name) == getattr(Tuning(), f.name)]
    assert not unset, f"the sample leaves {unset} at their defaults: they would not be checked"
    record = tuning_record.Record(
        tuning=t,
        batch_step_ways={8: {"int8": 17000.0, "mixed": 16000.5}, 16: {"mixed": 17100.0}},
        batch_step_tiles={8: "the int8 way won", 16: Trials(17107.0, 1.25, {"o -> cmw1_4_k4": {"a": 1.0}}, {"o": "x"})},
        batch_step_note="",
        seconds=48.25,
        saved="2026-11-29T00:00:00Z",
    )
    fields = {"device": {"name": "a GPU"}, "n": 1}
    path = tmp_path / "r.json"
    tuning_record.write(path, fields, record)
    assert tuning_record.read(path, fields) == record
    assert not list(tmp_path.glob("*.tmp")), "the temporary file is renamed into place"


def test_a_tuning_field_without_a_json_form_is_refused():
    @dataclasses.dataclass
    class Wider(Tuning):
        new_choice: int = 0

    with pytest.raises(TypeError, match="new_choice"):
        tuning_record.encode(Wider())


def test_a_second_load_runs_the_record_without_timing(open_tiny, vk_device, home):
    from phoenix_chat.engine.backends.cpu import CpuBackend

    w = open_tiny()
    said: list[str] = []
    first = _load(w, vk_device, progress=lambda f, msg: said.append(msg))
    try:
        assert said[-1] == "timing the kernels on this GPU (once: kept for later loads)", said
        info = first.stats()["tuning_record"]
        assert info["source"] == "timed" and info["mode"] == "use" and info["timed_s"] > 0, info
        path = Path(info["path"])
        assert path.parent == home / "cache" / "tuning" and path.is_file()
        timed = first.stats()["matvec_tuning"]
        # the record edited to other valid choices: rope and the norm_adds as their own dispatches
        body = json.loads(path.read_text())
        body["tuning"]["qkv_rope"] = None
        body["tuning"]["norm_tail"] = {"o": False, "down": False}
        path.write_text(json.dumps(body))
        first.tuning.qkv_rope, first.tuning.norm_tail = None, {"o": False, "down": False}
        first.drop_recordings()
        edited_dispatches = profile_step(first)["dispatches"]
    finally:
        first.close()

    said.clear()
    second = _load(w, vk_device, progress=lambda f, msg: said.append(msg))
    try:
        assert said[-1] == f"kernel choices timed on this GPU on {body['saved']}", said
        info2 = second.stats()["tuning_record"]
        assert info2 == {**info, "source": "record", "saved": body["saved"], "timed_s": body["seconds"]}, info2
        # the timings are the first load's to the digit: read, not timed again
        assert second.stats()["matvec_tuning"] == {
            k: {**v, **({"norm_tail": False} if k in ("o", "down") else {})} for k, v in timed.items()
        }
        assert second.tuning.qkv_rope is None and second.tuning.norm_tail == {"o": False, "down": False}
        # and the step runs the record's choices, with the reference's logits
        assert profile_step(second)["dispatches"] == edited_dispatches
        ids = [5, 17, 300, 4000, 12, 99]
        cpu = CpuBackend(w, CTX)
        ref = cpu.forward(ids, 0, all_logits=True)
        got = np.stack([second.forward([t], i) for i, t in enumerate(ids)])
        assert np.abs(ref - got).max() < 2e-2 * np.abs(ref).max()
    finally:
        second.close()


def test_a_record_for_another_load_is_never_read(open_tiny, vk_device, home):
    w = open_tiny()
    path_a = Path(_info(w, vk_device)["path"])
    # another context length: another key, another file, timed
    info_b = _info(w, vk_device, ctx=2 * CTX)
    assert info_b["source"] == "timed" and Path(info_b["path"]) != path_a
    # a PHOENIX_VULKAN_* setting changes the key too
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PHOENIX_VULKAN_FEW_TILE_COUNTS", "32")
        info_c = _info(w, vk_device)
    assert info_c["source"] == "timed" and Path(info_c["path"]) not in (path_a, Path(info_b["path"]))
    # A's record put where B's belongs: its key says so, and B is timed again and rewritten
    Path(info_b["path"]).write_text(path_a.read_text())
    info_d = _info(w, vk_device, ctx=2 * CTX)
    assert info_d["source"] == "timed" and "written for another" in info_d["not_read"], info_d
    assert json.loads(Path(info_b["path"]).read_text())["key"]["plan"]["context_length"] == 2 * CTX


def test_an_unreadable_record_is_timed_again_and_rewritten(open_tiny, vk_device, home):
    w = open_tiny()
    path = Path(_info(w, vk_device)["path"])
    good = json.loads(path.read_text())
    unknown_kernel = json.loads(json.dumps(good))
    unknown_kernel["tuning"]["gemm_kernel_few"] = "no_such_tile"
    unknown_path = json.loads(json.dumps(good))
    unknown_path["tuning"]["matvec"]["o"][1] = "int4"
    for junk, why in (
        (b"\x00\xff not json", "unreadable"),
        (b'{"key": 1}', "written for another"),
        (json.dumps({**good, "tuning": {}}).encode(), "does not read back"),
        (json.dumps(unknown_kernel).encode(), "kernels this engine does not have: ['no_such_tile']"),
        (json.dumps(unknown_path).encode(), "a matvec path other than"),
    ):
        path.write_bytes(junk)
        info = _info(w, vk_device)
        assert info["source"] == "timed" and info["not_read"].startswith(str(path)) and why in info["not_read"], info
        assert json.loads(path.read_text())["tuning"]["matvec"]["o"][1] in (True, False, "regs"), "rewritten whole"
    c = _load(w, vk_device)
    assert c.stats()["tuning_record"]["source"] == "record"
    c.close()


def test_refresh_times_afresh_and_off_keeps_nothing(open_tiny, vk_device, home):
    w = open_tiny()
    path = Path(_info(w, vk_device)["path"])
    marked = json.loads(path.read_text())
    marked["seconds"] = -1.0  # a mark the rewrite must replace
    path.write_text(json.dumps(marked))
    info = _info(w, vk_device, record="refresh")
    assert info["source"] == "timed" and info["mode"] == "refresh" and Path(info["path"]) == path
    assert json.loads(path.read_text())["seconds"] == info["timed_s"] > 0
    path.unlink()
    info = _info(w, vk_device, record="off")
    assert info == {"mode": "off", "source": "timed", "timed_s": info["timed_s"]} and not path.exists()
    # PHOENIX_VULKAN_TUNING_RECORD=0 (the test session's default) is "off" too
    d = _load(w, vk_device, record=None)
    assert d.stats()["tuning_record"]["mode"] == "off"
    d.close()


def test_a_load_that_times_nothing_keeps_no_record(open_tiny, vk_device, home):
    """lavapipe without autotune keeps the defaults: nothing to keep, and stats say so."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    be = VulkanBackend(open_tiny(), CTX, VulkanOptions(tuning_record="use"), device=vk_device)
    try:
        info = be.stats()["tuning_record"]
        assert info["mode"] == "off" and info["source"] == "defaults" and "path" not in info
    finally:
        be.close()
    assert not (home / "cache" / "tuning").exists()


def test_an_unwritable_cache_is_said_and_the_load_goes_on(open_tiny, vk_device, home):
    (home / "cache").write_text("a file where the cache folder would be")
    be = _load(open_tiny(), vk_device)
    try:
        info = be.stats()["tuning_record"]
        assert info["source"] == "timed" and "path" not in info and "not_written" in info, info
    finally:
        be.close()


def test_a_bad_mode_is_refused():
    from phoenix_chat.engine.backends.vulkan.backend import VulkanOptions

    with pytest.raises(ValueError, match="tuning_record"):
        VulkanOptions(tuning_record="always")  # type: ignore[arg-type]


def test_the_folder_keeps_the_records_loads_last_used(open_tiny, vk_device, home):
    """Every engine or driver update keys new records: a write prunes the folder to the KEEP most
    recently used, and a load that reads a record marks it used, so it outlives older ones."""
    w = open_tiny()
    path_a = Path(_info(w, vk_device)["path"])
    folder = path_a.parent
    hour_ago = path_a.stat().st_mtime - 3600
    os.utime(path_a, (hour_ago, hour_ago))
    old = [folder / f"old-{i:02d}.json" for i in range(tuning_record.KEEP)]
    for i, p in enumerate(old):  # all used after A, the least recently first in the list
        p.write_text("{}")
        os.utime(p, (hour_ago + 10 + i, hour_ago + 10 + i))
    assert _info(w, vk_device)["source"] == "record"  # A read: now the newest
    info_b = _info(w, vk_device, ctx=2 * CTX)  # B written: the folder pruned to KEEP
    left = set(folder.glob("*.json"))
    assert len(left) == tuning_record.KEEP and {path_a, Path(info_b["path"])} <= left
    assert left - {path_a, Path(info_b["path"])} == set(old[2:])  # the two least recently used went
