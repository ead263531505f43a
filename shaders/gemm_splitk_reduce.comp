#version 450
// The second half of a split-K few-token GEMM (gemm_coopmat_few.comp with CF_SPLITK): adds the
// S splits' partial sums, [split][matrix][token][row] in binding 0, in split order — the same
// result on every run, which float atomics would not give — and writes y like any GEMM
// (GEMM_GEGLU: y = gelu_tanh(gate) * up of the two matrices' sums).
// Bindings: 0 partials, 1 y.   Push (the GEMM's layout): m, n, k = S, x_stride (unused), y_stride,
// y_off.   Dispatch: (ceil(m n / WG), 1, 1).
#extension GL_GOOGLE_include_directive : require
#include "include/common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

PUSH_CONSTANTS

layout(binding = 0) readonly buffer P { float part[]; };
layout(binding = 1) writeonly buffer Y { float y[]; };

#ifdef GEMM_GEGLU
#define NW 2u
#else
#define NW 1u
#endif

void main() {
    const uint i = gl_GlobalInvocationID.x, mn = pc.m * pc.n;
    if (i >= mn) return;
    float s[NW];
    [[unroll]] for (uint g = 0u; g < NW; g++) {
        s[g] = 0.0;
        for (uint z = 0u; z < pc.k; z++) s[g] += part[(z * NW + g) * mn + i];
    }
    const uint m = i / pc.n, n = i % pc.n;
#ifdef GEMM_GEGLU
    y[m * pc.y_stride + pc.y_off + n] = gelu_tanh(s[0]) * s[1];
#else
    y[m * pc.y_stride + pc.y_off + n] = s[0];
#endif
}
