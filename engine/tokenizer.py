"""The engine's tokenizer: a thin wrapper over a Hugging Face `tokenizers.Tokenizer`.

Two sources give the same object: a GGUF file's embedded SentencePiece vocabulary (built by
`engine.gguf_vocab`, then cached as tokenizer JSON) and a Hugging Face folder's tokenizer.json.

Encoding follows llama.cpp's contract: `encode(text)` adds <bos> and turns special-token strings
such as "<end_of_turn>" into their ids; with `parse_special=False` those strings are plain text
(chat message content is always encoded that way, see `engine.chat`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import tokenizers

from .errors import ModelFileError
from .paths import cache_dir

SPACE_MARK = "\u2581"
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
# tokens that end a turn, whatever the model calls them (llama.cpp's end-of-generation list)
_TURN_END_TEXTS = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>")


def gguf_cache_key(path: str | os.PathLike[str]) -> str:
    """A file-name-safe key for a GGUF file's built tokenizer: its name, plus a hash of its
    absolute path, size, modification time and the tokenizer builder's version."""
    from .gguf_vocab import BUILDER_VERSION

    p = Path(path).resolve()
    st = p.stat()
    ident = f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0builder-v{BUILDER_VERSION}"
    digest = hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:20]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", p.stem)[:60]
    return f"{stem}-{digest}"


# Tokenizers read from a cache file in this process, by (file, mtime, size): parsing the 270M's
# 262,144-token JSON takes ~1 s, and the app's worker reads it again at every reload (another
# quantization, context or slot count). The same object serves both loads: it is immutable but
# for the special-token switch, which its own lock guards.
READ_KEEP = 4
_READ: OrderedDict[tuple[str, int, int], Tokenizer] = OrderedDict()


class Tokenizer:
    """Text ↔ token ids for one model."""

    def __init__(
        self,
        hf: tokenizers.Tokenizer,
        *,
        bos_id: int | None,
        eos_ids: Iterable[int],
        add_bos: bool = True,
        chat_template: str | None = None,
        pad_id: int | None = None,
    ):
        self.hf = hf
        self.bos_id = bos_id
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in eos_ids))
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.pad_id = pad_id
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)
        # `encode_special_tokens` is state on the shared Rust object: flip it under a lock
        self._lock = threading.Lock()
        added = hf.get_added_tokens_decoder()
        self.special_tokens: dict[str, int] = {t.content: i for i, t in added.items() if t.special}
        self._special_ids = frozenset(self.special_tokens.values())
        self._special_re: re.Pattern[str] | None = None
        self._stream_info: tuple[str, bool] | None = None

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any], cache_key: str | None = None) -> Tokenizer:
        """Build from GGUF metadata; with a `cache_key` (see `gguf_cache_key`) the built
        tokenizer is kept as `cache_dir()/tokenizers/<cache_key>.json` and reused."""
        from .gguf_vocab import build_gguf_tokenizer

        n_tokens = len(meta["tokenizer.ggml.tokens"])
        hf = None
        cache_file = cache_dir() / "tokenizers" / f"{cache_key}.json" if cache_key else None
        read_key: tuple[str, int, int] | None = None
        if cache_file is not None and cache_file.is_file():
            st = cache_file.stat()
            read_key = (str(cache_file), st.st_mtime_ns, st.st_size)
            known = _READ.get(read_key)
            if known is not None:  # this process read that very file before (a reload)
                _READ.move_to_end(read_key)
                return known
            try:
                hf = tokenizers.Tokenizer.from_file(str(cache_file))
                if hf.get_vocab_size(with_added_tokens=True) != n_tokens:
                    hf = None
            except Exception:  # a damaged cache file is rebuilt, never fatal
                hf = None
        if hf is None:
            read_key = None
            hf = build_gguf_tokenizer(meta)
            if cache_file is not None:
                _write_atomically(cache_file, hf.to_str())

        def meta_id(key: str) -> int | None:
            value = meta.get(f"tokenizer.ggml.{key}_token_id")
            return int(value) if value is not None and 0 <= int(value) < n_tokens else None

        eos = [i for i in (meta_id("eos"), meta_id("eot"), meta_id("eom")) if i is not None]
        eos += [i for i in (hf.token_to_id(t) for t in _TURN_END_TEXTS) if i is not None]
        made = cls(
            hf,
            bos_id=meta_id("bos"),
            eos_ids=eos,
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
            chat_template=meta.get("tokenizer.chat_template"),
            pad_id=meta_id("padding"),
        )
        if read_key is not None:
            _READ[read_key] = made
            while len(_READ) > READ_KEEP:
                _READ.popitem(last=False)
        return made

    @classmethod
    def from_hf_folder(cls, folder: str | os.PathLike[str]) -> Tokenizer:
        """Load tokenizer.json (+ tokenizer_config.json, generation_config.json, chat_template.jinja)."""
        folder = Path(folder)
        tok_file = folder / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelFileError(folder, "no tokenizer.json (only fast Hugging Face tokenizers are supported)")
        try:
            hf = tokenizers.Tokenizer.from_file(str(tok_file))
        except Exception as e:
            raise ModelFileError(tok_file, f"unreadable tokenizer: {e}") from None
        config = _read_json(folder / "tokenizer_config.json")
        generation = _read_json(folder / "generation_config.json")

        def token_id(entry: object) -> int | None:
            text = entry.get("content") if isinstance(entry, dict) else entry
            return hf.token_to_id(text) if isinstance(text, str) else None

        bos_id = token_id(config.get("bos_token"))
        eos = [token_id(config.get("eos_token"))]
        gen_eos = generation.get("eos_token_id")
        eos += gen_eos if isinstance(gen_eos, list) else [gen_eos]
        eos += [hf.token_to_id(t) for t in _TURN_END_TEXTS]
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = folder / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        if template is None:
            template = _read_json(folder / "chat_template.json").get("chat_template")
        return cls(
            hf,
            bos_id=bos_id,
            eos_ids=[i for i in eos if isinstance(i, int)],
            add_bos=bool(config.get("add_bos_token", bos_id is not None)),
            chat_template=template if isinstance(template, str) else None,
            pad_id=token_id(config.get("pad_token")),
        )

    # -- encoding / decoding ------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`. `add_bos` adds <bos> when the model wants one; with
        `parse_special=False`, strings like "<end_of_turn>" are encoded as plain text."""
        with self._lock:
            self.hf.encode_special_tokens = not parse_special
            try:
                ids = self.hf.encode(text, add_special_tokens=False).ids
            finally:
                self.hf.encode_special_tokens = False
        if add_bos and self.add_bos and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary entry as stored ("▁Hello", "<0xF0>", "<end_of_turn>")."""
        piece = self.hf.id_to_token(int(token_id))
        if piece is None:
            raise IndexError(f"token id {token_id} outside the vocabulary of {self.vocab_size}")
        return piece

    def is_special(self, token_id: int) -> bool:
        """True for control tokens (<bos>, <start_of_turn>, ...), which `decode(skip_special=True)` drops."""
        return token_id in self._special_ids

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_id is None else self.id_to_piece(self.bos_id)

    @property
    def eos_token(self) -> str | None:
        return self.id_to_piece(self.eos_ids[0]) if self.eos_ids else None

    @property
    def special_pattern(self) -> re.Pattern[str]:
        """A regex matching any special-token string, longest first (for the chat encoder)."""
        if self._special_re is None:
            alts = sorted(self.special_tokens, key=len, reverse=True)
            self._special_re = re.compile("|".join(map(re.escape, alts)) if alts else r"(?!x)x")
        return self._special_re

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Tokenizer)
            and self.hf.to_str() == other.hf.to_str()
            and (self.bos_id, self.eos_ids, self.add_bos, self.chat_template, self.pad_id)
            == (other.bos_id, other.eos_ids, other.add_bos, other.chat_template, other.pad_id)
        )

    # mutable wrapper around a Rust object: unhashable (typeshed types object.__hash__ as a method, hence the ignore)
    __hash__ = None  # type: ignore[assignment]

    def _stream_mode(self) -> tuple[str, bool]:
        """("spm", strip_first_space) when pieces map to bytes one by one, else ("naive", False)."""
        if self._stream_info is None:
            try:
                dec = json.loads(self.hf.decoder.__getstate__()) if self.hf.decoder else {}
            except Exception:
                dec = {}
            steps = dec.get("decoders", [dec]) if dec.get("type") == "Sequence" else [dec]

            def space_mark(step: dict[str, Any]) -> bool:
                return bool(
                    step.get("type") == "Metaspace"
                    and step.get("replacement") == SPACE_MARK
                    or (
                        step.get("type") == "Replace"
                        and step.get("pattern", {}).get("String") == SPACE_MARK
                        and step.get("content") == " "
                    )
                )

            def first_space_strip(step: dict[str, Any]) -> bool:
                return bool(step.get("type") == "Strip" and step.get("content") == " " and step.get("stop", 0) == 0)

            kinds = [s.get("type") for s in steps]
            spm = (
                "ByteFallback" in kinds
                and any(map(space_mark, steps))
                and all(
                    k in ("ByteFallback", "Fuse") or space_mark(s) or first_space_strip(s) for k, s in zip(kinds, steps)
                )
            )
            strip_first = any(first_space_strip(s) and s.get("start", 0) == 1 for s in steps) or any(
                s.get("type") == "Metaspace" and s.get("prepend_scheme", "always") != "never" for s in steps
            )
            self._stream_info = ("spm", strip_first) if spm else ("naive", False)
        return self._stream_info


class StreamingDetokenizer:
    """Turns ids fed one at a time into text deltas that never end in half a UTF-8 character.

    For SentencePiece-style vocabularies each piece maps to bytes on its own ("▁" is a space,
    "<0xF0>" one byte), so `add` is O(1): bytes collect until they form whole characters. Other
    tokenizers fall back to re-decoding the pending ids. Concatenated deltas equal
    `tokenizer.decode(ids)` for every valid UTF-8 text; an invalid byte run becomes one U+FFFD
    per bad byte.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._mode, self._strip_first = tokenizer._stream_mode()
        self._pieces: dict[int, bytes | int] = {}
        self.reset()

    def reset(self) -> None:
        self._chunks: list[str] = []  # everything emitted so far
        self.tokens: list[int] = []
        self._pending = bytearray()  # bytes of an unfinished character (spm mode)
        self._naive_ids: list[int] = []
        self._naive_emitted = 0
        self._started = False  # has any text been emitted (for strip_first)

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        if len(self._chunks) > 1:
            self._chunks[:] = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    def add(self, token_id: int) -> str:
        """Feed one id; returns the new text it completes (often "", never a partial character)."""
        token_id = int(token_id)
        self.tokens.append(token_id)
        if self._mode == "naive":
            return self._emit(self._naive_add(token_id))
        piece = self._piece(token_id)
        if isinstance(piece, int):  # one byte of a byte-fallback sequence
            self._pending.append(piece)
            return self._emit(self._drain(final=False))
        if not piece:  # a skipped special token
            return ""
        out = "\ufffd" * len(self._pending) if self._pending else ""  # an unfinished char cut short
        self._pending.clear()
        return self._emit(out + piece.decode("utf-8"))

    def flush(self) -> str:
        """The text still held back (an unfinished character shows as U+FFFD)."""
        if self._mode == "naive":
            text = self.tokenizer.decode(self._naive_ids, self.skip_special)
            out = text[self._naive_emitted :]
            self._naive_ids, self._naive_emitted = [], 0
            return self._emit(out)
        return self._emit(self._drain(final=True))

    # -- internals ----------------------------------------------------------------------------
    def _piece(self, token_id: int) -> bytes | int:
        piece = self._pieces.get(token_id)
        if piece is None:
            tok = self.tokenizer
            if self.skip_special and tok.is_special(token_id):
                piece = b""
            else:
                text = tok.id_to_piece(token_id)
                m = _BYTE_PIECE.match(text)
                piece = int(m.group(1), 16) if m else text.replace(SPACE_MARK, " ").encode("utf-8")
            self._pieces[token_id] = piece
        return piece

    def _drain(self, final: bool) -> str:
        out = []
        buf = self._pending
        while buf:
            try:
                out.append(buf.decode("utf-8"))
                buf = bytearray()
            except UnicodeDecodeError as e:
                out.append(buf[: e.start].decode("utf-8"))
                if e.reason == "unexpected end of data" and e.end == len(buf) and not final:
                    buf = buf[e.start :]  # a character still arriving: hold it
                    break
                out.append("\ufffd" * (e.end - e.start))
                buf = buf[e.end :]
        self._pending = bytearray(buf)
        return "".join(out)

    def _naive_add(self, token_id: int) -> str:
        self._naive_ids.append(token_id)
        text = self.tokenizer.decode(self._naive_ids, self.skip_special)
        if text.endswith("\ufffd"):
            return ""
        out = text[self._naive_emitted :]
        self._naive_emitted = len(text)
        return out

    def _emit(self, out: str) -> str:
        if out and not self._started:
            self._started = True
            if self._strip_first and out.startswith(" "):
                out = out[1:]
        if out:
            self._chunks.append(out)
        return out


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelFileError(path, f"unreadable JSON: {e}") from None
    return data if isinstance(data, dict) else {}


def _write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file + rename, so a crash never leaves half a cache file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs time
