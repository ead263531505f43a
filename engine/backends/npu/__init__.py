"""The host side of the NPU (AMD XDNA "Phoenix"): detection, the `pyxrt` runtime, int8/bf16
quantization and the GEMM driver. The kernels it runs are designed and built in npu/kernels/
(the lower floor: npu/ never imports engine/). docs/NPU.md describes the pieces.
"""
