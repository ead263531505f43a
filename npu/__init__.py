"""The AMD XDNA NPU: detection, the pyxrt runtime, int8/bf16 quantization, the GEMM driver and
(kernels/) the kernel designs and their build. The lowest floor: nothing here imports the engine,
which passes in what it knows (the user's kernel folder) and turns npu.errors into its own."""
