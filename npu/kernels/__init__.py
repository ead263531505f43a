"""NPU kernel designs (IRON, for mlir-aie) and the shared description of their buffer layouts.

The host side that finds, loads and runs the built kernels is npu/runtime.py, beside detect.py,
gemm.py and quant.py.
"""

from pathlib import Path

BUILD_DIR = Path(__file__).resolve().parent / "build"  # where build.py writes the kernels
