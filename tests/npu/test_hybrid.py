"""The "prefill on NPU" plan on the embedded Gemma 3 270M, with the emulated NPU."""

from __future__ import annotations

import re

import numpy as np
import pytest

from phoenix_chat.engine.errors import DeviceUnavailableError
from tests.npu.emulator import EmulatedXrt

N_PROMPT = 64


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def setup(gguf, npu_test_kernels):
    from phoenix_chat.engine.backends.cpu import CpuBackend

    weights, kernels = gguf, npu_test_kernels
    cpu = CpuBackend(weights, 256)
    text = (__import__("pathlib").Path(__file__).parents[1] / "goldens" / "ppl_text.txt").read_text()
    ids = weights.tokenizer().encode(text)[: N_PROMPT + 1]
    reference = cpu.forward(ids[:N_PROMPT], 0, all_logits=True)  # before the hybrid shares `cpu`
    return weights, kernels, cpu, ids, reference


@pytest.fixture(scope="module")
def hybrid(setup):
    from phoenix_chat.engine.backends.npu_hybrid import NpuHybridBackend

    weights, kernels, cpu, _, _ = setup
    return NpuHybridBackend(weights, 256, xrt=EmulatedXrt(), kernel_dirs=[kernels], decoder=cpu)


def test_int8_prefill_logits_within_tolerance_of_the_cpu_reference(setup, hybrid):
    _, _, _, ids, reference = setup
    logits = hybrid.forward(ids[:N_PROMPT], 0, all_logits=True)
    assert logits.shape == reference.shape
    rel = np.linalg.norm(logits - reference) / np.linalg.norm(reference)
    top1 = (logits.argmax(-1) == reference.argmax(-1)).mean()
    targets = np.array(ids[1 : N_PROMPT + 1])
    nll_ref = -_log_softmax(reference)[np.arange(N_PROMPT), targets].mean()
    nll_npu = -_log_softmax(logits)[np.arange(N_PROMPT), targets].mean()
    # W8A8 (per-channel weights, per-token activations) on all 126 projections: measured on this
    # text rel ≈ 0.10, top-1 ≈ 0.87, +0.03 nats (docs/NPU.md); the bounds leave some margin.
    assert rel < 0.16, rel
    assert top1 > 0.78, top1
    assert abs(nll_npu - nll_ref) < 0.08, (nll_ref, nll_npu)
    st = hybrid.stats()
    assert st["npu_matmuls"] == 7 * hybrid.config.num_layers  # every projection, once per chunk
    assert st["npu_runs"] > 0 and st["npu_bytes_to_device"] > 0 and st["npu_bytes_from_device"] > 0
    assert st["handoff"]["to_decoder_rows"] == N_PROMPT * hybrid.config.num_layers
    assert st["handoff"]["bytes"] == N_PROMPT * hybrid.config.num_layers * hybrid.config.kv_dim * 4 * 2


def test_decode_runs_on_the_cpu_with_the_handed_off_cache(setup, hybrid):
    _, _, cpu, ids, _ = setup
    prompt = ids[: N_PROMPT // 2]
    hybrid.forward(prompt, 0)
    model = hybrid.prefill_model
    for layer in (0, 5):
        held = cpu.model.cache.positions[layer]
        sel = (held >= 0) & (held < len(prompt))
        order = np.argsort(held[sel])
        pre = model.cache.positions[layer]
        psel = (pre >= 0) & (pre < len(prompt))
        assert np.array_equal(cpu.model.cache.k[layer][sel][order], model.cache.k[layer][psel][np.argsort(pre[psel])])
    calls = model.npu_calls
    runs = hybrid.stats()["npu_runs"]
    token = int(ids[len(prompt)])
    decoded = hybrid.forward([token], len(prompt))
    assert model.npu_calls == calls and hybrid.stats()["npu_runs"] == runs  # decode never touches the NPU
    assert np.array_equal(decoded, cpu.forward([token], len(prompt)))  # it is the CPU backend's step
    # the next prompt chunk (a second chat turn) first takes the decoded row back
    before = hybrid.stats()["handoff"]["to_prefill_rows"]
    hybrid.forward(ids[len(prompt) + 1 : len(prompt) + 9], len(prompt) + 1)
    assert hybrid.stats()["handoff"]["to_prefill_rows"] - before == hybrid.config.num_layers
    assert model.cache.positions[0][len(prompt)] == len(prompt)


def test_only_the_chosen_layers_go_to_the_npu(setup):
    from phoenix_chat.engine.backends.npu_hybrid import NpuHybridBackend

    weights, kernels, cpu, ids, _ = setup
    hybrid = NpuHybridBackend(
        weights,
        256,
        xrt=EmulatedXrt(),
        kernel_dirs=[kernels],
        decoder=cpu,
        npu_layers=[0, 17],
        projections=("mlp.down_proj",),
    )
    assert sorted(hybrid.gemm.weights) == ["layers.0.mlp.down_proj", "layers.17.mlp.down_proj"]
    hybrid.forward(ids[:8], 0)
    assert hybrid.prefill_model.npu_calls == 2


def test_unavailable_npu_is_an_error_with_the_reason(setup):
    from phoenix_chat.engine.backends.npu_hybrid import NpuHybridBackend
    from phoenix_chat.npu.detect import npu_status

    weights, _, cpu, _, _ = setup
    status = npu_status()
    if status.available:
        pytest.skip("this machine has a usable NPU")
    with pytest.raises(DeviceUnavailableError) as err:
        NpuHybridBackend(weights, 256, decoder=cpu)
    assert str(err.value) == f"NPU prefill is unavailable: {status.reason}"


def test_emulated_backend_needs_kernels(setup, tmp_path):
    from phoenix_chat.engine.backends.npu_hybrid import NpuHybridBackend

    weights, _, cpu, _, _ = setup
    with pytest.raises(DeviceUnavailableError, match="no built NPU kernels"):
        NpuHybridBackend(weights, 256, xrt=EmulatedXrt(), kernel_dirs=[tmp_path], decoder=cpu)


def test_a_failed_npu_run_reaches_the_user_as_one_line(setup, monkeypatch, capsys):
    from phoenix_chat.app.cli import main
    from phoenix_chat.engine import loader
    from phoenix_chat.engine.backends.npu_hybrid import NpuHybridBackend
    from phoenix_chat.engine.errors import DeviceRunError

    weights, kernels, cpu, ids, _ = setup
    hybrid = NpuHybridBackend(
        weights,
        256,
        xrt=EmulatedXrt(fail_runs=True),
        kernel_dirs=[kernels],
        decoder=cpu,
        npu_layers=[0],
        projections=("mlp.down_proj",),
    )
    message = r"NPU prefill failed: NPU kernel gemm_i8_\S+ ended in state ERT_CMD_STATE_ERROR, not COMPLETED"
    with pytest.raises(DeviceRunError, match=f"^{message}$"):
        hybrid.forward(ids[:8], 0)
    assert hybrid.stats()["handoff"]["count"] == 0  # nothing half-done reached the decoder
    # `phoenix-chat run` on it: the CLI's PhoenixError path, one line on stderr, exit status 2
    # (--raw: the chat format would add run's base-model note)
    monkeypatch.setattr(loader, "_make_backend", lambda *a: (hybrid, "NPU prefill (emulated, failing)"))
    assert main(["run", "Hello", "--raw", "--backend", "npu-hybrid", "--max-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(f"phoenix-chat: error: {message}\n", err), err


def test_load_with_npu_hybrid_reports_why_not(tmp_path, monkeypatch):
    from phoenix_chat import engine
    from phoenix_chat.npu.detect import npu_status

    if npu_status().available:
        pytest.skip("this machine has a usable NPU")
    with pytest.raises(DeviceUnavailableError, match="^NPU prefill is unavailable: "):
        engine.load(backend="npu-hybrid", context_length=128)


class _ProtocolDecoder:
    """A decoder that only exchanges KV rows through export_kv/import_kv (as a Vulkan one would)."""

    def __init__(self, cpu):
        self.cpu, self.model, self.exported, self.imported = cpu, cpu.model, [], []
        self.kv_ring_slots, self.kv_high_water = cpu.kv_ring_slots, 0  # what prefix reuse reads of a Backend

    def forward(self, ids, start_pos, *, all_logits=False, cancel=None):
        return self.cpu.forward(ids, start_pos, all_logits=all_logits, cancel=cancel)

    def decode_tokens(self, *a):
        return None

    def export_kv(self, lo, hi):
        from phoenix_chat.engine.backends.npu_hybrid import _cache_rows

        self.exported.append((lo, hi))
        return _cache_rows(self.cpu.model.cache, lo, hi)

    def import_kv(self, rows):
        from phoenix_chat.engine.backends.npu_hybrid import _write_rows

        self.imported.append(sum(len(p) for _, p, _, _ in rows))
        _write_rows(self.cpu.model.cache, rows)

    def stats(self):
        return {}


def test_kv_handoff_protocol_for_other_decoders(setup):
    from phoenix_chat.engine.backends.npu_hybrid import NpuHybridBackend

    weights, kernels, cpu, ids, _ = setup
    dec = _ProtocolDecoder(cpu)
    hybrid = NpuHybridBackend(
        weights,
        256,
        xrt=EmulatedXrt(),
        kernel_dirs=[kernels],
        decoder=dec,
        npu_layers=[3],
        projections=("self_attn.q_proj",),
    )
    hybrid.forward(ids[:10], 0)
    assert dec.imported == [10 * hybrid.config.num_layers]
    hybrid.forward([ids[10]], 10)
    hybrid.forward(ids[11:15], 11)
    assert dec.exported == [(10, 11)]
    with pytest.raises(ValueError, match="offers no KV hand-off"):
        NpuHybridBackend(weights, 256, xrt=EmulatedXrt(), kernel_dirs=[kernels], decoder=object())


def test_bf16_prefill_is_close_to_the_reference(setup):
    from phoenix_chat.engine.backends.npu_hybrid import NpuHybridBackend

    weights, kernels, cpu, ids, reference = setup
    hybrid = NpuHybridBackend(weights, 256, xrt=EmulatedXrt(), kernel_dirs=[kernels], decoder=cpu, dtype="bf16")
    logits = hybrid.forward(ids[:N_PROMPT], 0, all_logits=True)
    rel = np.linalg.norm(logits - reference) / np.linalg.norm(reference)
    assert rel < 0.02, rel  # measured 0.0045 on 256 tokens (docs/NPU.md)
    assert all(pw.spec.dtype_in == "bf16" for pw in hybrid.gemm.weights.values())


def test_prefix_reuse_prefills_only_the_new_ids_on_the_npu(setup, hybrid):
    """engine/prompt_cache.py over the hybrid: the second turn hands the rows the CPU decoded
    back to the prefill side and runs only its new ids through the NPU (one chunk)."""
    from phoenix_chat.engine.prompt_cache import PromptCache
    from phoenix_chat.engine.sampling import SamplingParams

    _, _, cpu, ids, _ = setup

    class _Model:
        backend = hybrid

    assert hybrid.kv_ring_slots == min(cpu.kv_ring_slots, len(hybrid.prefill_model.cache.positions[0]))
    cache = PromptCache(hybrid)
    greedy = SamplingParams(temperature=0)
    first = ids[:20]
    answer = list(cache.generate(_Model, first, greedy, 4, cache.plan(first)))
    assert cache.tokens == first + answer[:3]  # the last answer token was never fed
    second = first + answer[:3] + ids[30:40]
    plan = cache.plan(second)
    assert (plan.reused, plan.computed) == (23, 10)
    before = dict(hybrid.stats()["handoff"]), hybrid.stats()["npu_matmuls"]
    assert len(list(cache.generate(_Model, second, greedy, 2, plan))) == 2
    after = hybrid.stats()
    layers = hybrid.config.num_layers
    assert after["npu_matmuls"] - before[1] == 7 * layers  # one prefill chunk: the 10 new ids
    assert after["handoff"]["to_prefill_rows"] - before[0]["to_prefill_rows"] == 3 * layers  # decoded rows 20..22
