"""Each bucket's batched step timed at load, both ways where it can run both: the path a batch
of B rows takes is chosen by timing that step itself.

A forward of B tokens (autotune.choose_few_token_path) is timed on the host's clock with every
logit read back; the batched step of B rows is what the scheduler runs. On a freshly started
H100 that forward timing read the 4B's 32-token GEMM path at 29.0 ms (20.5-22.7 on later loads),
within GEMM_MARGIN of the int8 path, so its 32-row step ran every matrix on the int8 multi-column
matvecs: 12.8 ms a step against 7.3 (2,424 against 4,267 tok/s at 32 streams). So where the
device has int8 dot products each bucket's step is recorded two ways — "int8": every matrix on
the int8 multi-column matvec; "mixed": each matrix's own load-time choice (the GEMM tiles where
they beat the matvec) — timed on the GPU's clock after a warm replay, in two rounds (the second
in reverse order), and the faster way is kept for that token count (`tuning.few_token_int8`
gains or loses it, so a forward of B tokens takes the same path). The winners' times also
promote a batch to a bigger bucket (batch.fastest_bucket). A bucket whose step runs on the GEMMs
then tries its products' near-fastest tiles in the whole step (step_tiles.py).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal, TypeAlias

from phoenix_chat.engine.backends.base import SeqStep
from phoenix_chat.engine.backends.vulkan import step_tiles, timing
from phoenix_chat.engine.backends.vulkan.batch import record_batch
from phoenix_chat.engine.backends.vulkan.plan import batch_buckets
from phoenix_chat.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.autotune import Tuning
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList

# "f32": the f32 multi-column matvec (tuning.few_token_matvec), kept where the forward timing
# chose it; it is never a second candidate (slower than int8 wherever int8 exists)
Way: TypeAlias = Literal["int8", "mixed", "f32"]
RUNS = 3  # timed runs of each step after its warm replay (the best counts)


def way_of(tuning: Tuning, T: int) -> Way:
    """How a forward of T tokens runs its matrices now (gemma3_graph.few_token_path's sets)."""
    if T in tuning.few_token_int8:
        return "int8"
    return "f32" if T in tuning.few_token_matvec else "mixed"


def set_way(tuning: Tuning, T: int, way: Way) -> None:
    tuning.few_token_int8 = tuning.few_token_int8 | {T} if way == "int8" else tuning.few_token_int8 - {T}
    tuning.few_token_matvec = tuning.few_token_matvec | {T} if way == "f32" else tuning.few_token_matvec - {T}


def time_batch_steps(
    backend: VulkanBackend, rounds: int = 2, both_ways: bool = True, tiles: bool = True
) -> tuple[dict[int, dict[str, float]], dict[int, step_tiles.Trials | str]]:
    """({bucket: {way: best GPU µs of its whole step}}, {bucket: its tile search, or why none ran})
    for argmax rows at position ~128 of slots 0..B-1; leaves each bucket's tuning at its fastest
    way (and, with `tiles`, a "mixed" bucket's tiles at step_tiles' choice) and that step's
    recording in the backend's cache. both_ways False: each bucket's current way only (a path
    the options forced). The steps write K/V and ids that the slots' owners overwrite: call it
    before any slot holds a sequence."""
    rows = backend.buffers.rows
    assert rows is not None
    backend.batch_step_us = {}  # each batch in its own bucket while timing
    buckets = batch_buckets(backend.plan.batch_rows)
    pos = min(128, backend.context_length - 2)
    backend.wrote_kv(pos + 1)  # slot 0's rings moved (prompt_cache reads the extent)
    greedy = SamplingParams(temperature=0.0)
    steps = {B: [SeqStep(s, backend.config.bos_token_id, pos, greedy) for s in range(B)] for B in buckets}
    lists: dict[tuple[int, Way], CommandList] = {}
    paths: dict[tuple[int, Way], tuple[dict[str, str], dict[str, str]]] = {}  # what each recording's matrices took
    graph = backend.graph

    def record(B: int) -> CommandList:
        _, samplers, penalty = backend.write_sampled_rows(steps[B])  # every row argmax: ("argmax",)
        graph.few_token_paths.pop(B, None)
        graph.few_token_tiles.pop(B, None)
        return record_batch(graph, rows, B, "sample", samplers, penalty)

    def taken(B: int) -> tuple[dict[str, str], dict[str, str]]:
        return graph.few_token_paths.pop(B, {}), graph.few_token_tiles.pop(B, {})

    def time_step(B: int, cl: CommandList, warm_s: float = timing.BUSY_S) -> float:
        """Best GPU µs of RUNS runs after `warm_s` of replays (the GPU kept busy first: timed after
        an idle moment, an H100 read a 4B's 8-row step at 4.4-6.7 ms over three loads against 5.1
        in use)."""

        def rewind() -> None:
            # every run samples and so advances its rows (shaders/sample.comp): set back to
            # `pos`, or hundreds of replays of a small model's step would walk its rows past a
            # short context
            backend.write_sampled_rows(steps[B])

        timing.replay(cl, warm_s, before=rewind)
        best = float("inf")
        for _ in range(RUNS):
            rewind()
            cl.submit(wait=True)
            best = min(best, float(cl.timestamps_ns(2)[1]) / 1e3)
        return best

    for B in buckets:
        first = way_of(backend.tuning, B)
        others: list[Way] = [w for w in ("int8", "mixed") if w != first] if backend.int_dot and both_ways else []
        for way in [first, *others]:
            set_way(backend.tuning, B, way)
            lists[(B, way)] = record(B)
            paths[(B, way)] = taken(B)
    best: dict[tuple[int, Way], float] = {}
    try:
        keys = list(lists)
        for r in range(rounds):
            for i, key in enumerate(keys if r % 2 == 0 else keys[::-1]):
                us = time_step(key[0], lists[key], timing.WARM_S if r == i == 0 else timing.BUSY_S)
                best[key] = min(best.get(key, float("inf")), us)
    except BaseException:
        for cl in lists.values():
            cl.destroy()
        raise
    out: dict[int, dict[str, float]] = {}
    wins: dict[int, Way] = {}
    for B in buckets:
        ways = {w: us for (b, w), us in best.items() if b == B}
        wins[B] = min(ways, key=ways.__getitem__)
        set_way(backend.tuning, B, wins[B])
        out[B] = {w: round(us, 1) for w, us in ways.items()}
        for w in ways:
            if w != wins[B]:
                lists[(B, w)].destroy()
    searched: dict[int, step_tiles.Trials | str] = {}
    kept: dict[int, CommandList] = {}  # bucket -> the recording it keeps
    for B in buckets:
        kept[B] = lists[(B, wins[B])]
        taken_by = {kept[B]: paths[(B, wins[B])]}  # each recording -> what its matrices took
        used = paths[(B, wins[B])][1]
        why = _no_search(backend.tuning, B, wins, tiles)
        if why:
            searched[B] = why
        elif used:

            def record_swap(B: int = B) -> CommandList:
                cl = record(B)
                taken_by[cl] = taken(B)
                return cl

            kept[B], trials = step_tiles.search(
                backend.tuning, B, used, kept[B], best[(B, wins[B])], record_swap, functools.partial(time_step, B)
            )
            out[B][wins[B]] = round(trials.step_us, 1)
            searched[B] = trials
        paths[(B, wins[B])] = taken_by[kept[B]]
    for B in buckets:
        # a bucket running the tiles another bucket's search changed: recorded with them, re-timed
        count = backend.tuning.few_count(B)
        found = searched.get(count or 0)
        if wins[B] == "mixed" and count != B and isinstance(found, step_tiles.Trials) and found.kept:
            kept[B].destroy()
            kept[B] = record(B)
            paths[(B, "mixed")] = taken(B)
            out[B]["mixed"] = round(min(time_step(B, kept[B]), time_step(B, kept[B])), 1)
            searched[B] = f"its tiles are those searched in the {count}-row step (re-timed with them)"
    for B in buckets:
        graph.few_token_paths[B], graph.few_token_tiles[B] = paths[(B, wins[B])]
        _, samplers, penalty = backend.write_sampled_rows(steps[B])
        backend.adopt_batch_recording(B, samplers, penalty, kept[B])
    return out, searched


def _no_search(tuning: Tuning, B: int, wins: dict[int, Way], tiles: bool) -> str:
    """Why bucket B's tiles are not searched in its step (step_tiles.py), or "" where they are."""
    if not tiles:
        return "off (PHOENIX_VULKAN_STEP_TILES=0, or asked so: time_batch_steps(tiles=False))"
    if wins[B] != "mixed":
        return f"the step runs the {wins[B]} multi-column matvecs"
    count = tuning.few_count(B)
    if count != B:
        return f"its tiles are those timed for {count} tokens" if count else "no tile was timed per shape"
    return ""
