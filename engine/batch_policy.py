"""How many of the running sequences one decode step advances.

One pass over the weights for B sequences should cost little more than for one (decode is
bandwidth-bound), but a backend's batched path may not get there: on the H100 the 27B shape's
batched step for 2..8 rows costs more than those rows' single-sequence steps one after another
(docs/PERFORMANCE.md, "Many streams at once"). So the scheduler measures: the wall time of steps
of each row count (a moving average), and a step advances the row count with the best tokens per
second among those measured — all running sequences until measured otherwise, one at a time in
turn where taking turns wins by a clear margin (noise must not flip a choice that batching wins
2-4x, as on lavapipe and the CPU). A sequence's tokens do not depend on the choice.
"""

from __future__ import annotations

MARGIN = 1.25  # a smaller row count must beat the full batch's tokens/s by this factor
SMOOTHING = 0.3  # weight of the newest step in the moving average


class BatchPolicy:
    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}  # rows -> moving average of one step's wall time

    def rows(self, running: int) -> int:
        """Sequences the next step advances, of `running` ready to decode."""
        if running <= 1:
            return running
        if 1 not in self.seconds:
            return 1  # measure a lone step first (it is never wasted: one sequence moves on)
        if running not in self.seconds:
            return running
        full = running / self.seconds[running]
        best, rate = running, full
        for k, t in self.seconds.items():
            if k < running and k / t > rate:
                best, rate = k, k / t
        return best if rate > MARGIN * full else running

    def record(self, rows: int, seconds: float) -> None:
        old = self.seconds.get(rows)
        self.seconds[rows] = seconds if old is None else (1 - SMOOTHING) * old + SMOOTHING * seconds
