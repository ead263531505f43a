"""A batched step's few-token tiles searched in the whole step (engine/backends/vulkan/step_tiles.py).

On lavapipe nothing is timed at load, so the per-shape timings are set here, wrong on purpose:
every shape of a tiny model picks the tiled f32 GEMM for 2 and 4 tokens with the CPU device's
own ("lanes", 2-5x faster there) "timed" 5 % slower alone, and the search then records and times
each swap as a whole step on lavapipe's clock. What it keeps must follow from the times it
reports (on lavapipe: the faster GEMM), the step a batch replays must run the tiles kept, and
its logits must be the unsearched step's.
"""

from __future__ import annotations

import numpy as np
import pytest

from phoenix_chat.engine.backends.base import SeqStep
from phoenix_chat.engine.sampling import SamplingParams

CTX = 64
SLOTS = 4  # buckets 2 and 4: each its own timed count


def _ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 4096, n).tolist()


def test_trials_take_near_fastest_tiles_of_the_longest_shapes_first():
    from phoenix_chat.engine.backends.vulkan import step_tiles
    from phoenix_chat.engine.backends.vulkan.autotune import Tuning

    t = Tuning()
    t.gemm_shape_timing_few = {
        8: {
            "down": {"a": 100.0, "b": 110.0, "c": 114.0, "d": 120.0},  # d: outside the margin
            "o": {"a": 30.0, "b": 29.0},  # its pick is "a" below (the step's, not the fastest)
            "qkv": {"a": 50.0},  # no alternative
            "head": {"a": 200.0, "b": 201.0},  # not run on a GEMM tile in this step: not in `used`
        }
    }
    used = {"down": "a", "o": "a", "qkv": "a"}
    assert step_tiles.trials(t, 8, used) == [("down", "b"), ("down", "c"), ("o", "b")]
    assert step_tiles.trials(t, 16, used) == []  # nothing timed at that count
    many = {f"s{i}": {"a": 10.0 + i, "b": 10.0 + i} for i in range(10)}
    t.gemm_shape_timing_few = {8: many}
    picked = step_tiles.trials(t, 8, dict.fromkeys(many, "a"))
    assert picked == [(f"s{i}", "b") for i in range(9, 9 - step_tiles.MAX_TRIALS, -1)]


def test_a_wider_search_is_asked_for_by_setting(monkeypatch):
    """PHOENIX_VULKAN_STEP_SEARCH="<margin>,<trials>" (comparisons) widens both bounds; a malformed
    value is refused by name."""
    from phoenix_chat.engine.backends.vulkan import step_tiles
    from phoenix_chat.engine.backends.vulkan.autotune import Tuning

    t = Tuning()
    t.gemm_shape_timing_few = {
        8: {"down": {"a": 100.0, "b": 110.0, "d": 120.0, "e": 150.0}, "o": {"a": 30.0, "b": 29.0}}
    }
    used = {"down": "a", "o": "a"}
    monkeypatch.setenv("PHOENIX_VULKAN_STEP_SEARCH", "1.25,2")
    assert step_tiles.trials(t, 8, used) == [("down", "b"), ("down", "d")]  # e outside 25 %, o cut by 2
    monkeypatch.setenv("PHOENIX_VULKAN_STEP_SEARCH", "1.6,24")
    assert step_tiles.trials(t, 8, used) == [("down", "b"), ("down", "d"), ("down", "e"), ("o", "b")]
    for bad in ("1.2", "x,3", "0.9,3", "1.2,-1"):
        monkeypatch.setenv("PHOENIX_VULKAN_STEP_SEARCH", bad)
        with pytest.raises(ValueError, match="PHOENIX_VULKAN_STEP_SEARCH"):
            step_tiles.trials(t, 8, used)


def test_why_a_bucket_is_not_searched():
    from phoenix_chat.engine.backends.vulkan.autotune import Tuning
    from phoenix_chat.engine.backends.vulkan.batch_tuning import _no_search

    t = Tuning(gemm_kernels_few={8: {}, 16: {}})
    wins = {2: "int8", 4: "mixed", 8: "mixed", 16: "mixed", 32: "mixed"}
    assert _no_search(t, 8, wins, tiles=False).startswith("off")
    assert "int8 multi-column" in _no_search(t, 2, wins, tiles=True)
    assert _no_search(t, 4, wins, tiles=True) == "its tiles are those timed for 8 tokens"
    assert _no_search(t, 8, wins, tiles=True) == _no_search(t, 16, wins, tiles=True) == ""
    assert _no_search(t, 32, wins, tiles=True) == "its tiles are those timed for 16 tokens"  # the largest
    assert _no_search(Tuning(), 8, wins, tiles=True) == "no tile was timed per shape"


@pytest.fixture(scope="module")
def tiny_gemm(tmp_path_factory, vk_device):
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.weights import open_weights
    from tools.make_synthetic_gguf import write

    path = write(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "tiny", "q4_0", "q8_0", seed=3)
    w = open_weights(path)
    # every product of a batched step on the GEMM (no int8 activations, no f32 multi-column matvec)
    vk = VulkanBackend(w, CTX, VulkanOptions(int_dot=False, few_token_matvec=False), device=vk_device, slots=SLOTS)
    yield vk
    vk.close()
    w.close()


SEARCH_TRIALS = 3  # swaps tried per bucket here (PHOENIX_VULKAN_STEP_SEARCH; the default is 6)


@pytest.fixture
def quick_search(monkeypatch):
    """Half the default trials, one timed run per step: a tiny model's batched step takes ~1.6 s
    on lavapipe's tiled GEMM, and the search's logic is the same at any width."""
    from phoenix_chat.engine.backends.vulkan import batch_tuning, step_tiles

    monkeypatch.setenv("PHOENIX_VULKAN_STEP_SEARCH", f"{step_tiles.MARGIN},{SEARCH_TRIALS}")
    monkeypatch.setattr(batch_tuning, "RUNS", 1)


def _set_timings(vk) -> dict[int, dict[str, str]]:
    """Every shape picks "tiled" at 2 and 4 tokens, "lanes" timed 5 % slower alone."""
    from phoenix_chat.engine.backends.vulkan import step_tiles
    from phoenix_chat.engine.backends.vulkan.gemm_tuning import model_shapes

    shapes = model_shapes(vk.graph, lm_head=True)
    t = vk.tuning
    t.gemm_kernels_few = {T: dict.fromkeys(shapes, "tiled") for T in (2, 4)}
    t.gemm_shape_timing_few = {
        T: {key: {"tiled": 100.0 - i, "lanes": (100.0 - i) * 1.05} for i, key in enumerate(shapes)} for T in (2, 4)
    }
    assert 1.05 < step_tiles.MARGIN
    return {T: dict(picks) for T, picks in t.gemm_kernels_few.items()}


def _batch_steps(vk, B: int) -> list[SeqStep]:
    """B greedy sequences of different lengths, each prefilled in its slot but its last token."""
    params = SamplingParams(temperature=0.0)
    seqs = {s: _ids(40 + s, 9 + s) for s in range(B)}
    for s, ids in seqs.items():
        vk.forward_slot(s, ids[:-1], 0)
    return [SeqStep(s, ids[-1], len(ids) - 1, params) for s, ids in seqs.items()]


def _batch_logits(vk, B: int) -> np.ndarray:
    return vk.decode_batch(_batch_steps(vk, B))


def test_the_search_keeps_the_swaps_its_step_times_say_and_the_batch_runs_them(tiny_gemm, monkeypatch, quick_search):
    from phoenix_chat.engine.backends.vulkan import step_tiles

    vk = tiny_gemm
    saved = (vk.tuning.gemm_kernels_few, vk.tuning.gemm_shape_timing_few)
    try:
        # switched off: each step timed, nothing searched, the picks as they were
        before = _set_timings(vk)
        monkeypatch.setenv("PHOENIX_VULKAN_STEP_TILES", "0")
        vk.time_batch_steps(both_ways=False)
        st = vk.stats()
        assert set(st["batch_step_tiles"]) == {2, 4}
        assert all(why.startswith("off") for why in st["batch_step_tiles"].values())
        assert vk.tuning.gemm_kernels_few == before
        assert set(vk.graph.few_token_tiles[4].values()) == {"tiled"}
        reference = {B: _batch_logits(vk, B) for B in (2, 4)}
        used = {B: set(vk.graph.few_token_tiles[B]) for B in (2, 4)}  # the shapes run on a GEMM tile

        before = _set_timings(vk)
        monkeypatch.delenv("PHOENIX_VULKAN_STEP_TILES")
        vk.time_batch_steps(both_ways=False)
        # the reference's recordings ran the tiles before the search: none survives it
        assert {key[:2] for key in vk._batch_lists} == {(2, "sample"), (4, "sample")}
        assert not vk._recordings
        st = vk.stats()
        for B in (2, 4):
            report = st["batch_step_tiles"][B]
            assert isinstance(report, dict), report
            picks = vk.tuning.gemm_kernels_few[B]
            # each shape's swap to the other GEMM tried, the longest first, at most SEARCH_TRIALS
            tried = list(report["tried"])
            longest_first = [shape for shape in before[B] if shape in used[B]]
            assert len(longest_first) >= 4, used[B]  # q, k, v, o, gate/up, down, the LM head
            assert tried == [f"{shape} -> lanes" for shape in longest_first[:SEARCH_TRIALS]]
            for trial, times in report["tried"].items():
                shape, tile = trial.split(" -> ")
                assert times["us"] > 0 and times["incumbent_us"] > 0
                # kept where its step beat the incumbent's by KEEP (times rounded to 0.1 µs)
                won = times["us"] < step_tiles.KEEP * times["incumbent_us"]
                if abs(times["us"] - step_tiles.KEEP * times["incumbent_us"]) > 0.2:
                    assert (report["kept"].get(shape) == tile) == won, (B, trial, times, report["kept"])
                assert picks[shape] == report["kept"].get(shape, "tiled")
            if vk.dev.caps.is_software:  # "lanes" is lavapipe's own GEMM: every swap to it wins
                assert set(report["kept"].values()) == {"lanes"}, report
            assert report["step_us"] > 0 and st["batch_step_us"][B] == report["step_us"]
            assert report["s"] > 0  # the search's share of the load, in stats
            # the recording a batch of B replays is the search's: its products ran the picks
            assert vk.graph.few_token_tiles[B] == {s: picks[s] for s in vk.graph.few_token_tiles[B]}
            # a greedy sampled batch of B replays the timed recording in its bucket (B, or a
            # bigger one that timed faster), none new
            assert (vk.batch_bucket()[B], "sample", ("argmax",), False, 0) in vk._batch_lists
            recorded = set(vk._batch_lists)
            vk.decode_batch_sampled(_batch_steps(vk, B))
            assert set(vk._batch_lists) == recorded
            logits = _batch_logits(vk, B)
            scale = np.abs(reference[B]).max()
            np.testing.assert_allclose(logits, reference[B], rtol=0, atol=1e-3 * scale)
    finally:
        vk.tuning.gemm_kernels_few, vk.tuning.gemm_shape_timing_few = saved
        vk.drop_recordings()


def test_a_bucket_running_another_counts_tiles_is_re_recorded_with_the_search_result(tiny_gemm, quick_search):
    """Tiles timed for 4 tokens only: bucket 4 searches them, bucket 2 (which runs the 4-token
    tiles) is then recorded and timed again with what the search kept."""
    vk = tiny_gemm
    saved = (vk.tuning.gemm_kernels_few, vk.tuning.gemm_shape_timing_few)
    try:
        _set_timings(vk)
        del vk.tuning.gemm_kernels_few[2], vk.tuning.gemm_shape_timing_few[2]
        vk.time_batch_steps(both_ways=False)
        st = vk.stats()
        search = st["batch_step_tiles"][4]
        assert isinstance(search, dict), search
        picks = vk.tuning.gemm_kernels_few[4]
        assert vk.graph.few_token_tiles[2] == {s: picks[s] for s in vk.graph.few_token_tiles[2]}
        if search["kept"]:
            assert st["batch_step_tiles"][2] == "its tiles are those searched in the 4-row step (re-timed with them)"
            assert st["batch_step_us"][2] > 0
        else:  # nothing changed: bucket 2's step as timed
            assert st["batch_step_tiles"][2] == "its tiles are those timed for 4 tokens"
        if vk.dev.caps.is_software:
            assert search["kept"]  # lavapipe's own GEMM wins every swap (above)
        assert (2, "sample", ("argmax",), False, 0) in vk._batch_lists  # the re-recorded step adopted
    finally:
        vk.tuning.gemm_kernels_few, vk.tuning.gemm_shape_timing_few = saved
        vk.drop_recordings()
