"""Real GGUF files of the low-bit types (Q2_K, Q3_K, Q4_1, Q5_1, IQ4_NL, IQ4_XS, IQ3_S), made by
llama.cpp's own quantizer from an input GGUF (by default the embedded Gemma 3 270M Q4_K_M).

Why: a synthetic file (tools/make_synthetic_gguf.py) holds blocks written by gguf-py's quantizer,
so a test on it cannot tell whether we read the bytes llama.cpp writes the way llama.cpp reads
them. The files people download are made by llama.cpp's `llama-quantize`: its per-tensor type
mix (Q3_K_M keeps attn_v/ffn_down at Q4_K/Q5_K, the output head at Q6_K, ...), its fallbacks
(rows of 640 are no whole 256-wide super-block, so the 270M's K-quant and IQ4_XS matrices of
that width become Q5_0/Q5_1/IQ4_NL/Q8_0) and its block encoders. This script calls the same C
function (`llama_model_quantize`) through the `llama_cpp` package that `make peer-server` builds
from the llama-cpp-python sdist into build/llama-cpp-server — llama.cpp compiled from source, not
a prebuilt wheel.

The embedded file is already Q4_K_M, so this re-quantizes (allow_requantize): the weights are
llama.cpp's dequantized Q4_K_M values quantized again, as llama-quantize --allow-requantize does.

Two sides:
- `quantize(src, dst, qtype)` (the project's python): runs this file in the peer venv's python,
  then reads back which type each tensor really got (`tensor_types`, with the `gguf` package).
- `python tools/quantize_with_llama_cpp.py SRC DST TYPE [--pure]` (the peer venv's python): does the work.

    build/llama-cpp-server/bin/python tools/quantize_with_llama_cpp.py in.gguf out.gguf IQ4_XS
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# llama-quantize's file types (the llama_ftype each name asks for). Q2_K and Q3_K_M are mixes:
# llama.cpp lifts some roles to bigger types, and on the 270M that leaves no tensor of the named
# type (Q2_K: ffn_down and attn_output Q3_K, the 640-wide rest Q4_0/Q5_0; Q3_K_M: Q4_K/Q5_K and
# fallbacks). Q3_K_S keeps ffn_down and attn_output at Q3_K; `pure` (llama-quantize --pure) gives
# every matrix the named type, so Q2_K with pure=True is the file that holds Q2_K blocks here.
TYPES = {
    "Q2_K": "LLAMA_FTYPE_MOSTLY_Q2_K",
    "Q3_K_S": "LLAMA_FTYPE_MOSTLY_Q3_K_S",
    "Q3_K_M": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    "Q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "Q5_1": "LLAMA_FTYPE_MOSTLY_Q5_1",
    "IQ4_NL": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
    "IQ4_XS": "LLAMA_FTYPE_MOSTLY_IQ4_XS",
    # the one codebook type llama.cpp quantizes without an importance matrix (IQ3_XXS, IQ2_XS and
    # IQ2_S refuse: "this quantization requires an imatrix")
    "IQ3_S": "LLAMA_FTYPE_MOSTLY_IQ3_S",
}
# the token embedding (tied: also the output head) of a --pure file: Q8_0, what llama.cpp's mixes
# give it on the 270M (rows of 640 are no whole K-quant block), so only the matrices change
PURE_TOKEN_EMBEDDING = "Q8_0"

TIMEOUT_S = 600.0


def quantize(src: Path | str, dst: Path | str, qtype: str, *, pure: bool = False, threads: int | None = None) -> dict:
    """Write `dst` (type `qtype`, a key of TYPES; `pure`: llama-quantize --pure, every matrix but
    the token embedding of that type where its rows allow) from `src` with llama.cpp's quantizer, in the peer
    venv's python (tools/llama_cpp_server.python()). Returns {"type": qtype, "bytes": file size,
    "tensor_types": {tensor name: ggml type name}}. Raises FileNotFoundError when the peer venv is
    not built (`make peer-server`)."""
    from tools import llama_cpp_server as peer

    if qtype not in TYPES:
        raise ValueError(f"unknown type {qtype!r}; one of {', '.join(TYPES)}")
    exe = peer.python()
    if exe is None:
        raise FileNotFoundError(f"llama-cpp-python is not built: run `make peer-server` (no {peer.STAMP})")
    cmd = [str(exe), __file__, str(src), str(dst), qtype, "--threads", str(threads or os.cpu_count() or 1)]
    cmd += ["--pure"] if pure else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp's quantizer failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"type": qtype, "pure": pure, "bytes": Path(dst).stat().st_size, "tensor_types": tensor_types(dst)}


def tensor_types(path: Path | str) -> dict[str, str]:
    """Each tensor's ggml type name in a GGUF, read with the `gguf` package (the project's venv)."""
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}


def ggml_dequantize(raw: npt.NDArray[np.uint8], type_name: str, n: int) -> npt.NDArray[np.float32]:
    """`n` values of ggml type `type_name` ("Q3_K", "IQ4_XS", ...) from their blocks `raw`, by
    llama.cpp's own `dequantize_row_*` (libggml-base of the peer venv, through ctypes): what
    llama.cpp computes with. Tests compare our reader's values with these, bit for bit."""
    import ctypes

    import numpy as np

    lib = ctypes.CDLL(str(_ggml_base()))
    fn = getattr(lib, "dequantize_row_" + type_name.lower().replace("_k", "_K"))
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.empty(n, dtype=np.float32)
    fn(raw.ctypes.data, out.ctypes.data, n)
    return out


_GGML_BASE: list[Path] = []


def _ggml_base() -> Path:
    """libggml-base of the llama_cpp package in the peer venv (asked of its python once)."""
    from tools import llama_cpp_server as peer

    if not _GGML_BASE:
        exe = peer.python()
        if exe is None:
            raise FileNotFoundError(f"llama-cpp-python is not built: run `make peer-server` (no {peer.STAMP})")
        code = "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / 'lib')"
        lib = Path(subprocess.run([str(exe), "-c", code], capture_output=True, text=True, check=True).stdout.strip())
        found = (
            sorted(lib.glob("libggml-base.so*"))
            + sorted(lib.glob("libggml-base*.dylib"))
            + sorted(lib.glob("ggml-base.dll"))
        )
        if not found:
            raise FileNotFoundError(f"no libggml-base in {lib}")
        _GGML_BASE.append(found[0])
    return _GGML_BASE[0]


def _main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("type", choices=sorted(TYPES))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--pure", action="store_true", help="every matrix of TYPE (llama-quantize --pure)")
    args = ap.parse_args(argv)

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, TYPES[args.type])
    params.nthread = args.threads
    params.allow_requantize = True  # the input is already quantized (the embedded file is Q4_K_M)
    if args.pure:
        params.pure = True
        params.token_embedding_type = getattr(llama_cpp, f"GGML_TYPE_{PURE_TOKEN_EMBEDDING}")
    llama_cpp.llama_backend_init()
    rc = llama_cpp.llama_model_quantize(args.src.encode(), args.dst.encode(), params)
    if rc != 0:
        print(f"llama_model_quantize returned {rc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
