#version 450
// Prefill GEMM on matrix cores (VK_KHR_cooperative_matrix): same contract as gemm.comp —
// y[m, y_off + n] = sum_k x[m, k] * W[n, k], x f32 [m][x_stride], W in its GGUF layout
// (-D WTYPE_*), GEMM_GEGLU: y = gelu_tanh(x Wg^T) * (x Wu^T) — on 16x16x16 f16 x f16 -> f32
// cooperative matrices.
//
// Tile: BM = 64 tokens (CM_TM = 2) or 128 (CM_TM = 4: the "_l" variants, which dequantize
// each weight tile once per 128 tokens instead of 64) x BN = 128 output columns per workgroup;
// for a few tokens (a short turn's prefill, a batched decode step) BM = 32 (CM_TM = 1, "_m"),
// and BN = 64 as well (CM_TN = 1, "_s": twice the workgroups over the same weights),
// K in steps of BK = 32 (K must be a multiple of 32, as every GGUF block type makes it). Each
// step stages x (converted to f16) and the dequantized W tile (f16) in shared memory; the
// workgroup is 8 subgroups in a 2 (M) x 4 (N) grid, each owning CM_TM x CM_TN accumulators
// (16 CM_TM x 16 CM_TN). The backend picks the tile by timing both at load (autotune.choose_gemm_tile).
// CM_DB ("_ld": the 128 x 128 tile): two shared buffers, so the next K step is staged while the
// current one is multiplied and one barrier per step remains instead of two (a GEGLU kernel's
// three tiles would not fit 48 KiB twice: it stays single-buffered).
// Accumulation is f32 (Gemma 3's sums overflow f16). Only the operands are f16: x is the
// normalized activation (RMSNorm or GEGLU output), clamped to the f16 range so an outlier
// saturates instead of turning into inf; rounding x to f16 costs ~5e-4 relative error per dot.
// WG (spec constant) is 8 x the device's reported subgroup size (ops_gemm sets it): 8 subgroups
// own the 2 x 4 tile grid; if a driver runs narrower waves, the extra subgroups only stage data.
// (Wider waves than reported would leave tiles unowned: no driver we know does that.)
// Bindings: 0 x, 1 y, 2 W (GEGLU: 2 W_gate, 3 W_up).
// Push: m, n, k, x_stride, y_stride, y_off.   Dispatch: (ceil(n / BN), ceil(m / BM), 1).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#include "include/common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

#ifndef CM_TM
#define CM_TM 2
#endif
#define C16 16
#define TM CM_TM             // accumulator tiles per subgroup along M ...
#ifndef CM_TN
#define CM_TN 2
#endif
#define TN CM_TN             // ... and along N
#define BM (2 * TM * C16)
#define BN (4 * TN * C16)
#define BK 32
#define SK (BK + 8)          // shared row stride in halves: 80 bytes, a multiple of 16
#define SK4 (SK / 4)         // ... in f16vec4s: shared memory is written 4 halves at a time

PUSH_CONSTANTS

#include "include/gemm_io.glsl"

// x again, as 16-byte loads (ops_gemm checks x_stride % 4 == 0 and a 16-byte aligned binding)
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };

// Staging in f16vec4s: one 8-byte store per 4 values (a scalar f16 store each was most of the
// staging's instructions); coopMatLoad counts offsets and strides in the array's element type.
#if defined(CM_DB) && !defined(GEMM_GEGLU)
#define NBUF 2
#else
#define NBUF 1
#endif
shared f16vec4 xs[NBUF * BM * SK4];
shared f16vec4 ws0[NBUF * BN * SK4];
#ifdef GEMM_GEGLU
shared f16vec4 ws1[BN * SK4];
#endif
shared float cs[8 * C16 * C16];   // one 16 x 16 f32 staging tile per subgroup, for bounded stores

#define ACC coopmat<float, gl_ScopeSubgroup, C16, C16, gl_MatrixUseAccumulator>

// x and W of the K step at k0 into shared buffer `buf` (f16; W dequantized from its blocks)
void stage(uint k0, uint buf, uint m0, uint n0) {
    const uint tid = gl_LocalInvocationID.x, M = pc.m, N = pc.n, K = pc.k;
    const uint xo = buf * BM * SK4, wo = buf * BN * SK4;
    for (uint run = tid; run < BM * BK / 4u; run += WG) {       // x: runs of 4 of one token
        const uint r = run / (BK / 4u), kq = run % (BK / 4u);
        const uint m = m0 + r;
        const vec4 v = m < M ? x4[(m * pc.x_stride + k0) / 4u + kq] : vec4(0.0);
        xs[xo + r * SK4 + kq] = f16vec4(clamp(v, vec4(-65504.0), vec4(65504.0)));
    }
    for (uint run = tid; run < BN * BK / 16u; run += WG) {      // W: runs of 16 of one row
        const uint r = run / (BK / 16u), kk = (run % (BK / 16u)) * 16u;
        const uint n = n0 + r;
        float v[16];
        if (n < N) w_run16_w0(n, k0 + kk, K, v); else [[unroll]] for (uint i = 0; i < 16; i++) v[i] = 0.0;
        [[unroll]] for (uint i = 0; i < 4; i++)
            ws0[wo + r * SK4 + kk / 4u + i] = f16vec4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
#ifdef GEMM_GEGLU
        if (n < N) w_run16_w1(n, k0 + kk, K, v);
        [[unroll]] for (uint i = 0; i < 4; i++)
            ws1[r * SK4 + kk / 4u + i] = f16vec4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
#endif
    }
}

void main() {
    const uint sg = gl_SubgroupID;
    const uint sg_m = sg / 4u, sg_n = sg % 4u;          // 2 x 4 subgroup grid
    const uint n0 = gl_WorkGroupID.x * BN, m0 = gl_WorkGroupID.y * BM;
    const uint M = pc.m, N = pc.n, K = pc.k;

    ACC acc0[TM][TN];
#ifdef GEMM_GEGLU
    ACC acc1[TM][TN];
#endif
    [[unroll]] for (uint i = 0; i < TM; i++) [[unroll]] for (uint j = 0; j < TN; j++) {
        acc0[i][j] = ACC(0.0);
#ifdef GEMM_GEGLU
        acc1[i][j] = ACC(0.0);
#endif
    }

#if NBUF == 2
    stage(0u, 0u, m0, n0);
    barrier();
#endif
    uint buf = 0u;
    for (uint k0 = 0; k0 < K; k0 += BK) {
#if NBUF == 2
        if (k0 + BK < K) stage(k0 + BK, buf ^ 1u, m0, n0);   // the next step, while this one multiplies
#else
        stage(k0, 0u, m0, n0);
        barrier();
#endif
        const uint xo = buf * BM * SK4, wo = buf * BN * SK4;
        // subgroups past the 8 of the tile grid (a driver running narrower waves than the
        // subgroupSize it reports) only help with the staging above
        if (sg < 8u) [[unroll]] for (uint kk = 0; kk < BK; kk += C16) {
            coopmat<float16_t, gl_ScopeSubgroup, C16, C16, gl_MatrixUseA> a[TM];
            [[unroll]] for (uint i = 0; i < TM; i++)
                coopMatLoad(a[i], xs, xo + (sg_m * TM * C16 + i * C16) * SK4 + kk / 4u, SK4,
                            gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint j = 0; j < TN; j++) {
                const uint nb = (sg_n * TN * C16 + j * C16) * SK4 + kk / 4u;
                coopmat<float16_t, gl_ScopeSubgroup, C16, C16, gl_MatrixUseB> b;
                coopMatLoad(b, ws0, wo + nb, SK4, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0; i < TM; i++) acc0[i][j] = coopMatMulAdd(a[i], b, acc0[i][j]);
#ifdef GEMM_GEGLU
                coopMatLoad(b, ws1, nb, SK4, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0; i < TM; i++) acc1[i][j] = coopMatMulAdd(a[i], b, acc1[i][j]);
#endif
            }
        }
        barrier();
#if NBUF == 2
        buf ^= 1u;
#endif
    }

    // Out through a per-subgroup staging tile: the block edges need bounds checks that a
    // direct coopMatStore into y cannot make.
    if (sg >= 8u) return;
    const uint lane = gl_SubgroupInvocationID, sgs = gl_SubgroupSize;
    [[unroll]] for (uint i = 0; i < TM; i++) [[unroll]] for (uint j = 0; j < TN; j++) {
        ACC r = acc0[i][j];
#ifdef GEMM_GEGLU
        for (int e = 0; e < r.length(); e++) r[e] = gelu_tanh(acc0[i][j][e]) * acc1[i][j][e];
#endif
        coopMatStore(r, cs, sg * C16 * C16, C16, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        const uint mt = m0 + sg_m * TM * C16 + i * C16, nt = n0 + sg_n * TN * C16 + j * C16;
        for (uint e = lane; e < C16 * C16; e += sgs) {
            const uint m = mt + e / C16, n = nt + e % C16;
            if (m < M && n < N) y[m * pc.y_stride + pc.y_off + n] = cs[sg * C16 * C16 + e];
        }
        subgroupBarrier();
    }
}
