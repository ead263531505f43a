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
// CM_GM x CM_GN: the subgroup grid (default 2 x 4; the "_w" tiles run 2 x 2 subgroups of 64 x 64,
// so each A/B fragment read from shared memory feeds 4 matrix products instead of 2-4).
// CM_PF ("_p" tiles): two shared buffers filled through registers: the next K step's x and W are
// loaded and dequantized into registers (no branch: rows past the edge read the last row, their
// products are never stored), the current step is multiplied, then the registers go to the other
// buffer — one barrier per step, and the global loads' latency hidden behind the MMAs.
// Accumulation is f32 (Gemma 3's sums overflow f16). Only the operands are f16: x is the
// normalized activation (RMSNorm or GEGLU output), clamped to the f16 range so an outlier
// saturates instead of turning into inf; rounding x to f16 costs ~5e-4 relative error per dot.
// WG (spec constant) is CM_GM x CM_GN x the device's reported subgroup size (ops_gemm sets it):
// those subgroups own the tile grid; if a driver runs narrower waves, the extra subgroups only
// stage data (CM_PF: they repeat a grid subgroup's products, which only the owner stores).
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
#ifndef CM_GM
#define CM_GM 2
#endif
#ifndef CM_GN
#define CM_GN 4
#endif
#define NSG (CM_GM * CM_GN)  // subgroups in the tile grid
#define BM (CM_GM * TM * C16)
#define BN (CM_GN * TN * C16)
#define BK 32
#define SK (BK + 8)          // shared row stride in halves: 80 bytes, a multiple of 16
#define SK4 (SK / 4)         // ... in f16vec4s: shared memory is written 4 halves at a time

PUSH_CONSTANTS

#include "include/gemm_io.glsl"

// x again, as 16-byte loads (ops_gemm checks x_stride % 4 == 0 and a 16-byte aligned binding)
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };

// Staging in f16vec4s: one 8-byte store per 4 values (a scalar f16 store each was most of the
// staging's instructions); coopMatLoad counts offsets and strides in the array's element type.
#if (defined(CM_DB) && !defined(GEMM_GEGLU)) || defined(CM_PF)
#define NBUF 2
#else
#define NBUF 1
#endif
shared f16vec4 xs[NBUF * BM * SK4];
shared f16vec4 ws0[NBUF * BN * SK4];
#ifdef GEMM_GEGLU
shared f16vec4 ws1[NBUF * BN * SK4];
#endif
shared float cs[NSG * C16 * C16];   // one 16 x 16 f32 staging tile per subgroup, for bounded stores

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

#ifdef CM_PF
// The next K step in registers: x as f16 runs of 4, W as f16 runs of 16 (RX / RW per invocation
// at the nominal WG of NSG x 32; wider subgroups leave some slots unused).
#define XRUNS (BM * BK / 4u)
#define WRUNS (BN * BK / 16u)
#define RX ((XRUNS + NSG * 32u - 1u) / (NSG * 32u))
#define RW ((WRUNS + NSG * 32u - 1u) / (NSG * 32u))
f16vec4 rx[RX];
f16vec4 rw0[RW * 4];
#ifdef GEMM_GEGLU
f16vec4 rw1[RW * 4];
#endif

void fetch(uint k0, uint m0, uint n0) {
    const uint tid = gl_LocalInvocationID.x, M = pc.m, N = pc.n, K = pc.k;
    [[unroll]] for (uint i = 0; i < RX; i++) {
        const uint run = tid + i * WG;
        const uint r = min(run / (BK / 4u), BM - 1u), kq = run % (BK / 4u);
        const uint m = min(m0 + r, M - 1u);
        const vec4 v = x4[(m * pc.x_stride + k0) / 4u + kq];
        rx[i] = f16vec4(clamp(v, vec4(-65504.0), vec4(65504.0)));
    }
    [[unroll]] for (uint i = 0; i < RW; i++) {
        const uint run = tid + i * WG;
        const uint r = min(run / (BK / 16u), BN - 1u), kk = (run % (BK / 16u)) * 16u;
        const uint n = min(n0 + r, N - 1u);
        float v[16];
        w_run16_w0(n, k0 + kk, K, v);
        [[unroll]] for (uint j = 0; j < 4; j++)
            rw0[4 * i + j] = f16vec4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
#ifdef GEMM_GEGLU
        w_run16_w1(n, k0 + kk, K, v);
        [[unroll]] for (uint j = 0; j < 4; j++)
            rw1[4 * i + j] = f16vec4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
#endif
    }
}

void put(uint buf) {
    const uint tid = gl_LocalInvocationID.x;
    const uint xo = buf * BM * SK4, wo = buf * BN * SK4;
    [[unroll]] for (uint i = 0; i < RX; i++) {
        const uint run = tid + i * WG;
        if (run < XRUNS) xs[xo + (run / (BK / 4u)) * SK4 + run % (BK / 4u)] = rx[i];
    }
    [[unroll]] for (uint i = 0; i < RW; i++) {
        const uint run = tid + i * WG;
        if (run < WRUNS) {
            const uint o = wo + (run / (BK / 16u)) * SK4 + (run % (BK / 16u)) * 4u;
            [[unroll]] for (uint j = 0; j < 4; j++) ws0[o + j] = rw0[4 * i + j];
#ifdef GEMM_GEGLU
            [[unroll]] for (uint j = 0; j < 4; j++) ws1[o + j] = rw1[4 * i + j];
#endif
        }
    }
}
#endif

void main() {
    const uint sg = gl_SubgroupID;
#ifdef CM_PF
    const uint gs = sg % NSG;                           // extra subgroups repeat one's products
#else
    const uint gs = sg;
#endif
    const uint sg_m = gs / CM_GN, sg_n = gs % CM_GN;    // CM_GM x CM_GN subgroup grid
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

#if defined(CM_PF)
    fetch(0u, m0, n0);
    put(0u);
    barrier();
#elif NBUF == 2
    stage(0u, 0u, m0, n0);
    barrier();
#endif
    uint buf = 0u;
    for (uint k0 = 0; k0 < K; k0 += BK) {
#if defined(CM_PF)
        fetch(min(k0 + BK, K - BK), m0, n0);                  // the next step (the last one again at the end)
#elif NBUF == 2
        if (k0 + BK < K) stage(k0 + BK, buf ^ 1u, m0, n0);   // the next step, while this one multiplies
#else
        stage(k0, 0u, m0, n0);
        barrier();
#endif
        const uint xo = buf * BM * SK4, wo = buf * BN * SK4;
#ifndef CM_PF
        // subgroups past the grid (a driver running narrower waves than the subgroupSize it
        // reports) only help with the staging above
        if (sg < NSG)
#endif
        [[unroll]] for (uint kk = 0; kk < BK; kk += C16) {
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
                coopMatLoad(b, ws1, wo + nb, SK4, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0; i < TM; i++) acc1[i][j] = coopMatMulAdd(a[i], b, acc1[i][j]);
#endif
            }
        }
#ifdef CM_PF
        put(buf ^ 1u);
#endif
        barrier();
#if NBUF == 2
        buf ^= 1u;
#endif
    }

    // Out through a per-subgroup staging tile: the block edges need bounds checks that a
    // direct coopMatStore into y cannot make.
    if (sg >= NSG) return;
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
