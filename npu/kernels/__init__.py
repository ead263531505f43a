"""NPU kernel designs (IRON, for mlir-aie) and the shared description of their buffer layouts."""
