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


def test_bench_command_prints_measured_json(vk_device, tiny_path):
    proc = cli(
        "bench",
        "--model",
        str(tiny_path),
        "--backend",
        "vulkan",
        "--prompt-tokens",
        "16",
        "--gen-tokens",
        "4",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["backend"] == "vulkan" and r["prompt_tokens"] == 16 and r["gen_tokens"] == 4
    assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["copy_gb_s"] > 0
    assert r["decode_pct_of_copy"] == pytest.approx(100 * r["decode_gb_s"] / r["copy_gb_s"], rel=1e-3)
    table = cli("bench", "--model", str(tiny_path), "--backend", "cpu", "--prompt-tokens", "8", "--gen-tokens", "2")
    assert table.returncode == 0, table.stderr
    assert "decode_tok_s" in table.stdout and "cpu" in table.stdout
