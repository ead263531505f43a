// The GEMM family's buffers (gemm.comp, gemm_coopmat.comp, gemm_lanes.comp share one contract):
// 0 x (f32 rows), 1 y, 2 W (GEGLU: 2 W_gate, 3 W_up) in its GGUF layout, with each weight
// binding's run decoder (gemm_dequant.glsl: w_run16_w0 / w_run16_w1).
layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Y { float y[]; };
layout(binding = 2) readonly buffer W0a { uint16_t w0_16[]; };
layout(binding = 2) readonly buffer W0b { float w0_f[]; };
layout(binding = 2) readonly buffer W0c { uint w0_32[]; };   // 32-bit loads of the quants
#define W16 w0_16
#define WF w0_f
#define W32 w0_32
#define FN(n) PASTE(n, _w0)
#include "gemm_dequant.glsl"
#undef W16
#undef WF
#undef W32
#undef FN
#ifdef GEMM_GEGLU
layout(binding = 3) readonly buffer W1a { uint16_t w1_16[]; };
layout(binding = 3) readonly buffer W1b { float w1_f[]; };
layout(binding = 3) readonly buffer W1c { uint w1_32[]; };
#define W16 w1_16
#define WF w1_f
#define W32 w1_32
#define FN(n) PASTE(n, _w1)
#include "gemm_dequant.glsl"
#endif
