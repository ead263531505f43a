"""How long building a GGUF's tokenizer takes (engine.gguf_vocab): merges derived, whole build.

python -m bench.tokenizer_build [FILE.gguf]      # default: the embedded 270M
"""

from __future__ import annotations

import json
import sys
import time

from phoenix_chat.engine.gguf_vocab import build_gguf_tokenizer, derive_merges
from phoenix_chat.engine.weights import embedded_model_path
from phoenix_chat.engine.weights.gguf_file import GGUFFile


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    meta = GGUFFile(argv[0] if argv else embedded_model_path()).metadata
    t0 = time.perf_counter()
    merges = derive_merges(
        meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"], meta["tokenizer.ggml.token_type"]
    )
    t1 = time.perf_counter()
    built = build_gguf_tokenizer(meta)
    t2 = time.perf_counter()
    print(
        f"{len(merges)} merges in {t1 - t0:.2f} s; whole build {t2 - t1:.2f} s;",
        "'Hello world' ->",
        json.dumps(built.encode("Hello world").ids),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
