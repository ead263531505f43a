"""The benchmark's own numbers are measured, consistent and complete (a tiny synthetic Gemma 3 on
whatever Vulkan device exists, lavapipe in CI; the figures in docs/PERFORMANCE.md come from the
same function on an H100)."""

from __future__ import annotations

import pytest


def test_bench_vulkan_reports_roofline_python_share_and_profile(tiny_path, vk_device):
    from phoenix_chat.engine.bench import run_bench

    r = run_bench(tiny_path, "vulkan", prompt_tokens=24, gen_tokens=6)
    assert r.gen_tokens == 6 and r.prefill_tok_s > 0 and r.decode_tok_s > 0
    assert r.copy_gb_s > 0
    assert r.decode_gb_s == pytest.approx(r.weights_gib * 2**30 * r.decode_tok_s / 1e9)
    assert r.decode_pct_of_copy == pytest.approx(100 * r.decode_gb_s / r.copy_gb_s)
    assert 0 < r.python_pct_of_token < 100
    assert r.decode_profile_us["dispatches"] > 0 and r.decode_profile_us["total"] > 0
    assert isinstance(r.matvec_tuning, dict)  # empty where the device skips autotuning (lavapipe)
    assert "decode_pct_of_copy" in r.table()


def test_bench_cpu_has_no_device_figures(tiny_path):
    from phoenix_chat.engine.bench import run_bench

    r = run_bench(tiny_path, "cpu", prompt_tokens=12, gen_tokens=3)
    assert r.decode_tok_s > 0 and r.copy_gb_s is None and r.decode_pct_of_copy is None
    # peak resident memory in bytes-based GiB: never below what the process holds now (a KiB/byte
    # mix-up would put it 1024x below), and not absurd
    import psutil

    assert psutil.Process().memory_info().rss <= r.peak_host_gib * 2**30 < 64 * 2**30


def test_dispatch_cost_times_barrier_and_flag_handoffs(vk_device, tmp_path):
    """bench.dispatch_cost --handoff (bench/shaders/handoff_probe.comp: barrier vs flag between a small
    kernel and a weight stream) runs its chains to the end on this device and reports every
    figure; a consumer that never saw its producer's flag would hang here instead."""
    import json

    from bench import dispatch_cost

    out = tmp_path / "cost.json"
    assert dispatch_cost.main(["--software", "--scale", "0.001", "--handoff", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    keys = [k for k in got if k.startswith("handoff_")]
    assert len(keys) == 4 * 2 * 4  # matrix sizes x producer lengths x modes
    assert all(got[k] > 0 for k in keys)
    assert got["tiny_dispatch_barrier_us"] > 0 and got["copy_gb_s"] > 0


def test_int_dot_rate_probe_times_every_kind_and_its_dots_agree(vk_device, tmp_path):
    """bench.int_dot_rate (bench/shaders/int_dot_rate.comp): the four instruction kinds are timed
    and their rates reported, and OpSDot + add computes what OpSDotAccSat computes (each is
    emitted by hand as a SPIR-V instruction: a wrong operand order would differ here)."""
    import json

    from bench import int_dot_rate

    if not vk_device.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    out = tmp_path / "rate.json"
    assert int_dot_rate.main(["--software", "--groups", "4", "--iters", "32", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert [r["op"] for r in got["rows"]] == ["sdot + add", "sdot_acc_sat", "f32 fma", "f16vec2 fma"]
    assert all(r["us"] > 0 and r["instr_per_s"] > 0 and r["macs_per_s"] > 0 for r in got["rows"])
    assert got["dot_kinds_agree"] is True


def test_persistent_chain_probe_matches_the_dispatch_chain(vk_device, tmp_path):
    """bench.persistent_chain (bench/shaders/persistent_probe.comp): the one-dispatch version of a
    layer chain, its phases separated by grid barriers, leaves the same activations as one
    dispatch per phase (a barrier that let a workgroup run ahead would not), no wait times out,
    every arrival is counted, and every figure is reported. One workgroup: on lavapipe runs of
    two lose arrivals (the probe marks them invalid), so only one is valid there."""
    import json

    from bench import persistent_chain

    out = tmp_path / "persistent.json"
    assert (
        persistent_chain.main(
            ["--software", "--scale", "0.001", "--groups", "1", "--pre", "4", "--layers", "2", "--json", str(out)]
        )
        == 0
    )
    got = json.loads(out.read_text())
    assert got["persistent_g1_pre4_matches_chain"] is True
    assert got["persistent_g1_pre4_valid"] is True and got["fused_g1_pre4_valid"] is True
    for k in (
        "chain",
        "streams",
        "chain_norm_in_stream",
        "chain_norm_in_stream_g1",
        "persistent_g1_pre4",
        "fused_g1_pre4",
    ):
        assert got[f"{k}_us_per_layer"] > 0 and got[f"{k}_pct_of_copy"] > 0


def test_verify_cost_times_multi_token_passes_against_a_decode_token(vk_device, tiny_path, tmp_path):
    """bench.verify_cost: speculative decoding's verify pass (k + 1 tokens, all logits) against
    one decode token, on a tiny synthetic model on this device; every ratio measured."""
    import json

    from bench import verify_cost

    out = tmp_path / "verify.json"
    assert verify_cost.main(["--model", str(tiny_path), "--backend", "vulkan", "--k", "1,4", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["backend"] == "vulkan" and got["decode_token_ms"] > 0 and got["forward_1_token_ms"] > 0
    for k in (1, 4):
        assert got[f"verify_k{k}_ms"] > 0
        assert got[f"verify_k{k}_ratio"] == pytest.approx(got[f"verify_k{k}_ms"] / got["decode_token_ms"])


def test_cols_sweep_times_every_shape_against_single_matvecs(vk_device, tmp_path):
    """bench.cols_sweep on its smoke shape: per matrix and vector count, B single-vector int8
    matvecs, the int8 multi-column shapes (tiles up to twice the count) and the f32 one."""
    import json

    from bench import cols_sweep

    if not vk_device.caps.int_dot:
        pytest.skip("no shaderIntegerDotProduct")
    out = tmp_path / "sweep.json"
    assert (
        cols_sweep.main(["--shape", "tiny", "--batches", "1,3", "--copies", "1", "--rows", "2", "--json", str(out)])
        == 0
    )
    got = json.loads(out.read_text())
    kinds = {(r["matrix"], r["B"]): set() for r in got}
    for r in got:
        assert r["us"] > 0
        kinds[(r["matrix"], r["B"])].add(r["kind"])
    for (_m, B), ks in kinds.items():
        assert ks == {"int8 x B", "cols r2 t4"} | ({"f32 cols"} if B == 3 else set()), (B, ks)


def test_gemm_sweep_times_each_kernel_on_every_product(vk_device, tmp_path):
    """bench.gemm_sweep on its smoke shape: every GEMM kernel the device has, per weight type
    and product, with its time and its distance from the first kernel's output (0 for itself)."""
    import json

    from bench import gemm_sweep
    from phoenix_chat.engine.backends.vulkan import ops_gemm

    out = tmp_path / "gemm.json"
    assert gemm_sweep.main(["--shape", "tiny", "--types", "q4_0,f16", "--tokens", "40", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    kernels = gemm_sweep.kernels_of(vk_device, None)
    gpu_int8 = list(ops_gemm.INT8_KERNELS) if vk_device.caps.int_dot and not vk_device.caps.is_software else []
    # matrix cores: the generic tiles, the few-token and prefill tiles built in registers
    matrix_cores = [*ops_gemm.COOPMAT_KERNELS, *ops_gemm.CF_KERNELS, *ops_gemm.CF_PREFILL_KERNELS]
    assert kernels == (matrix_cores if ops_gemm.coopmat_ok(vk_device) else [ops_gemm.kernel(vk_device)]) + gpu_int8
    assert {(r["type"], r["matrix"]) for r in got} == {(t, m) for t in ("Q4_0", "F16") for m in ("qkv", "gate_up")}
    for r in got:
        assert r["kernel"] in kernels and r["us"] > 0 and r["tflops"] > 0
        assert r["max_rel_diff"] < 1e-2  # every kernel computes the same product
    if not vk_device.caps.int_dot:
        return
    # an int8 tile named on the command line (timed with its quantize of x) runs the types it
    # reads and is left out of the others' rows (F16 has no int8 unpacking)
    base = ops_gemm.kernel(vk_device)
    args = ["--shape", "tiny", "--types", "q4_0,f16", "--tokens", "40", "--kernels", f"{base},int8_1"]
    assert gemm_sweep.main([*args, "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert {r["kernel"] for r in got if r["type"] == "Q4_0"} == {base, "int8_1"}
    assert {r["kernel"] for r in got if r["type"] == "F16"} == {base}
    assert all(r["max_rel_diff"] < 1e-2 for r in got)  # q8_1 x: ~0.5% from the f32 kernel


def test_bench_suite_writes_every_backend_and_the_llama_cpp_side_by_side(vk_device, tmp_path):
    """`python -m bench.run` end to end on a tiny synthetic shape: our two backends, then llama.cpp
    on the same file — measured with ratios where llama-cpp-python is installed, else an entry
    saying it is not (never invented figures)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--synthetic",
            "tiny",
            "--backends",
            "vulkan,cpu",
            "--workdir",
            str(tmp_path),
            "--prompt-tokens",
            "8",
            "--gen-tokens",
            "3",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(out.read_text())
    assert [r["backend"] for r in runs[:2]] == ["vulkan", "cpu"] and all(r["decode_tok_s"] > 0 for r in runs[:2])
    peer = runs[2]
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        assert peer["error"] == "llama-cpp-python not installed"
    else:
        assert peer["backend"] == "llama.cpp-cpu" and peer["decode_tok_s"] > 0
        assert peer["ratios"]["cpu"]["decode"] == pytest.approx(runs[1]["decode_tok_s"] / peer["decode_tok_s"])


def test_bench_synthetic_types_bench_one_file_per_type(tmp_path):
    """`--synthetic-types`: one synthetic file per weight type (issue 25's 27B Q2_K/Q3_K/IQ4_XS
    beside Q4_0), each benched under its own label and holding that type."""
    import json
    import subprocess
    import sys

    from phoenix_chat.engine.weights import open_weights

    out = tmp_path / "bench.json"
    args = ["--synthetic", "tiny", "--synthetic-types", "q4_1,q2_k", "--backends", "cpu", "--no-llama-cpp"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", *args, "--workdir", str(tmp_path), "--prompt-tokens", "8"]
        + ["--gen-tokens", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert [r["label"] for r in json.loads(out.read_text())] == ["tiny-q4_1", "tiny-q2_k"]
    for wtype in ("q4_1", "q2_k"):
        w = open_weights(tmp_path / f"synthetic-tiny-{wtype}.gguf")
        try:
            assert wtype.upper() in {t.qtype.name for t in w.tensors.values()}
        finally:
            w.close()


def test_sampler_sweep_times_each_block_shape_and_they_draw_alike(vk_device, tmp_path):
    """bench.sampler_sweep on a small case: every top-k block shape and the argmax timed, the
    shapes' draws identical, each row's draw among its row's 40 largest logits."""
    import json

    import numpy as np

    from bench import sampler_sweep

    out = tmp_path / "sampler.json"
    rows, vocab = 3, 20000
    args = ["--software", "--rows", str(rows), "--vocab", str(vocab), "--shapes", "256x1024,512x2048"]
    assert sampler_sweep.main([*args, "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert set(got["us"]) == {"topk 256x1024", "topk 512x2048", "argmax 256x1024"}
    assert all(us > 0 for us in got["us"].values())
    assert got["agree"] and got["draws"]["topk 256x1024"] == got["draws"]["topk 512x2048"]
    logits = (np.random.default_rng(0).standard_normal((rows, vocab)) * 3).astype(np.float32)
    for r, tok in enumerate(got["draws"]["topk 512x2048"]):
        assert tok in set(np.argsort(-logits[r])[:40].tolist())
    assert got["draws"]["argmax 256x1024"] == np.argmax(logits, axis=1).tolist()


def test_batched_decode_cli_times_the_pipelined_run_and_step_by_step_beside_it(tmp_path, capsys):
    """`python -m bench.batched_decode --step-by-step` on the tiny shape: the pipelined run at
    every stream count and, on the same load, one decode_batch_sampled call a step at each count
    of 2+, every figure with its steps and a rate, the step-by-step table printed."""
    import json

    from bench import batched_decode

    out = tmp_path / "b.json"
    args = ["--synthetic", "tiny", "--workdir", str(tmp_path), "--streams", "1,2,3", "--steps", "2"]
    assert batched_decode.main([*args, "--prompt", "8", "--context", "32", "--step-by-step", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert [r["streams"] for r in got["batched"]] == [1, 2, 3]
    assert [r["streams"] for r in got["step_by_step"]["batched"]] == [2, 3]
    for r in got["batched"] + got["step_by_step"]["batched"]:
        assert r["aggregate_tok_s"] > 0 and r["steps"] == 2
    assert "step by step" in capsys.readouterr().out


def test_load_cancel_bench_stops_each_load_it_presses_cancel_in(tmp_path):
    """`python -m bench.load_cancel --compare` on the tiny shape, its kernels timed on lavapipe:
    Cancel pressed as the timing starts stops the load both with the in-stage asking and without
    it (then at the first stage's end), each with a latency; the comparison's patch is undone."""
    import json

    from bench import load_cancel
    from phoenix_chat.engine.backends.vulkan import timing

    real = timing.interrupt
    out = tmp_path / "c.json"
    args = ["--synthetic", "tiny", "--workdir", str(tmp_path), "--after", "0", "--context", "32"]
    assert load_cancel.main([*args, "--autotune", "--compare", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["presses"]
    assert [(r["in_stage"], r["stopped"]) for r in rows] == [(True, True), (False, True)], rows
    assert all(r["latency_s"] >= 0 for r in rows) and timing.interrupt is real
