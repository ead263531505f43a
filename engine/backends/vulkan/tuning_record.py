"""The load-time timing's results kept on disk, so that later loads of the same model on the same
GPU skip it.

On a GPU a load times the kernel candidates on the model's own matrices (autotune.py,
gemm_tuning.py, batch_tuning.py, step_tiles.py): 20-50 s of an H200 load, most of a small model's
(the embedded 270M: ~45 of ~48 s). None of it changes between loads unless something it depends on
does, so the results are written to `cache_dir()/tuning/<key>.json` and read back by the next load
whose key matches. The key is a digest of everything the timing depends on (`key_fields`): the
device and its driver, the engine (the shader manifest and this package's Python source), the
model's shapes and the types its matrices took on the device, the context, slots and memory plan,
the options and every PHOENIX_VULKAN_* setting. A record whose key does not match is another
file, never read; a record that cannot be read is timed again and rewritten, and the backend's
stats() say which happened (`tuning_record`). `VulkanOptions.tuning_record="refresh"` (what
`phoenix-chat doctor` loads with) times afresh and rewrites the record; "off" neither reads nor
writes one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from phoenix_chat.engine.backends.vulkan.autotune import MatvecChoice, Tuning
from phoenix_chat.engine.backends.vulkan.batch_tuning import Way
from phoenix_chat.engine.backends.vulkan.ops_gemm import KERNELS
from phoenix_chat.engine.backends.vulkan.options import TuningRecordMode
from phoenix_chat.engine.backends.vulkan.step_tiles import Trials
from phoenix_chat.engine.paths import cache_dir
from phoenix_chat.shaders import SPV_DIR

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.backends.vulkan.options import VulkanOptions

FORMAT = 1  # bumped when a record's layout changes (an older record is then timed again)
KEEP = 32  # records kept in the folder: each update of the engine or driver keys new ones
ENV = "PHOENIX_VULKAN_TUNING_RECORD"  # "0": neither read nor write records (comparisons, tests)
_ENGINE_DIR = Path(__file__).resolve().parent
_MANIFEST = SPV_DIR / "manifest.json"


class RecordError(Exception):
    """A record that exists but cannot be used (unreadable, another format, bad fields)."""


def mode(options: VulkanOptions) -> TuningRecordMode:
    """The option's mode; None: "use", unless PHOENIX_VULKAN_TUNING_RECORD=0 ("off")."""
    if options.tuning_record is not None:
        return options.tuning_record
    return "off" if os.environ.get(ENV) == "0" else "use"


def _digest_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def key_fields(backend: VulkanBackend, options: VulkanOptions) -> dict[str, Any]:
    """Everything the load-time timing depends on, readable (kept in the record beside the
    results, so that a look at the file says what it was timed for)."""
    caps = backend.dev.caps
    w = backend.device_weights
    plan = backend.plan
    layers = [[m.qtype.name for m in (*layer.qkv, layer.o, layer.gate, layer.up, layer.down)] for layer in w.layers]
    return {
        "format": FORMAT,
        "device": {
            "name": caps.name,
            "driver": caps.driver,
            "driver_id": caps.driver_id,
            "vendor_id": caps.vendor_id,
            "api_version": list(caps.api_version),
            "subgroup_size": caps.subgroup_size,
            "compute_subgroup_sizes": list(caps.compute_subgroup_sizes),
            "int_dot_accelerated": caps.int_dot_accelerated,
            "cooperative_matrix": caps.cooperative_matrix,
            "coopmat_int8_k": caps.coopmat_int8_k,
        },
        "engine": {
            "shaders": _digest_files([_MANIFEST]),
            "python": _digest_files(list(_ENGINE_DIR.glob("*.py"))),
        },
        "model": {
            "config": repr(backend.config),
            "embed": w.embed_type.name,
            "lm_head": None if plan.tied else w.lm_head.qtype.name,
            "layers": layers,
        },
        "plan": {
            "context_length": backend.context_length,
            "slots": list(plan.slots),
            "n_slots": plan.n_slots,
            "n_splits": plan.n_splits,
            "weights_where": plan.weights_where,
            "int_dot": backend.int_dot,
        },
        "options": {
            "autotune": options.autotune,
            "int_dot": options.int_dot,
            "few_token_matvec": options.few_token_matvec,
            "few_token_int8": options.few_token_int8,
        },
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("PHOENIX_VULKAN_") and k != ENV},
    }


def path_for(fields: dict[str, Any]) -> Path:
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir() / "tuning" / f"{key}.json"


# ---- Tuning <-> JSON: every field named, so a field added to Tuning without a form here fails
# ---- loudly (encode raises) instead of being dropped from the record


def _int_keys(depth: int) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """A dict whose keys at `depth` (0: the top level) are ints: JSON keeps them as strings."""

    def out(d: Any, level: int = 0) -> Any:
        if level == depth:
            return {str(k): v for k, v in d.items()}
        return {k: out(v, level + 1) for k, v in d.items()}

    def back(d: Any, level: int = 0) -> Any:
        if level == depth:
            return {int(k): v for k, v in d.items()}
        return {k: back(v, level + 1) for k, v in d.items()}

    return out, back


def _same(v: Any) -> Any:
    return v


# a (path, workgroup shape) pair or None (Tuning.geglu_q8_1, .qkv_rope): a list in JSON
_PAIR: tuple[Callable[[Any], Any], Callable[[Any], Any]] = (
    lambda v: None if v is None else list(v),
    lambda v: None if v is None else (v[0], v[1]),
)


_FIELDS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "matvec": (
        lambda d: {k: [c.us, c.int_dot, c.spec] for k, c in d.items()},
        lambda d: {k: MatvecChoice(float(v[0]), v[1], v[2]) for k, v in d.items()},
    ),
    "norm_tail": (_same, _same),
    "geglu_q8_1": _PAIR,
    "geglu_q8_1_timing": (_same, _same),
    "qkv_rope": _PAIR,
    "qkv_rope_timing": (_same, _same),
    "prologue_groups": (_same, _same),
    "prologue_spec": (_same, _same),
    "prologue_down": (_same, _same),
    "prologue_timing": (_same, _same),
    "prologue_note": (_same, _same),
    "few_token_matvec": (sorted, frozenset),
    "few_token_int8": (sorted, frozenset),
    "cols_specs": _int_keys(1),
    "cols_timing": _int_keys(1),
    "few_token_timing": _int_keys(0),
    "gemm_kernel": (_same, _same),
    "gemm_timing": (_same, _same),
    "gemm_kernel_few": (_same, _same),
    "gemm_few_timing": (_same, _same),
    "gemm_kernels_few": _int_keys(0),
    "gemm_shape_timing_few": _int_keys(0),
    "gemm_kernels": (_same, _same),
    "gemm_shape_timing": (_same, _same),
    "gemm_kernels_note": (_same, _same),
}


def encode(tuning: Tuning) -> dict[str, Any]:
    missing = [f.name for f in dataclasses.fields(tuning) if f.name not in _FIELDS]
    if missing:
        raise TypeError(f"tuning_record has no JSON form for Tuning fields {missing}")
    return {name: to(getattr(tuning, name)) for name, (to, _) in _FIELDS.items()}


def decode(d: dict[str, Any]) -> Tuning:
    try:
        return Tuning(**{name: back(d[name]) for name, (_, back) in _FIELDS.items()})
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise RecordError(f"its tuning does not read back ({type(exc).__name__}: {exc})") from None


@dataclasses.dataclass
class Record:
    """What a load's timing left: the Tuning, each bucket's batched step (batch_tuning.py) and its
    tile search (step_tiles.py), and the seconds the timing took then."""

    tuning: Tuning
    batch_step_ways: dict[int, dict[str, float]]
    batch_step_tiles: dict[int, Trials | str]
    batch_step_note: str
    seconds: float
    saved: str = ""  # UTC, ISO 8601


def of(backend: VulkanBackend, seconds: float) -> Record:
    return Record(
        tuning=backend.tuning,
        batch_step_ways=backend.batch_step_ways,
        batch_step_tiles=backend.batch_step_tiles,
        batch_step_note=backend.batch_step_note,
        seconds=seconds,
        saved=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def write(path: Path, fields: dict[str, Any], record: Record) -> None:
    """Write atomically (a reader never sees half a record; a crash leaves the old one)."""
    body = {
        "key": fields,
        "saved": record.saved,
        "seconds": round(record.seconds, 3),
        "tuning": encode(record.tuning),
        "batch_step_ways": {str(B): w for B, w in record.batch_step_ways.items()},
        "batch_step_tiles": {
            str(B): t if isinstance(t, str) else t.stats() for B, t in record.batch_step_tiles.items()
        },
        "batch_step_note": record.batch_step_note,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=1))
    os.replace(tmp, path)
    prune(path.parent)


def used(path: Path) -> None:
    """Mark a record as just used (its mtime), so that pruning takes the ones no load reads."""
    try:
        os.utime(path)
    except OSError:
        pass  # a read-only cache still serves the record; it only ages


def prune(folder: Path, keep: int = KEEP) -> list[Path]:
    """Delete all but the `keep` most recently used records. A key changes with every engine or
    driver update, so old records would otherwise pile up, one per model, setting and version."""
    records = []
    for p in folder.glob("*.json"):
        try:
            records.append((p.stat().st_mtime, p))
        except OSError:
            continue  # removed meanwhile by another load
    gone = [p for _, p in sorted(records, reverse=True)[keep:]]
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


def _trials(v: Any) -> Trials | str:
    if isinstance(v, str):
        return v
    return Trials(float(v["step_us"]), float(v["s"]), dict(v["tried"]), dict(v["kept"]))


def read(path: Path, fields: dict[str, Any]) -> Record:
    """The record at `path`; RecordError where it is unreadable or was written for other fields
    (a digest collision, or a file edited by hand)."""
    try:
        body = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(body, dict):
        raise RecordError("not a JSON object")
    if body.get("key") != json.loads(json.dumps(fields)):
        raise RecordError("written for another device, engine, model or setting")
    try:
        record = Record(
            tuning=decode(body["tuning"]),
            batch_step_ways={
                int(B): {str(w): float(us) for w, us in v.items()} for B, v in body["batch_step_ways"].items()
            },
            batch_step_tiles={int(B): _trials(v) for B, v in body["batch_step_tiles"].items()},
            batch_step_note=str(body["batch_step_note"]),
            seconds=float(body["seconds"]),
            saved=str(body["saved"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RecordError(f"a field does not read back ({type(exc).__name__}: {exc})") from None
    check(record)
    return record


def check(record: Record) -> None:
    """RecordError where a choice names nothing this engine has (a kernel, a way, a matvec path):
    such a record is timed again rather than failing the load when the step is recorded."""
    t = record.tuning
    kernels = [t.gemm_kernel, t.gemm_kernel_few, *t.gemm_kernels.values()]
    kernels += [kn for picks in t.gemm_kernels_few.values() for kn in picks.values()]
    unknown = sorted({kn for kn in kernels if kn is not None and kn not in KERNELS})
    if unknown:
        raise RecordError(f"it names kernels this engine does not have: {unknown}")
    paths = [c.int_dot for c in t.matvec.values()] + [p[0] for p in (t.qkv_rope, t.geglu_q8_1) if p is not None]
    if any(p not in (True, False, "regs") for p in paths):
        raise RecordError(f"it names a matvec path other than f32 / int8 / regs: {paths}")
    ways = {w for v in record.batch_step_ways.values() for w in v}
    if not ways <= set(get_args(Way)):
        raise RecordError(f"it names batched-step ways this engine does not have: {sorted(ways)}")


def apply(backend: VulkanBackend, record: Record) -> None:
    """Put a record's results in place, as the timing would have left them. The Tuning is updated
    in place: the graph holds the same object."""
    for f in dataclasses.fields(Tuning):
        setattr(backend.tuning, f.name, getattr(record.tuning, f.name))
    backend.keep_batch_step_ways(record.batch_step_ways)
    backend.batch_step_tiles = record.batch_step_tiles
    backend.batch_step_note = record.batch_step_note
