#version 450
// Prefill GEMM: y[m, y_off + n] = sum_k x[m, k] * W[n, k], x f32 [m][x_stride], W in its GGUF
// layout (-D WTYPE_*), f32 accumulation. Tiles of BM=64 tokens x BN=64 output columns, K in
// steps of 32 (K a multiple of 32): each step stages the x tile and the dequantized W tile in shared memory
// (dequantized once, reused by 64 tokens); each of the 256 threads owns a 4 x 4 block of
// outputs strided by 16 (conflict-free shared reads).
// GEMM_GEGLU: two weight matrices of one type (gate, up): y = gelu_tanh(x Wg^T) * (x Wu^T).
// A weight bound in row ranges (memory.Tensor.ranges): one dispatch per range, with n = its
// rows and y_off = its row_start.
// Bindings: 0 x, 1 y, 2 W (GEGLU: 2 W_gate, 3 W_up).
// Push: m, n, k, x_stride, y_stride, y_off.   Dispatch: (ceil(n / 64), ceil(m / 64), 1).
#extension GL_GOOGLE_include_directive : require
#include "include/common.glsl"

layout(local_size_x = 256) in;

#define BM 64
#define BN 64
#define BK 32
#define PAD 1

PUSH_CONSTANTS

#include "include/gemm_io.glsl"

shared float xs[BK][BM + PAD];
shared float ws0[BK][BN + PAD];
#ifdef GEMM_GEGLU
shared float ws1[BK][BN + PAD];
#endif

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint tx = tid % 16u, ty = tid / 16u;
    const uint n0 = gl_WorkGroupID.x * BN, m0 = gl_WorkGroupID.y * BM;
    const uint M = pc.m, N = pc.n, K = pc.k;

    float acc0[4][4];
#ifdef GEMM_GEGLU
    float acc1[4][4];
#endif
    [[unroll]] for (uint i = 0; i < 4; i++) [[unroll]] for (uint j = 0; j < 4; j++) {
        acc0[i][j] = 0.0;
#ifdef GEMM_GEGLU
        acc1[i][j] = 0.0;
#endif
    }

    for (uint k0 = 0; k0 < K; k0 += BK) {
        for (uint idx = tid; idx < BM * BK; idx += 256u) {
            const uint r = idx / BK, kk = idx % BK;
            const uint m = m0 + r, k = k0 + kk;
            xs[kk][r] = (m < M && k < K) ? x[m * pc.x_stride + k] : 0.0;
        }
        for (uint run = tid; run < BN * BK / 16u; run += 256u) {   // runs of 16 weights of one row
            const uint r = run / (BK / 16u), kk = (run % (BK / 16u)) * 16u;
            const uint n = n0 + r;
            float v[16];
            if (n < N) w_run16_w0(n, k0 + kk, K, v); else [[unroll]] for (uint i = 0; i < 16; i++) v[i] = 0.0;
            [[unroll]] for (uint i = 0; i < 16; i++) ws0[kk + i][r] = v[i];
#ifdef GEMM_GEGLU
            if (n < N) w_run16_w1(n, k0 + kk, K, v);
            [[unroll]] for (uint i = 0; i < 16; i++) ws1[kk + i][r] = v[i];
#endif
        }
        barrier();
        [[unroll]] for (uint kk = 0; kk < BK; kk++) {
            float a[4], b0[4];
            [[unroll]] for (uint i = 0; i < 4; i++) a[i] = xs[kk][ty + 16u * i];
            [[unroll]] for (uint j = 0; j < 4; j++) b0[j] = ws0[kk][tx + 16u * j];
            [[unroll]] for (uint i = 0; i < 4; i++) [[unroll]] for (uint j = 0; j < 4; j++) acc0[i][j] += a[i] * b0[j];
#ifdef GEMM_GEGLU
            float b1[4];
            [[unroll]] for (uint j = 0; j < 4; j++) b1[j] = ws1[kk][tx + 16u * j];
            [[unroll]] for (uint i = 0; i < 4; i++) [[unroll]] for (uint j = 0; j < 4; j++) acc1[i][j] += a[i] * b1[j];
#endif
        }
        barrier();
    }

    [[unroll]] for (uint i = 0; i < 4; i++) {
        const uint m = m0 + ty + 16u * i;
        if (m >= M) continue;
        [[unroll]] for (uint j = 0; j < 4; j++) {
            const uint n = n0 + tx + 16u * j;
            if (n >= N) continue;
#ifdef GEMM_GEGLU
            y[m * pc.y_stride + pc.y_off + n] = gelu_tanh(acc0[i][j]) * acc1[i][j];
#else
            y[m * pc.y_stride + pc.y_off + n] = acc0[i][j];
#endif
        }
    }
}
