"""bench/vision_encode.py smoked on whatever Vulkan device exists (--tiny: a small tower and the
tiny text shape): it encodes, profiles and prefills, and prints its table."""

from __future__ import annotations

import json

from bench import vision_encode


def test_vision_bench_tiny(vk_device, tmp_path, capsys):
    out = tmp_path / "vision.json"
    argv = ["--tiny", "--warmup", "1", "--repeats", "2", "--workdir", str(tmp_path), "--json", str(out)]
    assert vision_encode.main(argv + ["--matrix-types", "F16,Q8_0"]) == 0
    text = capsys.readouterr().out
    assert "encode ms (wall)" in text and "with_picture" in text and "as_text" in text
    res = json.loads(out.read_text())
    assert [r["matrix_type"] for r in res["tower"]] == ["F16", "Q8_0"]
    assert all(r["wall_ms"][0] > 0 for r in res["tower"])
    # the device tower vs the numpy reference (the synthetic f32 weights rounded to each type):
    # measured on lavapipe F16 8.1e-4 / 1.6e-4, Q8_0 2.0e-2 / 4.5e-3 (tower / soft tokens)
    f16, q8 = (r["accuracy"] for r in res["tower"])
    assert f16["tower_max_abs_err"] < 5e-3 and f16["soft_max_abs_err"] < 5e-3
    assert q8["tower_max_abs_err"] < 0.1 and q8["soft_max_abs_err"] < 0.1
    assert "accuracy vs the numpy reference" in text
    assert res["prefill"]["image_tokens"] == 16 and res["prefill"]["with_picture_ms"][0] > 0
    if vk_device.caps.timestamp_bits:
        ops = res["tower"][0]["ops_ms"]
        assert {"attention", "qkv", "fc1", "fc2", "projection"} <= set(ops)
