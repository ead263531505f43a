"""llama.cpp's own multimodal path (`libmtmd`: clip.cpp's vision graph + llama.cpp's text model) on
a text GGUF + mmproj GGUF, as a reference for our reading of llama.cpp's split form.

It runs in the peer venv that `make peer-server` builds (llama-cpp-python compiled from its sdist,
whose `llama_cpp.mtmd_cpp` binds libmtmd through ctypes), in a subprocess, as quantize_with_llama_cpp.py
does. Pictures go in as decoded RGB bytes (uint8 [H, W, 3]), so both sides see the same pixels;
give them at the tower's size, since clip.cpp's bilinear resize is not Pillow's.

Two sides:
- `run(text, mmproj, pictures, prompt, answer_tokens)` (the project's python): for each picture the
  soft tokens clip.cpp computes ([tokens, text width], f32), and for `prompt` (a text holding one
  `<__media__>` marker per picture, special tokens parsed, `<bos>` added) the token ids of its text
  chunks, the logits after the whole prompt and `answer_tokens` greedy tokens.
- `python tools/llama_cpp_mtmd.py TEXT MMPROJ IN.npz OUT.npz` (the peer venv's python): the work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TIMEOUT_S = 600.0
N_CTX = 512


def run(
    text: Path | str, mmproj: Path | str, pictures: list[Any], prompt: str, answer_tokens: int = 8
) -> dict[str, Any]:
    """{"soft": [array per picture], "chunks": [("text", ids) | ("image", n_tokens)], "logits":
    last-position logits after the prompt, "greedy": ids}. FileNotFoundError without the peer venv."""
    import numpy as np

    from tools import llama_cpp_server as peer

    exe = peer.python()
    if exe is None:
        raise FileNotFoundError(f"llama-cpp-python is not built: run `make peer-server` (no {peer.STAMP})")
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        arrays = {f"picture{i}": np.ascontiguousarray(p, np.uint8) for i, p in enumerate(pictures)}
        np.savez(inp, **arrays, request=np.array(json.dumps({"prompt": prompt, "answer_tokens": answer_tokens})))
        proc = subprocess.run(
            [str(exe), __file__, str(text), str(mmproj), str(inp), str(out)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"llama.cpp's mtmd failed ({proc.returncode}): {proc.stderr[-3000:]}")
        data = np.load(out)
        meta = json.loads(str(data["meta"]))
        return {
            "soft": [data[f"soft{i}"] for i in range(len(pictures))],
            "chunks": [tuple(c) for c in meta["chunks"]],
            "logits": data["logits"],
            "greedy": meta["greedy"],
        }


def _work(text: str, mmproj: str, inp: str, out: str) -> None:
    """The peer venv's side: load both files with llama.cpp, encode, evaluate, decode greedily."""
    import ctypes

    import llama_cpp
    import numpy as np
    from llama_cpp import mtmd_cpp as m

    data = np.load(inp)
    request = json.loads(str(data["request"]))
    pictures = [data[k] for k in sorted(data.files) if k.startswith("picture")]
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(text.encode(), llama_cpp.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {text}")
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch, cparams.n_threads = N_CTX, N_CTX, N_CTX, 1
    cparams.n_threads_batch = 1
    lctx = llama_cpp.llama_init_from_model(model, cparams)
    mparams = m.mtmd_context_params_default()
    mparams.use_gpu, mparams.n_threads, mparams.print_timings, mparams.warmup = False, 1, False, False
    mctx = m.mtmd_init_from_file(mmproj.encode(), model, mparams)
    if not mctx:
        raise SystemExit(f"llama.cpp's mtmd could not load {mmproj}")
    n_embd = llama_cpp.llama_model_n_embd(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))

    bitmaps = []
    for p in pictures:
        ny, nx = p.shape[:2]
        buf = (ctypes.c_uint8 * p.size).from_buffer_copy(np.ascontiguousarray(p).tobytes())
        bitmaps.append(m.mtmd_bitmap_init(nx, ny, buf))
    chunks = m.mtmd_input_chunks_init()
    prompt = request["prompt"].encode()
    text_in = m.mtmd_input_text()
    text_in.text, text_in.text_len, text_in.add_special, text_in.parse_special = prompt, len(prompt), True, True
    array = (m.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
    if m.mtmd_tokenize(mctx, chunks, ctypes.byref(text_in), array, len(bitmaps)) != 0:
        raise SystemExit("mtmd_tokenize failed")

    result: dict[str, Any] = {}
    layout: list[list[Any]] = []
    image = 0
    for i in range(m.mtmd_input_chunks_size(chunks)):
        chunk = m.mtmd_input_chunks_get(chunks, i)
        n = m.mtmd_input_chunk_get_n_tokens(chunk)
        if m.mtmd_input_chunk_get_type(chunk) == m.MTMD_INPUT_CHUNK_TYPE_IMAGE:
            if m.mtmd_encode_chunk(mctx, chunk) != 0:
                raise SystemExit("mtmd_encode_chunk failed")
            embd = m.mtmd_get_output_embd(mctx)
            result[f"soft{image}"] = np.ctypeslib.as_array(embd, shape=(n * n_embd,)).reshape(n, n_embd).copy()
            image += 1
            layout.append(["image", int(n)])
        else:
            count = ctypes.c_size_t(0)
            ids = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            layout.append(["text", [int(ids[j]) for j in range(count.value)]])

    n_past = llama_cpp.llama_pos(0)
    if m.mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, N_CTX, True, ctypes.byref(n_past)) != 0:
        raise SystemExit("mtmd_helper_eval_chunks failed")
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).copy()
    result["logits"] = logits
    greedy: list[int] = []
    last = logits
    for _ in range(int(request["answer_tokens"])):
        token = int(np.argmax(last))
        greedy.append(token)
        tok = (llama_cpp.llama_token * 1)(token)
        if llama_cpp.llama_decode(lctx, llama_cpp.llama_batch_get_one(tok, 1)) != 0:
            raise SystemExit("llama_decode failed")
        last = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).copy()
    result["meta"] = np.array(json.dumps({"chunks": layout, "greedy": greedy}))
    np.savez(out, **result)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        print(__doc__)
        sys.exit(2)
    _work(*sys.argv[1:])
