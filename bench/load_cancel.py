"""How soon a GPU load stops after Cancel is pressed while it times its kernels.

    python -m bench.load_cancel [--synthetic 27b | --model PATH] [--after 2,10,25] [--compare] [--autotune]

The first load of a model on a GPU spends most of its time timing kernel candidates (tens of
seconds on an H200 for the 27B). Cancel is asked before each candidate (timing.interrupt); this
presses it `--after` seconds into the timing and reports the seconds until the load raised.
`--compare` repeats each press with the in-stage asking turned off (the load then stops only
between timing stages, as before it existed), in the same run. No tuning record is read.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from bench.model_file import model_file
from phoenix_chat.engine.errors import CancelledError


def one_press(path: Path, after_s: float, context: int, autotune: bool | None = None) -> dict[str, object]:
    """Load `path`, press Cancel `after_s` into the timing; what happened and how long it took."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.weights import open_weights

    event = threading.Event()
    pressed: list[float] = []
    timers: list[threading.Timer] = []

    def press() -> None:
        pressed.append(time.perf_counter())
        event.set()

    def progress(fraction: float, message: str) -> None:
        if message.startswith("timing the kernels") and not timers:
            timers.append(threading.Timer(after_s, press))
            timers[0].start()

    options = VulkanOptions(allow_software=True, tuning_record="off", autotune=autotune)
    t0 = time.perf_counter()
    try:
        backend = VulkanBackend(open_weights(path), context, options, progress=progress, cancel=event)
    except CancelledError:
        stop = time.perf_counter()
        return {"after_s": after_s, "stopped": True, "latency_s": round(stop - pressed[0], 3)}
    finally:
        for t in timers:
            t.cancel()
    backend.close()
    return {"after_s": after_s, "stopped": False, "load_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", help="a GGUF (default: the embedded 270M)")
    ap.add_argument("--synthetic", help="a shape of tools/make_synthetic_gguf.py (q4_0), e.g. 27b")
    ap.add_argument("--after", default="2,10,25", help="comma-separated seconds into the timing")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--compare", action="store_true", help="also with the in-stage asking off")
    ap.add_argument("--autotune", action="store_true", help="time kernels on a CPU Vulkan device too (a smoke run)")
    ap.add_argument("--workdir", default="/tmp/phoenix-bench")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from phoenix_chat.engine.backends.vulkan import timing

    path = model_file(args.model, args.synthetic, args.workdir)
    rows: list[dict[str, object]] = []
    real_interrupt = timing.interrupt
    for in_stage in [True, False] if args.compare else [True]:
        # off: the comparison's "before" (the load asks Cancel only between timing stages)
        timing.interrupt = real_interrupt if in_stage else (lambda dev: None)  # type: ignore[assignment]
        try:
            for after in (float(a) for a in args.after.split(",")):
                row = {"in_stage": in_stage, **one_press(path, after, args.context, True if args.autotune else None)}
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            timing.interrupt = real_interrupt  # type: ignore[assignment]
    if args.json:
        Path(args.json).write_text(json.dumps({"model": str(path), "presses": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
