"""Build a Hugging Face `tokenizers.Tokenizer` from the SentencePiece vocabulary inside a GGUF file.

A GGUF file with `tokenizer.ggml.model == "llama"` carries SentencePiece's pieces, scores and
token types but no merge list. llama.cpp tokenizes such a vocabulary by greedy merging: start
from single characters, repeatedly join the adjacent pair whose concatenation is a piece with the
highest score (the leftmost on ties), and spell pieces that never formed as `<0xXX>` byte tokens.
A BPE model reproduces that exactly when its merge list holds, for every normal piece, the
merge that forms it (`derive_merges`), ranked by the piece's score.

Special handling mirrors llama.cpp (`llama-vocab.cpp`):
- control and unknown tokens (`<bos>`, `<start_of_turn>`, `<unused7>`, ...) are *special* added
  tokens: they are recognised in text only when special-token parsing is on;
- user-defined tokens (Gemma: runs of spaces, tabs and newlines, HTML tags, `[multimodal]`) are
  always cut out of the text first, whatever the parsing mode;
- both match the raw text (before spaces become "▁"), so they are added with `normalized=False`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

from .errors import UnsupportedModelError

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SPACE_MARK = "\u2581"  # "▁": SentencePiece's visible space

#: bump when the built tokenizer would change, so cached JSON files are rebuilt
BUILDER_VERSION = 2


def _meta_name(meta: dict[str, Any]) -> str:
    return str(meta.get("general.name") or "GGUF file")


def derive_merges(
    tokens: list[str], scores: npt.NDArray[np.float32], types: npt.NDArray[np.int32]
) -> list[tuple[str, str]]:
    """The merge that forms each normal piece, best-scoring piece first.

    Greedy merging inside the span where a piece ends up is independent of the text around it
    (a merge across the span's edge would stop the piece from forming), so every piece is always
    formed by the same last merge: the one greedy merging of the piece's own text ends with.
    That keeps one merge per reachable piece (Gemma 3: ~236k) instead of every split whose halves
    are pieces (~514k), which would give the same ids but load 0.4 s slower from the cache.
    Only normal pieces take part: control and user-defined tokens are cut out of the text before
    the model sees it, and byte tokens only appear as fallback.
    """
    normal = types == NORMAL
    ids = np.nonzero(normal)[0]
    score = {tokens[i]: float(scores[i]) for i in ids.tolist()}
    lengths = np.fromiter((len(tokens[i]) for i in ids.tolist()), np.int64, len(ids))
    found: list[tuple[int, str, str]] = []
    for length in np.unique(lengths).tolist():
        if length >= 2:
            group = ids[lengths == length].tolist()
            found += _last_merges([tokens[i] for i in group], group, score)
    rank = np.argsort(-np.array([float(scores[i]) for i, _, _ in found]), kind="stable")
    return [found[r][1:] for r in rank.tolist()]


def _last_merges(texts: list[str], ids: list[int], score: dict[str, float]) -> list[tuple[int, str, str]]:
    """(id, left, right) for the pieces of one length whose own greedy merging ends in one piece.

    Vectorised over the pieces: `span[n, i, j]` is the score of text n's characters i..j when
    they form a piece; symbol boundaries are a mask, and each step removes, in every text, the
    boundary whose two neighbouring symbols form the best piece (the leftmost on ties, as
    llama.cpp does) until one boundary is left.
    """
    n, length = len(texts), len(texts[0])
    get = score.get
    neg = -np.inf
    span = np.full((n, length + 1, length + 1), neg, np.float32)
    for i in range(length - 1):
        for j in range(i + 2, length + 1 - (i == 0)):  # the whole text is the piece itself
            span[:, i, j] = [get(t[i:j], neg) for t in texts]
    boundary = np.ones((n, length + 1), bool)
    pos = np.arange(length + 1)
    rows = np.arange(n)
    inner = pos[1:length]
    alive = np.ones(n, bool)
    for _ in range(length - 2):
        before = np.maximum.accumulate(np.where(boundary, pos, -1), axis=1)
        after = np.minimum.accumulate(np.where(boundary, pos, length + 1)[:, ::-1], axis=1)[:, ::-1]
        cand = np.where(boundary[:, 1:length], span[rows[:, None], before[:, inner - 1], after[:, inner + 1]], neg)
        best = np.argmax(cand, axis=1)
        alive &= cand[rows, best] > neg  # stuck: the piece cannot form from its own text
        boundary[rows[alive], best[alive] + 1] = False
    last = boundary[:, 1:length]
    split = np.argmax(last, axis=1) + 1
    out = []
    for r in np.nonzero(alive & (last.sum(axis=1) == 1))[0].tolist():
        t, k = texts[r], int(split[r])
        if t[:k] in score and t[k:] in score:
            out.append((ids[r], t[:k], t[k:]))
    return out


def build_gguf_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """A `tokenizers.Tokenizer` that encodes like llama.cpp's SPM tokenizer for this vocabulary.

    It adds no <bos> itself (no post-processor): `engine.tokenizer.Tokenizer` does that, the same
    way for GGUF and Hugging Face tokenizers.
    """
    kind = meta.get("tokenizer.ggml.model")
    if kind != "llama":
        raise UnsupportedModelError(
            _meta_name(meta), f"tokenizer model {kind!r} is not supported (only SentencePiece 'llama')"
        )
    tokens = list(meta["tokenizer.ggml.tokens"])
    n = len(tokens)
    scores = np.asarray(meta.get("tokenizer.ggml.scores", np.zeros(n)), dtype=np.float32)
    types = np.asarray(meta.get("tokenizer.ggml.token_type", np.full(n, NORMAL)), dtype=np.int32)
    if scores.shape != (n,) or types.shape != (n,):
        raise UnsupportedModelError(_meta_name(meta), "tokenizer scores/types do not match the token list")

    unk_id = int(meta.get("tokenizer.ggml.unknown_token_id", 0))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != n:
        raise UnsupportedModelError(_meta_name(meta), "tokenizer vocabulary has duplicate pieces")

    bpe = models.BPE(
        vocab=vocab,
        merges=derive_merges(tokens, scores, types),
        unk_token=tokens[unk_id] if 0 <= unk_id < n else None,
        byte_fallback=True,
        fuse_unk=False,
    )
    tok = Tokenizer(bpe)

    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", SPACE_MARK)]
    decode_steps = [decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse()]
    if meta.get("tokenizer.ggml.add_space_prefix", False):
        # llama.cpp prefixes a space to every text fragment that follows a token (or starts the text)
        steps.insert(0, normalizers.Prepend(" "))
        decode_steps.append(decoders.Strip(" ", 1, 0))
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence(decode_steps)

    added = []
    for i in np.nonzero((types == CONTROL) | (types == UNKNOWN) | (types == USER_DEFINED))[0].tolist():
        special = int(types[i]) != USER_DEFINED
        added.append(
            AddedToken(tokens[i], single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        )
    tok.add_tokens(added)
    return tok
