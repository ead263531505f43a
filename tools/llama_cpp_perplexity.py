"""llama.cpp's own perplexity of a GGUF on token ids we give it, by engine/perplexity.py's method
(windows of n_ctx, each window's first id replaced by <bos>, positions n_ctx/2 .. n_ctx-2 scored),
so the number compares with our backends' on the same ids: both see the same tokens, whatever
either tokenizer would have made of the text.

llama.cpp runs through the `llama_cpp` package that `make peer-server` builds from the
llama-cpp-python sdist into build/llama-cpp-server (llama.cpp compiled from source for this CPU;
its CPU matmuls quantize activations to 8 bits; f16 KV cache): the logits of every position
(logits_all) come back and the log-softmax NLL is taken here in float64. Flash attention is on by
default, as in llama.cpp's `llama-perplexity` CLI (llama-cpp-python's own default is off); on 126
scored tokens of the 270M that switch alone moves llama.cpp's perplexity by up to ~2.5%.

Two sides:
- `perplexity(model, ids, n_ctx, bos_id)` (the project's python): runs this file in the peer venv.
- `python tools/llama_cpp_perplexity.py` (the peer venv's python): reads
  {"model", "ids", "n_ctx", "bos_id", "max_windows", "threads", "flash_attn"} as JSON on stdin, prints
  {"ppl", "windows", "scored_tokens", "n_ctx"} as one JSON line.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

TIMEOUT_S = 600.0


def perplexity(
    model: Path | str,
    ids: Sequence[int],
    n_ctx: int,
    bos_id: int,
    *,
    max_windows: int | None = None,
    threads: int | None = None,
    flash_attn: bool = True,
) -> dict:
    """llama.cpp's perplexity of `model` on `ids` (see the module docstring). Raises
    FileNotFoundError when the peer venv is not built (`make peer-server`)."""
    from tools import llama_cpp_server as peer

    exe = peer.python()
    if exe is None:
        raise FileNotFoundError(f"llama-cpp-python is not built: run `make peer-server` (no {peer.STAMP})")
    job = {
        "model": str(model),
        "ids": [int(i) for i in ids],
        "n_ctx": n_ctx,
        "bos_id": bos_id,
        "max_windows": max_windows,
        "threads": threads or os.cpu_count() or 1,
        "flash_attn": flash_attn,
    }
    proc = subprocess.run(
        [str(exe), __file__], input=json.dumps(job), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp perplexity failed ({proc.returncode}): {proc.stderr[-2000:]}")
    result: dict = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _main() -> int:
    import numpy as np
    from llama_cpp import Llama

    job = json.loads(sys.stdin.read())
    n_ctx, tokens = int(job["n_ctx"]), list(job["ids"])
    n_windows = len(tokens) // n_ctx
    if job["max_windows"] is not None:
        n_windows = min(n_windows, int(job["max_windows"]))
    if n_windows == 0:
        raise SystemExit(f"{len(tokens)} ids, fewer than one window of {n_ctx}")
    llm = Llama(
        model_path=job["model"],
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        n_threads=job["threads"],
        logits_all=True,
        flash_attn=bool(job.get("flash_attn", True)),
        verbose=False,
    )
    first = n_ctx // 2
    nll, count = 0.0, 0
    for w in range(n_windows):
        window = tokens[w * n_ctx : (w + 1) * n_ctx]
        window[0] = job["bos_id"]
        llm.reset()
        llm.eval(window)
        logits = np.asarray(llm.scores[first : n_ctx - 1], dtype=np.float64)
        targets = np.asarray(window[first + 1 : n_ctx])
        m = logits.max(axis=-1)
        lse = m + np.log(np.exp(logits - m[:, None]).sum(axis=-1))
        nll -= float((logits[np.arange(len(targets)), targets] - lse).sum())
        count += len(targets)
    print(json.dumps({"ppl": math.exp(nll / count), "windows": n_windows, "scored_tokens": count, "n_ctx": n_ctx}))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
