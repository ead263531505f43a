"""The autotuner's picks for `phoenix-chat doctor`, read from a loaded VulkanBackend, and their
Markdown (with the measurement's line).

Nothing is re-timed here: the picks and timings are what the load recorded (autotune.Tuning via
the backend's stats()). Per matvec key the record keeps the winning candidate's time only; the
fusions keep fused against separate, the GEMM tiles and the few-token path every candidate.
CPU devices (lavapipe) are not timed at load: their picks are the defaults, and `timed` says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend

TUNING_KEYS = (
    "matvec_tuning",
    "qkv_rope",
    "qkv_rope_timing",
    "geglu_q8_1",
    "geglu_q8_1_timing",
    "gemm_kernel",
    "gemm_timing",
    "gemm_kernel_few",
    "gemm_few_timing",
    "few_token_matvec",
    "few_token_timing",
)


def tuning_picks(be: VulkanBackend) -> dict[str, Any]:
    """The load-time choices and their recorded timings (µs for kernels, ms for forwards)."""
    from phoenix_chat.engine.backends.vulkan import ops_gemm

    stats = be.stats()
    caps = be.dev.caps
    out: dict[str, Any] = {
        "timed": bool(stats.get("matvec_tuning")),
        "context_length": be.context_length,
        "int8_activations": stats["int_dot"],
        "prefill_gemm": stats["prefill_gemm"],
        "gemm_kernel_default": ops_gemm.kernel(be.dev),
        "attention_splits": be.plan.n_splits,  # ops_attention.default_splits: by context length, not timed
        "weights_heap": stats["weights_heap"],
        "memory_budget": stats.get("memory_budget"),
        "int8_activations_why": stats.get("int_dot_why"),
        "record": stats.get("tuning_record"),  # timed at this load, and where it was kept for later loads
    }
    out.update({k: stats[k] for k in TUNING_KEYS if k in stats})
    if caps.is_software:
        out["note"] = "not timed at load: a CPU device keeps the defaults"
    return out


def _spec(d: dict[str, Any]) -> str:
    shape = " ".join(f"{k}={v}" for k, v in d.items() if k not in ("us", "int8", "norm_tail"))
    path = {True: "int8", False: "f32", "regs": "int8-in-registers"}.get(d.get("int8"), str(d.get("int8")))
    return f"{path} {shape}".strip()


def _why(reason: str | None) -> str:
    return f" ({reason})" if reason else ""


def _timings(d: dict[str, Any], unit: str) -> str:
    return ", ".join(f"{k} {v} {unit}" for k, v in d.items())


def tuning_lines(t: dict[str, Any]) -> list[str]:
    """Markdown bullets for one device's tuning record (or its one-line failure)."""
    if "error" in t or "skipped" in t:
        return [f"- autotuner: {t.get('error') or t.get('skipped')}"]
    head = "timed at load" if t["timed"] else t.get("note", "not timed")
    lines = [
        f"- autotuner ({head}; context {t['context_length']}): int8 activations {t['int8_activations']}"
        f"{_why(t.get('int8_activations_why'))}; weights in {t['weights_heap']}{_why(t.get('memory_budget'))}; "
        f"attention: {t['attention_splits']} splits of the context "
        "(by context length, not timed)"
    ]
    mv = t.get("matvec_tuning") or {}
    if mv:
        parts = []
        for key, d in mv.items():
            tail = "" if "norm_tail" not in d else (", norm in its tail" if d["norm_tail"] else ", norm separate")
            parts.append(f"{key}: {_spec(d)} {d['us']} µs{tail}")
        lines.append("- matvec picks (the winner's time per matrix kind): " + "; ".join(parts))
    else:
        lines.append("- matvec picks: none timed (default shape for every matrix)")
    for name, label in (("qkv_rope", "QKV + rope in one kernel"), ("geglu_q8_1", "GEGLU writes down's q8_1")):
        pick = t.get(name)
        timing = t.get(f"{name}_timing")
        got = f"yes ({_spec(pick)})" if pick else "no"
        lines.append(f"- {label}: {got}" + (f"; timed {_timings(timing, 'µs')}" if timing else "; not timed"))
    gemm = t.get("gemm_kernel") or f"{t['gemm_kernel_default']} (the device's own)"
    lines.append(
        f"- prefill GEMM: {t['prefill_gemm']}; kernel {gemm}"
        + (f"; tiles timed (one chunk): {_timings(t['gemm_timing'], 'ms')}" if t.get("gemm_timing") else "")
    )
    if t.get("gemm_few_timing") or t.get("gemm_kernel_few"):
        lines.append(
            f"- GEMM of short forwards: {t.get('gemm_kernel_few') or 'as above'}"
            + (f"; timed: {_timings(t['gemm_few_timing'], 'ms')}" if t.get("gemm_few_timing") else "")
        )
    few = t.get("few_token_matvec") or []
    line = f"- few-token forwards through matvecs at: {', '.join(map(str, few)) or 'none'}"
    if t.get("few_token_timing"):
        cells = [
            f"{n}: {v.get('matvec_ms')}/{v.get('gemm_ms')}" for n, v in sorted(t["few_token_timing"].items(), key=_num)
        ]
        line += "; timed tokens: matvec/GEMM ms " + ", ".join(cells)
    lines.append(line)
    rec = t.get("record") or {}
    if rec.get("path"):
        lines.append(f"- timing took {rec.get('timed_s')} s; kept for later loads in {rec['path']}")
    elif rec.get("not_written"):
        lines.append(f"- not kept for later loads: {rec['not_written']}")
    return lines


def _num(kv: tuple[Any, Any]) -> int:
    return int(kv[0])


def _tokens(n: int) -> str:
    return f"{n} token" + ("" if n == 1 else "s")


def measurement_line(m: dict[str, Any]) -> str:
    """One Markdown bullet for a device's measurement (or its failure, with what came before)."""
    if not m:
        return "- measurement: not run"
    if "error" in m or "skipped" in m:
        done = m.get("partial") or {}
        got = []
        if "copy_gb_s" in done:
            got.append(f"copy {done['copy_gb_s']:.1f} GB/s")
        if "prefill" in done:
            got.append(f"prefill {done['prefill']['tok_s']:.1f} tok/s")
        before = f" (measured before it: {', '.join(got)})" if got else ""
        return f"- measurement: {m.get('error') or m.get('skipped')}{before}"
    p, d = m["prefill"], m["decode"]

    def cold(x: dict[str, Any]) -> str:
        return "" if x["warm"] else ", cold: the budget left no warm run"

    cut = "; cut short by the budget (slow device)" if m["cut_short"] else ""
    return (
        f"- measurement ({m['spent_s']:.1f} s of a {m['budget_s']:g} s budget{cut}): "
        f"copy {m['copy_gb_s']:.1f} GB/s; prefill {p['tok_s']:.1f} tok/s ({_tokens(p['tokens'])}{cold(p)}); "
        f"decode {d['tok_s']:.1f} tok/s ({_tokens(d['tokens'])} in {d['seconds']:.2f} s{cold(d)}) = "
        f"{m['decode_gb_s']:.1f} GB/s of weights, {m['decode_pct_of_copy']:.0f}% of the copy roofline"
    )
