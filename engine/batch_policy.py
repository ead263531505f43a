"""How many of the running sequences one decode step advances.

One pass over the weights for B sequences should cost little more than for one (decode is
bandwidth-bound), but a backend's batched path may not get there: on the H100 the 27B shape's
batched step for 2..8 rows costs more than those rows' single-sequence steps one after another
(docs/PERFORMANCE.md, "Many streams at once"). So the scheduler measures: the wall time of steps
of each row count (a moving average), and a step advances the row count with the best tokens per
second among those measured — all running sequences until measured otherwise, one at a time in
turn where taking turns wins by a clear margin (noise must not flip a choice that batching wins
2-4x, as on lavapipe and the CPU). The first step of each row count is a warm-up and not
measured, and while taking turns the full batch is timed again every REMEASURE steps, so one
slow step cannot keep batching off. A sequence's tokens do not depend on the choice.
"""

from __future__ import annotations

MARGIN = 1.25  # a smaller row count must beat the full batch's tokens/s by this factor
SMOOTHING = 0.3  # weight of the newest step in the moving average
REMEASURE = 32  # while taking turns, every this many steps the full batch is timed again


class BatchPolicy:
    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}  # rows -> moving average of one step's wall time
        self.warmed: set[int] = set()  # row counts whose first (warm-up) step has been seen
        self._turn_steps = 0  # steps taken in turns since the full batch was last timed

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
        if rate <= MARGIN * full:
            return running
        self._turn_steps += 1
        if self._turn_steps >= REMEASURE:  # a stale figure must not keep the batch off for good
            self._turn_steps = 0
            return running
        return best

    def record(self, rows: int, seconds: float) -> None:
        """A step of `rows` rows took `seconds`. The first step of each row count is a warm-up,
        not a measurement: it may record that count's command buffers or compile pipelines (on
        an H100 such a first 4-row step took tens of times a later one, and once averaged in it
        kept a 4B model taking turns at 0.8x a single stream's tokens/s instead of batching)."""
        if rows not in self.warmed:
            self.warmed.add(rows)
            return
        old = self.seconds.get(rows)
        self.seconds[rows] = seconds if old is None else (1 - SMOOTHING) * old + SMOOTHING * seconds
