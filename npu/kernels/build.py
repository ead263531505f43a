"""Build the NPU GEMM kernels with the mlir-aie toolchain: `.xclbin` + instruction stream + manifest.

    python -m npu.kernels.build [--out DIR] [--only NAME ...] [--dry-run]

Per kernel in npu.kernels.spec.DEFAULT_SPECS:
  1. Peano (llvm-aie) compiles gemm_aie.cc for the core tile shape → gemm_<type>_<m>x<k>x<n>.o
  2. gemm_design.py emits the IRON design as MLIR → <name>.mlir
  3. aiecc.py --no-xchesscc --no-xbridge --aie-generate-xclbin --aie-generate-npu-insts
     --no-compile-host … → <name>.xclbin and <name>.insts.bin
  4. <name>.json records the spec, the file names, their sha256 and the toolchain versions used,
     which is what npu.runtime.find_kernels() checks before anything runs.

Toolchain it was written for (not installable from PyPI; wheels from the GitHub releases):
mlir-aie 1.x with the `aie.iron` API (Xilinx/mlir-aie releases), llvm-aie/Peano of the same
period (Xilinx/llvm-aie nightly wheels), XRT ≥ 2.19 with the amdxdna plugin to run the result.
Nothing here has been run yet: no toolchain exists on the development machines (docs/NPU.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from phoenix_chat.npu.kernels import BUILD_DIR
from phoenix_chat.npu.kernels.gemm_design import object_name
from phoenix_chat.npu.kernels.spec import DEFAULT_SPECS, GemmSpec

HERE = Path(__file__).resolve().parent
WRITTEN_FOR = {
    "mlir-aie": "1.x (aie.iron API, 2025)",
    "llvm-aie": "Peano nightly of the same period",
    "xrt": ">= 2.19 with the amdxdna (XDNA) plugin",
    "target": "npu1 (NPU1Col4)",
}
AIECC_FLAGS = [
    "--no-xchesscc",
    "--no-xbridge",
    "--aie-generate-xclbin",
    "--aie-generate-npu-insts",
    "--no-compile-host",
]
PEANO_FLAGS = [
    "-O2",
    "-std=c++20",
    "--target=aie2-none-unknown-elf",
    "-DNDEBUG",
    "-Wno-parentheses",
    "-Wno-attributes",
    "-Wno-macro-redefined",
]


class ToolchainMissing(RuntimeError):
    pass


def find_toolchain() -> dict:
    """aiecc.py, the mlir-aie package (its include dir) and Peano's clang++, or ToolchainMissing."""
    missing = []
    aiecc = shutil.which("aiecc.py")
    if not aiecc:
        missing.append(
            "aiecc.py is not on PATH (install the mlir-aie wheel from github.com/Xilinx/mlir-aie "
            "releases and activate its environment)"
        )
    try:
        import aie  # noqa: F401

        aie_dir = Path(aie.__file__).resolve().parent
    except ImportError:
        aie_dir = None
        missing.append("the `aie` Python package (mlir-aie) is not importable")
    peano = os.environ.get("PEANO_INSTALL_DIR", "")
    clang = Path(peano) / "bin" / "clang++" if peano else None
    if not clang or not clang.exists():
        missing.append(
            "Peano (llvm-aie) not found: set PEANO_INSTALL_DIR to the llvm-aie install "
            "(pip install llvm-aie from github.com/Xilinx/llvm-aie releases)"
        )
    if missing:
        raise ToolchainMissing("cannot build NPU kernels: " + "; ".join(missing))
    assert aie_dir is not None  # else `missing` says so
    include = _first_existing(
        [
            aie_dir / "include",
            aie_dir.parent / "include",
            Path(os.environ.get("MLIR_AIE_INSTALL_DIR", "/nonexistent")) / "include",
        ]
    )
    return {
        "aiecc": aiecc,
        "clang": str(clang),
        "peano_dir": peano,
        "include": str(include) if include else None,
        "versions": _versions(str(clang)),
    }


def _first_existing(paths):
    return next((p for p in paths if (p / "aie_api").is_dir()), None)


def _versions(clang: str) -> dict:
    out = {}
    for dist in ("mlir_aie", "mlir-aie", "llvm-aie", "llvm_aie"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        out["peano_clang"] = subprocess.run(
            [clang, "--version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()[0]
    except (OSError, IndexError):
        pass
    return out


def commands(spec: GemmSpec, out: Path, tc: dict) -> list[tuple[list[str], Path]]:
    """The (argv, cwd) steps that build one kernel."""
    mlir = out / f"{spec.name}.mlir"
    obj = object_name(spec)
    include = ["-I", tc["include"]] if tc.get("include") else []
    compile_kernel = [
        tc["clang"],
        *PEANO_FLAGS,
        *include,
        f"-DTILE_M={spec.m}",
        f"-DTILE_K={spec.k}",
        f"-DTILE_N={spec.n}",
        "-c",
        str(HERE / "gemm_aie.cc"),
        "-o",
        obj,
    ]
    emit = [sys.executable, "-m", "phoenix_chat.npu.kernels.gemm_design", "--spec", spec.name]
    aiecc = [tc["aiecc"], *AIECC_FLAGS, f"--xclbin-name={spec.name}.xclbin", f"--npu-insts-name={spec.name}.insts.bin"]
    if tc.get("peano_dir"):
        aiecc += ["--peano", tc["peano_dir"]]
    aiecc.append(mlir.name)
    return [(compile_kernel, out), (emit + [">", str(mlir)], HERE.parents[1]), (aiecc, out)]


def build(spec: GemmSpec, out: Path, tc: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (compile_kernel, cwd1), (emit, cwd2), (aiecc, cwd3) = commands(spec, out, tc)
    subprocess.run(compile_kernel, cwd=cwd1, check=True)
    mlir = Path(emit[-1])
    with open(mlir, "w") as f:
        subprocess.run(emit[:-2], cwd=cwd2, check=True, stdout=f)
    subprocess.run(aiecc, cwd=cwd3, check=True)
    xclbin, insts = out / f"{spec.name}.xclbin", out / f"{spec.name}.insts.bin"
    manifest = {
        **spec.to_json(),
        "kind": "phoenix-npu-gemm",
        "xclbin": xclbin.name,
        "insts": insts.name,
        "kernel_name": "MLIR_AIE",
        "xclbin_sha256": _sha256(xclbin),
        "insts_sha256": _sha256(insts),
        "toolchain": tc["versions"],
        "written_for": WRITTEN_FOR,
    }
    path = out / f"{spec.name}.json"
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=BUILD_DIR)
    ap.add_argument("--only", nargs="*", choices=[s.name for s in DEFAULT_SPECS])
    ap.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    args = ap.parse_args(argv)
    specs = [s for s in DEFAULT_SPECS if not args.only or s.name in args.only]
    if args.dry_run:
        tc = {
            "aiecc": "aiecc.py",
            "clang": "$PEANO_INSTALL_DIR/bin/clang++",
            "peano_dir": "$PEANO_INSTALL_DIR",
            "include": "$MLIR_AIE_INSTALL_DIR/include",
            "versions": {},
        }
        for spec in specs:
            for argv_, cwd in commands(spec, args.out, tc):
                print(f"(cd {cwd} && {' '.join(argv_)})")
        return 0
    try:
        tc = find_toolchain()
    except ToolchainMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    for spec in specs:
        print(f"built {build(spec, args.out, tc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
