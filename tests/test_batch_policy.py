"""BatchPolicy (engine/batch_policy.py): the scheduler batches unless taking turns is measured
to be clearly faster, and measures before it decides."""

from __future__ import annotations

from phoenix_chat.engine.batch_policy import REMEASURE, BatchPolicy


def measured(p: BatchPolicy, rows: int, seconds: float) -> None:
    """A warm-up step, then a measured one."""
    p.record(rows, 1.0)
    p.record(rows, seconds)


def test_measures_a_lone_step_then_the_batch_then_keeps_a_batch_that_pays():
    p = BatchPolicy()
    assert p.rows(1) == 1
    assert p.rows(4) == 1  # no lone step measured yet
    p.record(1, 0.5)  # the first lone step: a warm-up, not a measurement
    assert p.rows(4) == 1
    p.record(1, 0.010)
    assert p.rows(4) == 4  # the batch of 4 not measured yet
    p.record(4, 0.012)  # 4 rows in 12 ms: batching pays
    assert p.rows(4) == 4


def test_takes_turns_where_the_batched_step_costs_more_than_its_rows_alone():
    p = BatchPolicy()
    measured(p, 1, 0.009)
    measured(p, 2, 0.0316)  # the H100 27B shape: 2 rows batched 31.6 ms, alone 9 ms each
    assert p.rows(2) == 1


def test_noise_does_not_flip_a_close_call():
    p = BatchPolicy()
    measured(p, 1, 0.010)
    measured(p, 2, 0.022)  # batching 10% slower than turns: within the margin, keep batching
    assert p.rows(2) == 2


def test_a_slow_first_batched_step_does_not_turn_batching_off():
    # seen on an H100 (4B, 4 streams): the first 4-row step recorded its command buffers and
    # took ~100x a later one; averaged in, it made the scheduler take turns for good
    p = BatchPolicy()
    measured(p, 1, 0.0026)
    assert p.rows(4) == 4
    p.record(4, 0.300)  # the warm-up step
    assert p.rows(4) == 4  # still batching: that step was not a measurement
    p.record(4, 0.004)
    assert p.rows(4) == 4


def test_while_taking_turns_the_full_batch_is_timed_again():
    p = BatchPolicy()
    measured(p, 1, 0.009)
    measured(p, 4, 0.060)  # batching measured slower than turns (a stall, or a slow backend)
    picks = [p.rows(4) for _ in range(REMEASURE)]
    assert picks[:-1] == [1] * (REMEASURE - 1) and picks[-1] == 4  # the batch is tried again
    for _ in range(10):  # ... and now it is fast: the average moves and batching comes back
        p.record(4, 0.010)
    assert p.rows(4) == 4
