"""llama.cpp on the same GGUF in the same run, through llama-cpp-python (optional: `pip install
'.[bench]'`). Same shapes as our benchmark: a prompt of N tokens, then M greedy tokens.

Returns None, and the caller says so, when llama-cpp-python is not installed: the comparison is
never invented.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass
class PeerResult:
    name: str
    prefill_tok_s: float
    decode_tok_s: float
    threads: int


def run_llama_cpp(path, prompt_ids, gen_tokens: int, threads: int | None = None) -> PeerResult | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    threads = threads or os.cpu_count() or 1
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=len(prompt_ids) + gen_tokens + 8,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=True,
        verbose=False,
    )
    llm.eval(prompt_ids[:8])  # warm-up, then start again at position 0
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt_ids)
    t1 = time.perf_counter()
    token = llm.sample(top_k=1, temp=0.0)
    t2 = time.perf_counter()
    for _ in range(gen_tokens - 1):
        llm.eval([token])
        token = llm.sample(top_k=1, temp=0.0)
    t3 = time.perf_counter()
    return PeerResult(
        name=f"llama.cpp {llama_cpp.__version__} CPU ({threads} threads)",
        prefill_tok_s=len(prompt_ids) / (t1 - t0),
        decode_tok_s=(gen_tokens - 1) / (t3 - t2),
        threads=threads,
    )
