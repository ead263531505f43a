"""Prefix reuse: the conversation in hand keeps its KV cache from one turn to the next.

A chat's next prompt is the previous prompt + the answer + the new message, so all but the new
tokens already have their K/V in the backend's cache. `PromptCache` remembers which token ids one
backend holds at positions 0..n-1 and prefills only the ids after the longest common prefix with
the next prompt; regenerate and edit-and-resend reuse up to the first changed token.

Exactness. Global layers keep every position: any prefix of what they hold can be resumed.
A sliding-window layer keeps a ring of `backend.kv_ring_slots` slots (the window plus one
forward's positions, models/kv_plan.py), position p in slot p % slots, so every write at a
position x evicts x - slots — also the writes a rollback later discards (the previous answer, the
decode steps a GPU ran ahead). Resuming at position p needs the window before p
(p - window + 1 .. p - 1) in the rings. The cache tracks `ring_low`, the lowest position the
rings still hold, from the writes' extent (`Backend.kv_high_water`); when the window before p
starts below it (a rollback longer than the rings' slack: regenerating a long answer, an edit
early in a conversation longer than a ring) the prompt is prefilled from position 0 and the plan
says why (`ReusePlan.note`, logged). Recomputing only the lost window is not exact: a local
layer's K/V at x depends on the layers below at x, which attend to their own window before x, so
the recompute reaches back one window per layer. The trade-off (snapshots of the rings, full-length
local caches) is measured in docs/ARCHITECTURE.md.

One PromptCache per backend, and every generation on that backend goes through it (the worker's
and the terminal chat's do): a forward it does not see makes its record wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.vision.spans import ImageSpan, cache_keys, span_containing

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.base import Backend, CancelCheck
    from phoenix_chat.engine.loader import LoadedModel

log = logging.getLogger("phoenix.engine")


@dataclass(frozen=True)
class ReusePlan:
    """How the next prompt starts: `reused` ids kept from the cache, `computed` ids prefilled."""

    reused: int
    computed: int
    note: str = ""  # why fewer ids than the common prefix are reused ("" when all of it is)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def plan_reuse(
    held: Sequence[int], ring_low: int, ids: Sequence[int], backend: Backend, images: Sequence[ImageSpan] = ()
) -> ReusePlan:
    """Where the prefill of `ids` starts in a cache holding the K/V of `held` at 0..len-1 whose
    sliding-window rings hold positions from `ring_low` on: after the common prefix, if the
    rings still hold the window before that position, else at 0 (with the reason in `note`).
    With pictures `held` is keyed by picture (`cache_keys`), the comparison is too, and the
    start never falls inside a picture (its tokens attend to each other both ways)."""
    if not ids:
        raise ValueError("an empty prompt has nothing to resume")
    cfg = backend.config
    has_rings = any(not cfg.is_global_layer(i) for i in range(cfg.num_layers))
    # the last prompt id always runs: its logits give the first token
    p = min(common_prefix(held, cache_keys(ids, images)), len(ids) - 1)
    inside = span_containing(images, p)
    if inside is not None:
        p = inside.start
    need = max(0, p - cfg.sliding_window + 1)
    if p > 0 and has_rings and ring_low > need:
        note = (
            f"prefix reuse: re-prefilled {len(ids)} tokens from position 0 instead of resuming at {p}: "
            f"the sliding-window layers' rings ({backend.kv_ring_slots} slots) hold positions from "
            f"{ring_low} on, resuming needs them from {need} (a rollback longer than the rings' slack)"
        )
        log.info(note)
        return ReusePlan(0, len(ids), note)
    return ReusePlan(p, len(ids) - p)


class SlotPrefix:
    """What one K/V slot of a many-slot backend holds (engine/scheduler.py), kept by the one
    caller that writes it: `PromptCache`'s record and rule, per slot, with the writes' extent
    told by the caller (`begin`, `wrote`, `fed`) instead of read from the backend."""

    def __init__(self) -> None:
        self.tokens: list[int] = []  # K/V of these ids is in the slot at positions 0..len-1
        self.ring_low = 0  # the slot's sliding-window rings hold positions ring_low..len(tokens)-1
        self._start = 0
        self._high = 0

    def plan(self, ids: Sequence[int], backend: Backend, images: Sequence[ImageSpan] = ()) -> ReusePlan:
        """As `PromptCache.plan`; the slot's record holds pictures keyed by hash (`cache_keys`)."""
        return plan_reuse(self.tokens, self.ring_low, ids, backend, images)

    def begin(self, ids: Sequence[int], start: int) -> None:
        """A prefill of `ids` from position `start` begins: only ids[:start] stay valid."""
        self.tokens = list(ids[:start])
        self._start = self._high = start

    def wrote(self, end: int) -> None:
        """A forward writes K/V up to `end` (exclusive); told before the work, as a pass cut
        short may have written part of it."""
        self._high = max(self._high, end)

    def fed(self, tokens: Sequence[int]) -> None:
        """These ids' K/V is now complete after what the slot held."""
        self.tokens.extend(tokens)

    def end(self, ring_slots: int) -> None:
        """The request is done: the writes from `start` to the high-water mark evicted the
        positions a ring length before them."""
        self.ring_low = max(min(self.ring_low, self._start), self._high - ring_slots, 0)

    def forget(self) -> None:
        self.tokens, self.ring_low = [], 0


class PromptCache:
    """The token ids whose K/V one backend holds, and the rule for resuming from them."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.tokens: list[int] = []  # K/V of these ids is in the cache at positions 0..len-1
        self.ring_low = 0  # the sliding-window rings hold positions ring_low..len(tokens)-1
        self.last: ReusePlan | None = None

    def forget(self) -> None:
        """Treat the cache as empty (the next prompt is prefilled from position 0)."""
        self.tokens, self.ring_low = [], 0

    def plan(self, ids: Sequence[int], images: Sequence[ImageSpan] = ()) -> ReusePlan:
        """Where the prefill of `ids` starts: after the common prefix with the cache, if the
        sliding-window rings still hold the window before that position, else at 0. With
        pictures the comparison is by picture (their placeholders keyed by hash), and never
        resumes inside one (its tokens attend to each other both ways)."""
        self.last = plan_reuse(self.tokens, self.ring_low, ids, self.backend, images)
        return self.last

    def generate(
        self,
        model: LoadedModel,
        ids: Sequence[int],
        params: SamplingParams,
        max_tokens: int,
        plan: ReusePlan,
        cancel: CancelCheck | None = None,
        images: Sequence[ImageSpan] = (),
    ) -> Generator[int, None, None]:
        """`generate_step` from `plan.reused` on; afterwards the cache records the prompt and every
        answer token that was fed back (all yielded ids but the last)."""
        from phoenix_chat.engine.generate import generate_step

        backend = model.backend
        if backend is not self.backend:
            raise ValueError("this PromptCache belongs to another backend")
        start = plan.reused
        keyed = cache_keys(ids, images)
        self.tokens = keyed[:start]  # what stays valid whatever happens below
        backend.kv_high_water = start
        last: int | None = None
        try:
            for token in generate_step(model, ids, params, max_tokens, reuse=start, cancel=cancel, images=images):
                if last is None:
                    self.tokens = keyed  # the prompt is in, its first token sampled
                else:
                    self.tokens.append(last)  # asking for this token fed the previous one
                last = token
                yield token
        finally:
            # every position written from `start` to the high-water mark evicted the one a ring
            # length before it; what lay below `start` and above that stays
            self.ring_low = max(min(self.ring_low, start), backend.kv_high_water - backend.kv_ring_slots, 0)
