"""Tokenizer built from the embedded model's GGUF vocabulary, checked against llama.cpp.

Three references: the ids llama.cpp printed for the embedded model (/work/shared/reference),
the llama.cpp/transformers corpus in tests/goldens/tokenizer_corpus.json, and an independent,
slow, straight-line Python port of llama.cpp's SentencePiece tokenizer (`llama_cpp_spm` below)
run on hundreds of generated strings.
"""

from __future__ import annotations

import heapq
import json
import os
import random
import time
from functools import lru_cache
from pathlib import Path

import pytest

from phoenix_chat.engine import gguf_vocab
from phoenix_chat.engine.paths import cache_dir, data_dir
from phoenix_chat.engine.tokenizer import StreamingDetokenizer, Tokenizer, gguf_cache_key

GOLDENS = Path(__file__).resolve().parent / "goldens" / "tokenizer_corpus.json"
CONTROL, USER_DEFINED, UNKNOWN = gguf_vocab.CONTROL, gguf_vocab.USER_DEFINED, gguf_vocab.UNKNOWN


# -- shared helpers (test_chat.py uses them too) -----------------------------------------------
@lru_cache(maxsize=1)
def embedded_metadata() -> dict:
    from phoenix_chat.engine.weights import embedded_model_path
    from phoenix_chat.engine.weights.gguf_file import GGUFFile

    return GGUFFile(embedded_model_path()).metadata


BUILD_SECONDS: list[float] = []


@lru_cache(maxsize=1)
def embedded_tokenizer() -> Tokenizer:
    """Built once per test run, without the cache (the cache has its own tests)."""
    meta = embedded_metadata()
    t0 = time.perf_counter()
    tok = Tokenizer.from_gguf_metadata(meta, cache_key=None)
    BUILD_SECONDS.append(time.perf_counter() - t0)
    return tok


@pytest.fixture(scope="module")
def meta() -> dict:
    return embedded_metadata()


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return embedded_tokenizer()


def stream(tokenizer: Tokenizer, ids: list[int], **kw) -> list[str]:
    d = StreamingDetokenizer(tokenizer, **kw)
    return [d.add(i) for i in ids] + [d.flush()]


# -- an independent reference: llama.cpp's SPM tokenizer, line by line in Python ------------------
class LlamaCppSPM:
    """llama.cpp `llama_vocab::tokenize` for SPM vocabularies (add_space_prefix off), unoptimised."""

    def __init__(self, meta: dict):
        self.tokens = list(meta["tokenizer.ggml.tokens"])
        self.scores = [float(s) for s in meta["tokenizer.ggml.scores"]]
        types = [int(t) for t in meta["tokenizer.ggml.token_type"]]
        self.text_to_id = {t: i for i, t in enumerate(self.tokens)}
        self.bos = int(meta["tokenizer.ggml.bos_token_id"])
        specials = [i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED, UNKNOWN)]
        self.specials = sorted(specials, key=lambda i: len(self.tokens[i]), reverse=True)
        self.always = {i for i in specials if types[i] == USER_DEFINED}

    def partition(self, text: str, parse_special: bool) -> list:
        """Cut special tokens out of the text, longest token first (tokenizer_st_partition)."""
        frags: list = [text] if text else []
        for tid in self.specials:
            if not parse_special and tid not in self.always:
                continue
            piece = self.tokens[tid]
            out = []
            for f in frags:
                if not isinstance(f, str):
                    out.append(f)
                    continue
                while True:
                    k = f.find(piece)
                    if k < 0:
                        break
                    if k:
                        out.append(f[:k])
                    out.append(tid)
                    f = f[k + len(piece) :]
                if f:
                    out.append(f)
            frags = out
        return frags

    def spm(self, text: str) -> list[int]:
        """llm_tokenizer_spm_session::tokenize: greedy bigram merging by score, byte fallback."""
        sym = list(text.replace(" ", "\u2581"))
        n = len(sym)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap: list = []

        def try_add(left: int, right: int):
            if left < 0 or right < 0:
                return
            tid = self.text_to_id.get(sym[left] + sym[right])
            if tid is not None:
                # best score first, then the leftmost
                heapq.heappush(heap, (-self.scores[tid], left, right, len(sym[left]) + len(sym[right])))

        for i in range(n - 1):
            try_add(i, i + 1)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if not sym[left] or not sym[right] or nxt[left] != right or len(sym[left]) + len(sym[right]) != size:
                continue
            sym[left] += sym[right]
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            try_add(prv[left], left)
            try_add(left, nxt[left])
        ids = []
        i = 0 if n else -1
        while i >= 0:
            tid = self.text_to_id.get(sym[i])
            if tid is not None:
                ids.append(tid)
            else:
                ids.extend(self.text_to_id[f"<0x{b:02X}>"] for b in sym[i].encode("utf-8"))
            i = nxt[i]
        return ids

    def tokenize(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]:
        ids = [self.bos] if add_bos else []
        for f in self.partition(text, parse_special):
            ids.extend(self.spm(f) if isinstance(f, str) else [f])
        return ids


def generated_strings(meta: dict, count: int, seed: int = 1234) -> list[str]:
    """Strings made of real vocabulary pieces, random Unicode, whitespace runs and markers."""
    rng = random.Random(seed)
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    normal = [i for i in range(len(tokens)) if types[i] == gguf_vocab.NORMAL]
    extras = [
        "<start_of_turn>",
        "<end_of_turn>",
        "<bos>",
        "<eos>",
        "<unused7>",
        "[multimodal]",
        "<b>",
        "</table>",
        "  ",
        "\n",
        "\n\n\n",
        "\t\t",
        "\u2581",
        " ",
        "<0x41>",
        "<end_of",
        "🙂",
        "\U0010fffd",
    ]
    ranges = [
        (0x20, 0x7E),
        (0xA0, 0x24F),
        (0x370, 0x4FF),
        (0x590, 0x6FF),
        (0x900, 0x97F),
        (0x3040, 0x30FF),
        (0x4E00, 0x9FFF),
        (0xAC00, 0xD7A3),
        (0x1F300, 0x1FAFF),
        (0x20000, 0x2A6DF),
    ]
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.55:
                parts.append(tokens[rng.choice(normal)].replace("\u2581", " "))
            elif r < 0.85:
                lo, hi = rng.choice(ranges)
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 4))))
            else:
                parts.append(rng.choice(extras))
        out.append("".join(parts))
    return out


# -- build ------------------------------------------------------------------------------------
def test_build_from_gguf_metadata_is_fast_and_complete(tok):
    hf = tok.hf
    print(f"\nbuild from GGUF metadata: {BUILD_SECONDS[0]:.2f} s")
    assert BUILD_SECONDS[0] < 30, "~3 s on an idle core; this bound only catches a runaway"
    assert hf.get_vocab_size(with_added_tokens=True) == 262144
    added = hf.get_added_tokens_decoder()
    assert added[106].content == "<end_of_turn>" and added[106].special
    assert added[138].content == "  " and not added[138].special  # user-defined: parsed always
    assert not added[138].normalized  # matched in the raw text, before " " becomes "▁"


def test_merges_follow_scores():
    import numpy as np

    tokens = ["<unk>", "a", "b", "c", "ab", "bc", "abc", "<ctl>", "qz", "abca", "ca"]
    scores = [0, -1, -2, -3, -10, -5, -20, 0, -4, -30, -40]
    types = [2, 1, 1, 1, 1, 1, 1, 3, 1, 1, 1]
    merges = gguf_vocab.derive_merges(tokens, np.array(scores, np.float32), np.array(types, np.int32))
    # "abc" always forms as a + bc ("bc" outscores "ab"), never as ab + c; "qz" has no "q";
    # "abca" forms from "abc" + "a" ("ca" is worse than "bc", then "abc" beats "ca")
    assert merges == [("b", "c"), ("a", "b"), ("a", "bc"), ("abc", "a"), ("c", "a")]


def test_rejects_other_tokenizer_models(meta):
    from phoenix_chat.engine.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="gpt2"):
        gguf_vocab.build_gguf_tokenizer({**meta, "tokenizer.ggml.model": "gpt2"})


def test_properties(tok):
    assert tok.vocab_size == 262144
    assert tok.bos_id == 2 and tok.bos_token == "<bos>"
    assert tok.eos_ids[0] == 1 and 106 in tok.eos_ids
    assert tok.add_bos and tok.chat_template is None and tok.pad_id == 0
    assert tok.token_to_id("<start_of_turn>") == 105 and tok.token_to_id("no such piece") is None
    assert tok.id_to_piece(240731) == "🙂" and tok.id_to_piece(248) == "<0x0A>"
    assert tok.id_to_piece(3823) == "\u2581quick"
    with pytest.raises(IndexError):
        tok.id_to_piece(tok.vocab_size)
    assert tok.is_special(106) and not tok.is_special(107) and not tok.is_special(818)


# -- encoding against llama.cpp -----------------------------------------------------------------
def test_matches_llama_cpp_reference(tok, llama_reference):
    for case in llama_reference["tokenize_llama_cpp"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
    chat = llama_reference["chat_prompt"]
    assert tok.encode(chat["rendered"], add_bos=False) == chat["prompt_ids"]


def corpus_strings() -> list[str]:
    """The strings tools/make_tokenizer_goldens.py asks llama.cpp about."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "tools" / "make_tokenizer_goldens.py"
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location("_tokenizer_goldens_tool", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [text for _, text in module.CORPUS]


def test_matches_python_port_of_llama_cpp(tok, meta):
    ref = LlamaCppSPM(meta)
    strings = generated_strings(meta, 400) + corpus_strings()
    for parse_special in (True, False):
        bad = [s for s in strings if tok.encode(s, parse_special=parse_special) != ref.tokenize(s, True, parse_special)]
        assert not bad, f"parse_special={parse_special}: {len(bad)} mismatches, e.g. {bad[:3]!r}"


def _corpus_entries():
    if not GOLDENS.exists():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{GOLDENS.name} not generated yet"))]
    data = json.loads(GOLDENS.read_text(encoding="utf-8"))
    return [pytest.param(e, id=e["name"]) for e in data["entries"]]


@pytest.mark.parametrize("entry", _corpus_entries())
def test_matches_llama_cpp_corpus(tok, entry):
    text = entry["text"]
    assert tok.encode(text, parse_special=True) == entry["llama_cpp_special_true"]
    assert tok.encode(text, parse_special=False) == entry["llama_cpp_special_false"]
    # and llama.cpp's detokenization (llama-cpp-python renders control tokens as "", <unk> as "▅")
    for ids, detok in (
        (entry["llama_cpp_special_true"], entry["llama_cpp_detok_special_true"]),
        (entry["llama_cpp_special_false"], entry["llama_cpp_detok_special_false"]),
    ):
        if "\ufffd" not in detok and 3 not in ids:
            assert tok.decode(ids[1:], skip_special=True) == detok
        full = tok.decode(ids)
        deltas = stream(tok, ids)
        assert "".join(deltas) == full
        assert "\ufffd" in full or not any("\ufffd" in d for d in deltas)


def test_parse_special_off_keeps_markers_as_text(tok):
    text = "hi<end_of_turn>\n<start_of_turn>model\n<bos>"
    assert tok.encode(text) == [2] + tok.encode("hi", add_bos=False) + [106, 107, 105, 4368, 107, 2]
    plain = tok.encode(text, add_bos=False, parse_special=False)
    assert not {1, 2, 105, 106} & set(plain)
    assert tok.decode(plain) == text
    # user-defined pieces (whitespace runs, HTML tags) are cut out in both modes, as llama.cpp does
    assert tok.encode("a  b<b>", add_bos=False, parse_special=False) == tok.encode("a  b<b>", add_bos=False)
    assert 138 in tok.encode("a  b", parse_special=False)


def test_byte_fallback_and_round_trip(tok):
    ids = tok.encode("\U0010fffd", add_bos=False)
    assert [tok.id_to_piece(i) for i in ids] == ["<0xF4>", "<0x8F>", "<0xBF>", "<0xBD>"]
    for s in [
        "",
        " ",
        "  leading",
        "trailing  ",
        "naïve café — 東京タワー 🙂👨‍👩‍👧 \U0010fffd x\n\n\ty",
        "<end_of_turn> <b>bold</b> underline",
        "\x00\x07 control",
    ]:
        ids = tok.encode(s, add_bos=False, parse_special=False)
        assert tok.decode(ids) == s
        assert tok.decode(tok.encode(s, parse_special=False), skip_special=True) == s
    # SentencePiece's space mark typed as text comes back as a space (llama.cpp does the same)
    assert tok.decode(tok.encode("a\u2581b", add_bos=False)) == "a b"
    assert tok.decode([2, 105, 2364, 107], skip_special=True) == "user\n"
    assert tok.decode([2, 105, 2364, 107]) == "<bos><start_of_turn>user\n"


# -- streaming ----------------------------------------------------------------------------------
STREAM_TEXTS = [
    "Hello, world! How are you?",
    " leading space and  double spaces",
    "🙂 smile 👨‍👩‍👧‍👦 family 🇫🇷 flag \U0010fffd private \U00020000 rare",
    "東京タワーは赤と白の塔です。안녕하세요 नमस्ते",
    "code:\n\tdef f(x):\n        return x  # done\n\n\n",
]


@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_streaming_detokenizer_matches_full_decode(tok, text):
    ids = tok.encode(text, add_bos=False)
    deltas = stream(tok, ids)
    assert "".join(deltas) == tok.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)
    # a character split over byte tokens comes out whole, in one delta
    for ch in ("🙂", "\U0010fffd", "\U00020000"):
        if ch in text:
            assert any(ch in d for d in deltas)


def test_stream_texts_need_byte_fallback(tok):
    assert sum(tok.id_to_piece(i).startswith("<0x") for i in tok.encode(STREAM_TEXTS[2])) >= 8


def test_streaming_keeps_specials_and_skips_them_on_request(tok):
    ids = tok.encode("<start_of_turn>model\n Hi🙂<end_of_turn>", add_bos=True)
    assert "".join(stream(tok, ids)) == tok.decode(ids)
    assert "".join(stream(tok, ids, skip_special=True)) == "model\n Hi🙂" == tok.decode(ids, skip_special=True)


def test_streaming_unfinished_character(tok):
    f0, b9f, b99, b82 = (tok.token_to_id(f"<0x{b:02X}>") for b in (0xF0, 0x9F, 0x99, 0x82))
    d = StreamingDetokenizer(tok)
    assert [d.add(f0), d.add(b9f), d.add(b99)] == ["", "", ""]
    assert d.add(b82) == "🙂"
    assert d.add(f0) == "" and d.flush() == "\ufffd"
    d = StreamingDetokenizer(tok)
    assert d.add(f0) + d.add(b9f) == ""
    assert d.add(tok.token_to_id("\u2581Hi")) == "\ufffd\ufffd Hi"  # cut short by a normal piece
    assert d.text == "\ufffd\ufffd Hi" and d.tokens == [f0, b9f, tok.token_to_id("\u2581Hi")]


def test_streaming_fallback_for_other_decoders(tok):
    from tokenizers import decoders

    other = Tokenizer(tok.hf, bos_id=2, eos_ids=[1])
    saved = tok.hf.decoder
    try:
        tok.hf.decoder = decoders.Sequence(
            [
                decoders.Replace("\u2581", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.BPEDecoder(suffix="</w>"),
            ]
        )
        other._stream_info = None
        assert other._stream_mode()[0] == "naive"
        ids = tok.encode(STREAM_TEXTS[2], add_bos=False)
        deltas = stream(other, ids)
        assert "".join(deltas) == STREAM_TEXTS[2] and not any("\ufffd" in d for d in deltas)
    finally:
        tok.hf.decoder = saved


# -- the cache ----------------------------------------------------------------------------------
def test_cache_makes_the_second_load_fast(meta, monkeypatch, tmp_path, model_path):
    monkeypatch.setenv("PHOENIX_CHAT_HOME", str(tmp_path))
    key = gguf_cache_key(model_path)
    t0 = time.perf_counter()
    built = Tokenizer.from_gguf_metadata(meta, key)
    t_build = time.perf_counter() - t0
    cache_file = tmp_path / "cache" / "tokenizers" / f"{key}.json"
    assert cache_file.is_file()

    def no_rebuild(_meta):
        raise AssertionError("the cached tokenizer was rebuilt")

    monkeypatch.setattr(gguf_vocab, "build_gguf_tokenizer", no_rebuild)
    t0 = time.perf_counter()
    loaded = Tokenizer.from_gguf_metadata(meta, key)
    t_load = time.perf_counter() - t0
    print(f"\ntokenizer build {t_build:.2f} s, cached load {t_load:.2f} s")
    assert loaded == built
    assert loaded.encode("🙂 <end_of_turn>x") == built.encode("🙂 <end_of_turn>x")
    assert t_load < t_build


def test_a_reload_in_the_same_process_reuses_the_tokenizer_it_read(meta, monkeypatch, tmp_path, model_path):
    """The worker reads the cache file again at every reload (~1 s for the 270M's vocabulary):
    the same file, unchanged, gives the tokenizer read before; a changed file is read again."""
    import tokenizers

    monkeypatch.setenv("PHOENIX_CHAT_HOME", str(tmp_path))
    key = gguf_cache_key(model_path)
    Tokenizer.from_gguf_metadata(meta, key)  # builds and writes the cache file
    first = Tokenizer.from_gguf_metadata(meta, key)  # reads it
    parse = tokenizers.Tokenizer.from_file
    reads = []
    monkeypatch.setattr(tokenizers.Tokenizer, "from_file", lambda path: reads.append(path) or parse(path))
    assert Tokenizer.from_gguf_metadata(meta, key) is first and reads == []
    cache_file = tmp_path / "cache" / "tokenizers" / f"{key}.json"
    os.utime(cache_file, ns=(cache_file.stat().st_atime_ns, cache_file.stat().st_mtime_ns + 1_000_000))
    again = Tokenizer.from_gguf_metadata(meta, key)
    assert again is not first and reads == [str(cache_file)] and again.encode("Hello") == first.encode("Hello")


def test_damaged_cache_is_rebuilt(meta, tok, monkeypatch, tmp_path):
    monkeypatch.setenv("PHOENIX_CHAT_HOME", str(tmp_path))
    path = tmp_path / "cache" / "tokenizers" / "k.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"version": "1.0", "trunc')
    calls = []
    monkeypatch.setattr(gguf_vocab, "build_gguf_tokenizer", lambda m: calls.append(m) or tok.hf)
    rebuilt = Tokenizer.from_gguf_metadata(meta, "k")
    assert calls and rebuilt.encode("Hello") == [2, 9259]
    assert path.read_text() == tok.hf.to_str()  # and the cache is good again


def test_cache_key_follows_the_file(tmp_path):
    f = tmp_path / "My Model (Q4).gguf"
    f.write_bytes(b"GGUF....")
    key = gguf_cache_key(f)
    assert key == gguf_cache_key(str(f)) and key.startswith("My_Model_Q4_-")
    assert all(c.isalnum() or c in "._-" for c in key)
    os.utime(f, ns=(1, 1))
    assert gguf_cache_key(f) != key
    f.write_bytes(b"GGUF.....")
    assert gguf_cache_key(f) != key


def test_paths_honour_phoenix_chat_home(monkeypatch, tmp_path):
    monkeypatch.setenv("PHOENIX_CHAT_HOME", str(tmp_path))
    assert data_dir() == tmp_path and cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("PHOENIX_CHAT_HOME")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    assert data_dir() == Path.home() / ".local" / "share" / "phoenix-chat"
    assert cache_dir() == Path.home() / ".cache" / "phoenix-chat"


# -- Hugging Face folders -----------------------------------------------------------------------
def test_from_hf_folder(tok, tmp_path):
    (tmp_path / "tokenizer.json").write_text(tok.hf.to_str())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<bos>",
                "eos_token": {"content": "<eos>"},
                "pad_token": "<pad>",
                "add_bos_token": True,
                "chat_template": "{{ bos_token }}{{ messages[0]['content'] }}",
            }
        )
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 106]}))
    hf = Tokenizer.from_hf_folder(tmp_path)
    assert (hf.bos_id, hf.eos_ids[:2], hf.pad_id, hf.add_bos) == (2, (1, 106), 0, True)
    assert hf.chat_template.startswith("{{ bos_token }}")
    text = "The quick brown fox 🙂 <end_of_turn>"
    assert hf.encode(text) == tok.encode(text)
    assert hf.encode(text, parse_special=False) == tok.encode(text, parse_special=False)


def test_from_hf_folder_errors(tmp_path):
    from phoenix_chat.engine.errors import ModelFileError

    with pytest.raises(ModelFileError, match="no tokenizer.json"):
        Tokenizer.from_hf_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelFileError, match="unreadable tokenizer"):
        Tokenizer.from_hf_folder(tmp_path)


def test_space_prefix_vocabularies(tok):
    """Llama-2-style SentencePiece (add_space_prefix): a space before every text run, stripped once
    when decoding and streaming."""
    from tokenizers import decoders, normalizers

    saved = tok.hf.normalizer, tok.hf.decoder
    try:
        tok.hf.normalizer = normalizers.Sequence([normalizers.Prepend(" "), normalizers.Replace(" ", "\u2581")])
        tok.hf.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        llama2 = Tokenizer(tok.hf, bos_id=2, eos_ids=[1])
        assert llama2._stream_mode() == ("spm", True)
        ids = llama2.encode("Hello world 🙂")
        assert [llama2.id_to_piece(i) for i in ids[:3]] == ["<bos>", "\u2581Hello", "\u2581world"]
        assert llama2.decode(ids[1:]) == "Hello world 🙂"
        assert "".join(stream(llama2, ids[1:])) == "Hello world 🙂"
    finally:
        tok.hf.normalizer, tok.hf.decoder = saved
