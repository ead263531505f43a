"""Speculative decoding: a small draft model proposes tokens, the target checks them in one pass.

Why: one decode token of a big model reads every weight once (27B Q4_0 on a 780M: ~200 ms,
bound by memory bandwidth), and a forward pass over k + 1 tokens reads them once too. A draft
that shares the tokenizer (Gemma 3 270M or 1B for 4B/12B/27B) guesses k tokens cheaply; the
target scores them all at once and keeps the longest prefix it agrees with, plus one token of
its own — so every round yields at least one token and, with good guesses, several.

Exact: greedy output is the target's own greedy output token for token; with sampling, a
proposal d drawn from the draft's distribution q is kept with probability min(1, p(d) / q(d))
and a rejection is replaced by a draw from max(0, p - q) renormalised, which leaves the output
distributed exactly as the target's p (Leviathan et al. 2023, Chen et al. 2023). p and q are
the distributions the CPU sampler would draw from (penalty, temperature, top-k/top-p/min-p).

Rolling back the rejected tail needs nothing: a backend forgets positions at and beyond the
start of its next forward (`Backend.forward`), and the caches' local rings keep enough slack
(`MAX_DRAFT_TOKENS`).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from phoenix_chat.engine.errors import ContextFull, PhoenixError
from phoenix_chat.engine.sampling import SamplingParams, candidates

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.base import CancelCheck
    from phoenix_chat.engine.config import ModelConfig
    from phoenix_chat.engine.loader import LoadedModel
    from phoenix_chat.engine.tokenizer import Tokenizer

MAX_DRAFT_TOKENS = 16  # a verify pass (draft + 1) fits one forward chunk, so rings hold it (models/kv_plan.py)


@dataclass
class SpeculativeStats:
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens each target pass yielded (accepted proposals + its own token)."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0


def check_draft(target: LoadedModel, draft: LoadedModel) -> None:
    """The draft must speak the target's vocabulary, or its guesses mean nothing."""
    _check_tokenizer(target, draft.path, draft.tokenizer)


def check_draft_file(target: LoadedModel, path: str | os.PathLike[str]) -> ModelConfig:
    """`check_draft` before loading anything: the file's tokenizer must be the target's, and the
    file must hold fewer parameters (a draft as big as the target cannot make it faster). Reads
    only the metadata (a second or two for a 262k-token vocabulary); returns the draft's config."""
    from phoenix_chat.engine.weights import open_weights

    weights = open_weights(path)
    try:
        tokenizer, config = weights.tokenizer(), weights.config
    finally:
        weights.close()
    size = config.parameter_count()
    _check_tokenizer(target, Path(path), tokenizer)
    target_size = target.config.parameter_count()
    if size >= target_size:
        raise PhoenixError(
            f"draft model {Path(path).name} ({size / 1e6:,.0f}M parameters) is not smaller than "
            f"{target.path.name} ({target_size / 1e6:,.0f}M): it cannot make it faster"
        )
    return config


def _check_tokenizer(target: LoadedModel, draft_path: Path, tokenizer: Tokenizer) -> None:
    if target.tokenizer != tokenizer:
        raise PhoenixError(
            f"draft model {draft_path.name} does not share the tokenizer of {target.path.name} "
            f"({tokenizer.vocab_size} vs {target.tokenizer.vocab_size} tokens): "
            "use a model of the same family (Gemma 3 270M / 1B for Gemma 3 4B–27B)"
        )


class Distribution:
    """The sampler's distribution for one position: greedy as a point mass, else the filtered
    candidates and their probabilities."""

    def __init__(self, logits: npt.NDArray[np.float32], history: Sequence[int], params: SamplingParams) -> None:
        self.vocab = len(logits)
        self.ids, self.probs = candidates(logits, history, params)

    def prob(self, token: int) -> float:
        hit = np.nonzero(self.ids == token)[0]
        return float(self.probs[hit[0]]) if len(hit) else 0.0

    def dense(self) -> npt.NDArray[np.float64]:
        out = np.zeros(self.vocab)
        out[self.ids] = self.probs
        return out

    def draw(self, rng: np.random.Generator) -> int:
        return int(self.ids[0]) if len(self.ids) == 1 else int(self.ids[rng.choice(len(self.ids), p=self.probs)])


def accept_or_resample(p: Distribution, q: Distribution, proposal: int, rng: np.random.Generator) -> tuple[bool, int]:
    """(kept, token): keep `proposal` (drawn from q) with probability min(1, p/q), else draw the
    replacement from the residual max(0, p - q). For point masses this is "keep if equal"."""
    pp, qp = p.prob(proposal), q.prob(proposal)
    if qp > 0 and rng.random() * qp < pp:
        return True, proposal
    residual = np.maximum(0.0, p.dense() - q.dense())
    total = residual.sum()
    if total <= 0:  # p == q: a rejection had probability zero
        return False, p.draw(rng)
    ids = np.nonzero(residual)[0]
    return False, int(ids[rng.choice(len(ids), p=residual[ids] / total)])


def speculative_step(
    target: LoadedModel,
    draft: LoadedModel,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    max_tokens: int,
    draft_tokens: int = 4,
    stats: SpeculativeStats | None = None,
    cancel: CancelCheck | None = None,
) -> Generator[int, None, None]:
    """`generate_step` with a draft model: yields the target's tokens, several per target pass.

    target, draft: LoadedModel-like objects (`.backend`) with the same tokenizer. The caller
    stops early by closing us; `cancel` interrupts both prefills between chunks.
    """
    if not 1 <= draft_tokens <= MAX_DRAFT_TOKENS:
        raise PhoenixError(f"draft tokens must be 1..{MAX_DRAFT_TOKENS}, not {draft_tokens}")
    stats = stats if stats is not None else SpeculativeStats()
    tb, db = target.backend, draft.backend
    limit = min(tb.context_length, db.context_length)
    if len(prompt_ids) >= limit:
        raise ContextFull(f"prompt of {len(prompt_ids)} tokens does not fit a context of {limit}")
    rng = np.random.default_rng(params.seed)
    history = list(prompt_ids)
    token = Distribution(tb.forward(prompt_ids, 0, cancel=cancel), history, params).draw(rng)
    db.forward(prompt_ids, 0, cancel=cancel)
    pos = len(prompt_ids)  # both caches hold positions < pos; `token` is not fed yet
    draft_backlog: list[int] = []  # committed tokens the draft has not seen (beyond `token`)
    emitted = 1
    yield token
    while emitted < max_tokens and pos + 1 < limit:
        k = min(draft_tokens, max_tokens - emitted, limit - pos - 1)
        history.append(token)
        # the draft catches up on what it missed and proposes k tokens
        feed, at = draft_backlog + [token], pos - len(draft_backlog)
        proposals: list[int] = []
        q_dists: list[Distribution] = []
        for _ in range(k):
            logits = db.forward(feed, at)
            q = Distribution(logits, history + proposals, params)
            proposals.append(q.draw(rng))
            q_dists.append(q)
            at += len(feed)
            feed = [proposals[-1]]
        # the target scores `token` and every proposal in one pass
        all_logits = tb.forward([token] + proposals, pos, all_logits=True)
        accepted, replacement = 0, None
        for i, d in enumerate(proposals):
            p = Distribution(all_logits[i], history + proposals[:i], params)
            kept, t = accept_or_resample(p, q_dists[i], d, rng)
            if not kept:
                replacement = t
                break
            accepted += 1
        if replacement is None:  # all kept: the target's own next token comes free
            replacement = Distribution(all_logits[k], history + proposals, params).draw(rng)
        stats.rounds += 1
        stats.proposed += k
        stats.accepted += accepted
        out = proposals[:accepted] + [replacement]
        # caches: the target holds token + proposals from pos; the draft token + proposals[:-1]
        pos += 1 + accepted
        draft_backlog = [proposals[-1]] if accepted == k else []
        history.extend(proposals[:accepted])
        token = replacement
        for t in out:
            emitted += 1
            yield t
            if emitted >= max_tokens:
                return
