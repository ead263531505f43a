#version 450
// Prefill GEMM for CPU Vulkan devices (lavapipe): the contract of gemm.comp, shaped for a device
// that runs a workgroup's invocations as the lanes of one SIMD register and pays for every
// buffer load lane by lane (llvmpipe loops over the lanes for each load, ~30 cycles apiece),
// while its arithmetic is vectorized. So: no shared memory and no barriers (each is a lane
// loop and a coroutine switch there); each invocation keeps RN output columns x TM tokens in
// registers and loads every weight once per TM tokens and every x value once per RN columns.
// GEMM_GEGLU: gate and up rows side by side, y = gelu_tanh(x Wg^T) * (x Wu^T).
// Bindings: 0 x, 1 y, 2 W (GEGLU: 2 W_gate, 3 W_up).   Push: as gemm.comp.
// Dispatch: (ceil(n / (WG * RN)), ceil(m / TM), 1).
#extension GL_GOOGLE_include_directive : require
#include "include/common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 8;
layout(constant_id = 1) const uint RN = 8;     // output columns per invocation
layout(constant_id = 2) const uint TM = 8;     // tokens per invocation

PUSH_CONSTANTS

#include "include/gemm_io.glsl"
// x again as vec4s: one load of 16 bytes where 4 loads of 4 would each be a loop over the lanes
// (the host refuses x strides that are not a multiple of 4)
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };

void main() {
    const uint n0 = (gl_WorkGroupID.x * WG + gl_LocalInvocationID.x) * RN;
    const uint m0 = gl_WorkGroupID.y * TM;
    const uint M = pc.m, N = pc.n, K = pc.k;
    if (n0 >= N) return;
    const uint rn = min(RN, N - n0), tm = min(TM, M - m0);

    float acc0[TM][RN];
#ifdef GEMM_GEGLU
    float acc1[TM][RN];
#endif
    [[unroll]] for (uint t = 0; t < TM; t++) [[unroll]] for (uint r = 0; r < RN; r++) {
        acc0[t][r] = 0.0;
#ifdef GEMM_GEGLU
        acc1[t][r] = 0.0;
#endif
    }

    for (uint k0 = 0; k0 < K; k0 += 16u) {
        float w0[RN][16];
#ifdef GEMM_GEGLU
        float w1[RN][16];
#endif
        [[unroll]] for (uint r = 0; r < RN; r++) {
            if (r < rn) {
                w_run16_w0(n0 + r, k0, K, w0[r]);
#ifdef GEMM_GEGLU
                w_run16_w1(n0 + r, k0, K, w1[r]);
#endif
            }
        }
        [[unroll]] for (uint t = 0; t < TM; t++) {
            if (t < tm) {
                const uint xb = ((m0 + t) * pc.x_stride + k0) >> 2;
                vec4 xq[4];
                [[unroll]] for (uint i = 0; i < 4; i++) xq[i] = x4[xb + i];
                float xv[16];
                [[unroll]] for (uint i = 0; i < 16; i++) xv[i] = xq[i >> 2][i & 3];
                [[unroll]] for (uint r = 0; r < RN; r++) {
                    float s0 = 0.0;
#ifdef GEMM_GEGLU
                    float s1 = 0.0;
#endif
                    [[unroll]] for (uint i = 0; i < 16; i++) {
                        s0 += w0[r][i] * xv[i];
#ifdef GEMM_GEGLU
                        s1 += w1[r][i] * xv[i];
#endif
                    }
                    acc0[t][r] += s0;
#ifdef GEMM_GEGLU
                    acc1[t][r] += s1;
#endif
                }
            }
        }
    }

    [[unroll]] for (uint t = 0; t < TM; t++) {
        if (t >= tm) break;
        const uint yb = (m0 + t) * pc.y_stride + pc.y_off + n0;
        [[unroll]] for (uint r = 0; r < RN; r++) {
            if (r >= rn) break;
#ifdef GEMM_GEGLU
            y[yb + r] = gelu_tanh(acc0[t][r]) * acc1[t][r];
#else
            y[yb + r] = acc0[t][r];
#endif
        }
    }
}
