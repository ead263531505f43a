"""The decode L2 prefetch (shaders/prefetch.comp, engine/backends/vulkan/prefetch.py): it reads
exactly the bytes it is given (its effect on a model's results: test_backend.py)."""
from __future__ import annotations

import numpy as np

from engine.backends.vulkan import prefetch


def test_prefetch_kernel_reads_its_range(vk_device):
    """Invocation 0 XORs the 16-byte vectors 0, S, 2S, ... (S = invocations) of its binding below
    n; its sink write happens only when that equals `magic`, so a correct magic proves the reads."""
    dev = vk_device
    stride = prefetch.GROUPS * prefetch.WG
    data = np.random.default_rng(0).integers(0, 2**32, (5 * stride + 3) * 4, dtype=np.uint32)
    w, sink = dev.buffer(data.nbytes), dev.buffer(256)
    dev.upload(w, data)
    vecs = data.reshape(-1, 4)
    p = dev.pipeline("prefetch_u32x4", WG=prefetch.WG)
    for n in (1, 4 * stride, 5 * stride + 3):
        want = np.bitwise_xor.reduce(vecs[0:n:stride].reshape(-1))
        dev.upload(sink, np.zeros(64, np.uint32))
        cl = dev.commands()
        cl.dispatch(p, [w, sink], (prefetch.GROUPS, 1, 1), p.push.pack(n=n, magic=int(want)))
        cl.submit()
        got = dev.download(sink, np.uint32, (64,))
        cl.destroy()
        assert got[0] == want, f"n={n}"

