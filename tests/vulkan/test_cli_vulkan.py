"""The command line's device choices, end to end in subprocesses, on whatever Vulkan device exists
(lavapipe in CI): `auto` passes over a software renderer and says why, `--device N` picks a
device or fails cleanly, and `bench` prints its measurements as JSON."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import cli


def test_auto_passes_over_a_software_renderer_and_says_why(vk_device):
    if not vk_device.caps.is_software:
        pytest.skip(f"{vk_device.name} is a hardware GPU: auto takes it")
    proc = cli("-v", "run", "The sky is", "--raw", "--max-tokens", "1")
    assert proc.returncode == 0, proc.stderr
    assert "auto: CPU backend, because no Vulkan device: only software renderers" in proc.stderr
    assert "[cpu:" in proc.stderr


def test_device_index_out_of_range_exits_2_with_the_reason(vk_device):
    proc = cli("run", "The sky is", "--raw", "--max-tokens", "1", "--backend", "vulkan", "--device", "99")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no Vulkan device: index 99 out of range" in proc.stderr


def test_device_index_picks_that_device(vk_device, tiny_path):
    proc = cli(
        "bench",
        "--model",
        str(tiny_path),
        "--backend",
        "vulkan",
        "--device",
        str(vk_device.caps.index),
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "2",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["device"] == vk_device.name


@pytest.fixture(scope="module")
def tiny_bench(vk_device, tiny_path):
    """tiny_bench(*flags): `bench --json` of the tiny file (16 + 4 tokens) with those flags, run once."""
    runs: dict[tuple[str, ...], dict] = {}

    def run(*flags: str) -> dict:
        if flags not in runs:
            args = ["--model", str(tiny_path), "--prompt-tokens", "16", "--gen-tokens", "4", *flags, "--json"]
            proc = cli("bench", *args)
            assert proc.returncode == 0, proc.stderr
            runs[flags] = json.loads(proc.stdout)
        return runs[flags]

    return run


def test_bench_command_prints_measured_json(tiny_bench, tiny_path):
    r = tiny_bench("--backend", "vulkan")
    assert r["backend"] == "vulkan" and r["prompt_tokens"] == 16 and r["gen_tokens"] == 4
    assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["copy_gb_s"] > 0
    assert r["decode_pct_of_copy"] == pytest.approx(100 * r["decode_gb_s"] / r["copy_gb_s"], rel=1e-3)
    table = cli("bench", "--model", str(tiny_path), "--backend", "cpu", "--prompt-tokens", "8", "--gen-tokens", "2")
    assert table.returncode == 0, table.stderr
    assert "decode_tok_s" in table.stdout and "cpu" in table.stdout


def test_bench_ctx_and_quant_reach_the_backend(tiny_bench):
    """--ctx sizes the measured backend's KV cache and --quant re-quantizes its matrices: the result
    names both as the backend holds them (its context, KV bytes and its own count of the types it
    uploaded), against the same bench without the flags (the file's Q4_0, context 16 + 4 + 8)."""
    plain, flagged = (
        tiny_bench("--backend", "vulkan"),
        tiny_bench("--backend", "vulkan", "--ctx", "200", "--quant", "q8_0"),
    )
    assert plain["context_length"] == 16 + 4 + 8 and plain["quant"] == "file"
    assert flagged["context_length"] == 200 and flagged["quant"] == "q8_0"
    assert flagged["kv_cache_gib"] > plain["kv_cache_gib"] > 0
    assert set(plain["weight_types"]) == {"Q4_0", "Q8_0", "F32"} and plain["weight_types"]["Q8_0"] == 1  # the embedding
    assert set(flagged["weight_types"]) == {"Q8_0", "F32"}  # every matrix (and the Q8_0 embedding)
    assert flagged["weights_gib"] > 1.5 * plain["weights_gib"]  # 34-byte blocks against 18
    cpu = tiny_bench("--backend", "cpu", "--quant", "q8_0")  # values rounded to Q8_0, computed in f32
    assert cpu["quant"] == "q8_0" and set(cpu["weight_types"]) == {"Q8_0", "F32"}
    assert cpu["context_length"] == 16 + 4 + 8


def _streams_bench(*extra):
    """The many-stream bench on the embedded 270M (its scheduler tokenizes: the tiny file has no
    vocabulary), four streams: the one point's figures."""
    proc = cli(
        "bench",
        "--backend",
        "vulkan",
        "--streams",
        "4",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "6",
        "--chat-turns",
        "0",
        *extra,
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    [point] = json.loads(proc.stdout)["points"]
    return point


def test_bench_streams_mixed_sampling_batches_greedy_and_top_k_rows_in_one_recording(vk_device):
    """--mixed-sampling: two of the four streams draw greedy on the device and two top-k (the
    backend's sampler counts), in batched steps recorded once per bucket whatever the split of
    rows (4 streams joining one by one: buckets 2 and 4; recorded per split it was 3 or more).
    Without it every stream samples top-k."""
    mixed = _streams_bench("--mixed-sampling")
    assert mixed["max_batch"] == 4
    assert mixed["gpu_sampled"]["argmax"] >= 2 * 6 - 2 and mixed["gpu_sampled"]["topk"] >= 2 * 6 - 2
    assert 1 <= mixed["batch_recordings"] <= 2
    plain = _streams_bench()
    assert plain["gpu_sampled"]["argmax"] == 0 and plain["gpu_sampled"]["topk"] >= 4 * 6 - 4
