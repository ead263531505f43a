"""Peak process memory while a model loads on the Vulkan backend, against the weights' size.

    python -m bench.load_rss [--model PATH ...] [--synthetic 1b:q4_0 ...] [--context 512] [--json F]

Each model loads in a fresh process through the real loader (`engine.loader.load`,
backend "vulkan": lavapipe here, a UMA device). A thread samples /proc/self/status every 2 ms:
private memory (RssAnon + RssShmem: heap, and device memory on a CPU or UMA driver) and
file-backed pages (RssFile: the memory-mapped GGUF, page cache the kernel can drop), from just
before the load (Vulkan device open, imports done) to the end. On a UMA device the weights
should be in memory once: private growth ~1x the weights (their device copy, which on lavapipe
is process memory) plus the KV cache and activations; a second full copy in process RAM
would show as ~2x.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")


def status_kib() -> dict[str, int]:
    """The memory lines of /proc/self/status, in KiB."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in FIELDS:
                out[key] = int(rest.split()[0])
    return out


class Sampler(threading.Thread):
    """Peak private (anon + shmem) and file-backed RSS while running."""

    def __init__(self, period_s: float = 0.002):
        super().__init__(daemon=True)
        self.period_s, self.stop_flag = period_s, threading.Event()
        self.peak_private = self.peak_file = self.peak_total = 0

    def sample(self) -> None:
        s = status_kib()
        self.peak_private = max(self.peak_private, s["RssAnon"] + s.get("RssShmem", 0))
        self.peak_file = max(self.peak_file, s["RssFile"])
        self.peak_total = max(self.peak_total, s["VmRSS"])

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.sample()
            time.sleep(self.period_s)

    def stop(self) -> None:
        self.stop_flag.set()
        self.join()
        self.sample()


def measure_here(path: str | None, context: int, via: str) -> dict[str, Any]:
    """Load `path` (None: the embedded model) on Vulkan in this process; memory in MiB.
    via "loader": engine.loader.load, the app's path (tokenizer and chat template included);
    "backend": VulkanBackend on the opened weights, the loader's weight path without the
    tokenizer (synthetic GGUFs have no vocabulary, so the loader refuses them)."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.loader import load
    from phoenix_chat.engine.weights import embedded_model_path, open_weights

    file = Path(path) if path else embedded_model_path()
    w = open_weights(file)
    weights_bytes = sum(t.nbytes for t in w.tensors.values())
    w.close()
    Device.open(allow_software=True).close()  # driver loaded, instance made: not counted as the load's
    base = status_kib()
    sampler = Sampler()
    sampler.start()
    t0 = time.perf_counter()
    if via == "loader":
        model = load(str(file), backend="vulkan", context_length=context)
        backend = model.backend
    else:
        backend = VulkanBackend(open_weights(file), context, VulkanOptions(allow_software=True))
    seconds = time.perf_counter() - t0
    sampler.stop()
    after = status_kib()
    kv = int(getattr(backend, "budget", {}).get("kv_cache", 0))
    out = {
        "model": file.name,
        "via": via,
        "device": backend.device_name,
        "weights_mib": weights_bytes / 2**20,
        "file_mib": file.stat().st_size / 2**20,
        "kv_cache_mib": kv / 2**20,
        "load_s": seconds,
        "base_private_mib": (base["RssAnon"] + base.get("RssShmem", 0)) / 1024,
        "peak_private_mib": sampler.peak_private / 1024,
        "after_private_mib": (after["RssAnon"] + after.get("RssShmem", 0)) / 1024,
        "peak_file_mib": sampler.peak_file / 1024,
        "after_file_mib": after["RssFile"] / 1024,
        "peak_rss_mib": sampler.peak_total / 1024,
        "base_rss_mib": base["VmRSS"] / 1024,
    }
    backend.close()
    out["private_growth_x_weights"] = (out["peak_private_mib"] - out["base_private_mib"]) / out["weights_mib"]
    out["rss_growth_x_weights"] = (out["peak_rss_mib"] - out["base_rss_mib"]) / out["weights_mib"]
    return out


def measure(path: str | None, context: int, via: str) -> dict[str, Any]:
    """measure_here in a fresh process (peaks and the page cache of one load do not leak into the next)."""
    cmd = [sys.executable, "-m", "bench.load_rss", "--child", "--context", str(context), "--via", via]
    cmd += ["--model", path] if path else []
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"load of {path or 'the embedded model'} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def synthetic(spec: str, folder: Path) -> str:
    """'1b:q4_0' -> a synthetic GGUF of that shape and type (tools/make_synthetic_gguf.py)."""
    from tools.make_synthetic_gguf import write

    shape, qtype = spec.split(":")
    out = folder / f"synthetic-{shape}-{qtype}.gguf"
    if not out.exists():
        write(out, shape, qtype, qtype, seed=1)
    return str(out)


def row(r: dict[str, Any]) -> str:
    return (
        f"| {r['model']} | {r['via']} | {r['weights_mib']:.0f} | {r['kv_cache_mib']:.0f} | "
        f"{r['peak_private_mib'] - r['base_private_mib']:.0f} | {r['private_growth_x_weights']:.2f}x | "
        f"{r['peak_file_mib']:.0f} | {r['peak_rss_mib'] - r['base_rss_mib']:.0f} | {r['rss_growth_x_weights']:.2f}x |"
    )


HEADER = (
    "| model | via | weights MiB | KV MiB | peak private growth MiB | x weights | peak file-backed MiB "
    "| peak RSS growth MiB | x weights |\n|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="GGUF file (repeatable; default: the embedded 270M)")
    ap.add_argument("--synthetic", action="append", default=[], help="SHAPE:TYPE, e.g. 1b:q4_0 (repeatable)")
    ap.add_argument("--folder", default="/tmp", help="where synthetic GGUFs are written")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--via", choices=["loader", "backend"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure_here(args.model[0] if args.model else None, args.context, args.via)))
        return 0
    runs: list[tuple[str | None, str]] = []
    for p in args.model or ([] if args.synthetic else [None]):
        runs += [(p, "loader"), (p, "backend")]
    runs += [(synthetic(s, Path(args.folder)), "backend") for s in args.synthetic]
    results = [measure(p, args.context, via) for p, via in runs]
    print(HEADER)
    for r in results:
        print(row(r))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
