"""BatchPolicy (engine/batch_policy.py): the scheduler batches unless taking turns is measured
to be clearly faster, and measures before it decides."""

from __future__ import annotations

from phoenix_chat.engine.batch_policy import BatchPolicy


def test_measures_a_lone_step_then_the_batch_then_keeps_a_batch_that_pays():
    p = BatchPolicy()
    assert p.rows(1) == 1
    assert p.rows(4) == 1  # no lone step measured yet
    p.record(1, 0.010)
    assert p.rows(4) == 4  # the batch of 4 not measured yet
    p.record(4, 0.012)  # 4 rows in 12 ms: batching pays
    assert p.rows(4) == 4


def test_takes_turns_where_the_batched_step_costs_more_than_its_rows_alone():
    p = BatchPolicy()
    p.record(1, 0.009)
    p.record(2, 0.0316)  # the H100 27B shape: 2 rows batched 31.6 ms, alone 9 ms each
    assert p.rows(2) == 1


def test_noise_does_not_flip_a_close_call():
    p = BatchPolicy()
    p.record(1, 0.010)
    p.record(2, 0.022)  # batching 10% slower than turns: within the margin, keep batching
    assert p.rows(2) == 2
