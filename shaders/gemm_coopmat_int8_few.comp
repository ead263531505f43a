#version 450
// A GEMM of a few tokens (a batched decode step's rows, a short forward) on int8 matrix cores:
// the contract of gemm_coopmat_int8.comp (x as q8_1 blocks, W in its GGUF layout, -D WTYPE_* of
// CM8 types, GEMM_GEGLU), shaped for 16-32 tokens instead of a prefill chunk.
//
// Why: with a few tokens a GEMM is a pass over the weights, and a tile of 128 rows leaves most
// of a big GPU idle — a 5376-row matrix is 42 workgroups, each looping over all of K with a
// barrier per step — so such products ran at a tenth of the memory bandwidth. Here a workgroup
// owns only 16 rows (the gate's and the up's for GEGLU) and CFW_TM x 16 tokens, and its
// CFW_SPLIT subgroups split K between them (chunk pairs s, s + SPLIT, ...): n / 16 workgroups of
// independent subgroups that synchronize only among their own lanes until one reduction at the
// end. Per step a subgroup unpacks two chunks of its 16 rows (one lane per row and chunk, the
// int8 matvecs' decoder) and copies the tokens' two q8_1 blocks into its own shared region, then
// runs 16 x 16 x 32 int8 products folded into f32 sums per chunk as gemm_coopmat_int8.comp does
// (the accumulator layout asked of the hardware the same way). The next step's loads are issued
// into registers before the current step's products.
// Compiled for 32-lane subgroups and 16 x 16 x 32 products (ops_gemm.CM8_SHAPE).
// Bindings: 0 xq (q8_1 words), 1 y, 2 W (GEGLU: 2 W_gate, 3 W_up).
// Push: m, n, k, x_stride (q8_1 blocks from one token to the next), y_stride, y_off.
// Dispatch: (ceil(n / 16), ceil(m / (16 CFW_TM)), 1); WG = CFW_SPLIT x 32.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#include "include/common.glsl"
#extension GL_EXT_spirv_intrinsics : require
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int fmt);
#define INT_DOT 1

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;

#ifndef CFW_TM
#define CFW_TM 2
#endif
#ifndef CFW_SPLIT
#define CFW_SPLIT 4
#endif
#define L 8u                  // accumulator elements per invocation (16 x 16 over 32 lanes)
#define BM (16u * CFW_TM)     // tokens per workgroup
#ifdef GEMM_GEGLU
#define NW 2u
#else
#define NW 1u
#endif
#define QP 12u                // shared words per record: 8 of int8 + 4 of padding
#define WREC (2u * NW * 16u)  // weight records per step: 2 chunks x NW matrices x 16 rows
#define XREC (2u * BM)        // token records per step: 2 chunks x BM tokens
#define XPL ((XREC + 31u) / 32u)   // token records per lane
#define BIAS_BITS 0x4B400000
#define BIAS_F 12582912.0

PUSH_CONSTANTS

layout(binding = 0) readonly buffer X { uint xq[]; };
layout(binding = 0) readonly buffer X2 { uvec2 xq2[]; };
layout(binding = 1) writeonly buffer Y { float y[]; };
layout(binding = 2) readonly buffer W0a { uint16_t w0_16[]; };
layout(binding = 2) readonly buffer W0c { uint w0_32[]; };
layout(binding = 3) readonly buffer W1a { uint16_t w1_16[]; };
layout(binding = 3) readonly buffer W1c { uint w1_32[]; };

#include "include/matvec_cols_unpack.glsl"

#define W16 w0_16
#define W32 w0_32
#define FN(n) PASTE(n, _w0)
#include "include/matvec_dot.glsl"
#include "include/matvec_cols_chunk.glsl"
#undef FN
#undef W16
#undef W32
#ifdef GEMM_GEGLU
#define W16 w1_16
#define W32 w1_32
#define FN(n) PASTE(n, _w1)
#include "include/matvec_dot.glsl"
#include "include/matvec_cols_chunk.glsl"
#endif

// each subgroup's own region: weight records (chunk h, matrix g, row r at (h NW + g) 16 + r), then
// token records (chunk h, token t at WREC + h BM + t)
shared uint qs[CFW_SPLIT * (WREC + XREC) * QP];
shared vec2 sc[CFW_SPLIT * (WREC + XREC)];     // (d, m) of a row chunk, (dx, sx) of a token block
shared int lay[256];
shared float red[CFW_SPLIT * NW * CFW_TM * L * 32u];   // the partial sums, reduced at the end

#define ACC8 coopmat<int, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

uint erow[L], ecol[L];
float acc[NW * CFW_TM * L];
// the next step in registers: this lane's weight record (lanes < NW 32 ... all 32 when GEGLU) and
// token records
uvec4 wa[NW], wb[NW];
vec2 ws[NW];
uvec4 xa[XPL], xb[XPL];
vec2 xs[XPL];

// step `st` (chunks 2 (s + SPLIT st) and + 1 of this subgroup s) into registers
void fetch(uint c0, uint n0, uint m0) {
    const uint lane = gl_SubgroupInvocationID;
    const uint row = min(n0 + lane % 16u, pc.n - 1u), c = c0 + lane / 16u;
    CHUNK u;
    unpack_chunk_w0(row, c, pc.k, u);
    wa[0] = uvec4(u.q[0], u.q[1], u.q[2], u.q[3]);
    wb[0] = uvec4(u.q[4], u.q[5], u.q[6], u.q[7]);
    ws[0] = vec2(u.d0, u.m0);
#ifdef GEMM_GEGLU
    unpack_chunk_w1(row, c, pc.k, u);
    wa[1] = uvec4(u.q[0], u.q[1], u.q[2], u.q[3]);
    wb[1] = uvec4(u.q[4], u.q[5], u.q[6], u.q[7]);
    ws[1] = vec2(u.d0, u.m0);
#endif
    [[unroll]] for (uint q = 0u; q < XPL; q++) {
        const uint r = lane + 32u * q;   // chunk r / BM, token r % BM
        const uint tok = min(m0 + r % BM, pc.m - 1u);
        const uint w = (tok * pc.x_stride + c0 + min(r / BM, 1u)) * 10u;
        uvec2 v[5];
        [[unroll]] for (uint i = 0u; i < 5u; i++) v[i] = xq2[(w >> 1) + i];
        xa[q] = uvec4(v[0], v[1]);
        xb[q] = uvec4(v[2], v[3]);
        xs[q] = uintBitsToFloat(v[4]);
    }
}

void put(uint base) {
    const uint lane = gl_SubgroupInvocationID;
    [[unroll]] for (uint g = 0u; g < NW; g++) {
        const uint r = base + ((lane / 16u) * NW + g) * 16u + lane % 16u;
        [[unroll]] for (uint i = 0u; i < 4u; i++) {
            qs[r * QP + i] = wa[g][i];
            qs[r * QP + 4u + i] = wb[g][i];
        }
        sc[r] = ws[g];
    }
    [[unroll]] for (uint q = 0u; q < XPL; q++) {
        const uint rr = lane + 32u * q;
        if (rr < XREC) {
            const uint r = base + WREC + rr;
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                qs[r * QP + i] = xa[q][i];
                qs[r * QP + 4u + i] = xb[q][i];
            }
            sc[r] = xs[q];
        }
    }
}

void multiply(uint base) {
    [[unroll]] for (uint h = 0u; h < 2u; h++) {
        coopmat<int8_t, gl_ScopeSubgroup, 16, 32, gl_MatrixUseA> a[CFW_TM];
        float dx[CFW_TM * L], sx[CFW_TM * L];
        [[unroll]] for (uint i = 0u; i < CFW_TM; i++) {
            const uint xr = base + WREC + h * BM + 16u * i;
            coopMatLoad(a[i], qs, xr * QP, QP, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint e = 0u; e < L; e++) {
                const vec2 s = sc[xr + erow[e]];
                dx[i * L + e] = s.x;
                sx[i * L + e] = s.y;
            }
        }
        ACC8 p[NW * CFW_TM];
        [[unroll]] for (uint g = 0u; g < NW; g++) {
            const uint wr = base + (h * NW + g) * 16u;
            coopmat<int8_t, gl_ScopeSubgroup, 32, 16, gl_MatrixUseB> b;
            coopMatLoad(b, qs, wr * QP, QP, gl_CooperativeMatrixLayoutColumnMajor);
            [[unroll]] for (uint i = 0u; i < CFW_TM; i++) p[g * CFW_TM + i] = coopMatMulAdd(a[i], b, ACC8(BIAS_BITS));
        }
        [[unroll]] for (uint g = 0u; g < NW; g++) {
            const uint wr = base + (h * NW + g) * 16u;
            float dw[L], mw[L];
            [[unroll]] for (uint e = 0u; e < L; e++) {
                const vec2 s = sc[wr + ecol[e]];
                dw[e] = s.x;
                mw[e] = s.y;
            }
            [[unroll]] for (uint i = 0u; i < CFW_TM; i++) {
                [[unroll]] for (uint e = 0u; e < L; e++) {
                    // `precise`: the bias must come off before any other arithmetic
                    precise const float f = intBitsToFloat(p[g * CFW_TM + i][e]) - BIAS_F;
                    const uint o = (g * CFW_TM + i) * L + e;
                    acc[o] = fma(sx[i * L + e], mw[e], fma(f, dx[i * L + e] * dw[e], acc[o]));
                }
            }
        }
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    const uint n0 = gl_WorkGroupID.x * 16u, m0 = gl_WorkGroupID.y * BM;
    const uint base = sg * (WREC + XREC);
    const uint pairs = pc.k / 64u;                 // chunk pairs; ops_gemm checks k % 64 == 0

    for (uint t = tid; t < 256u; t += WG) lay[t] = int(t);
    barrier();
    {
        ACC8 p;
        coopMatLoad(p, lay, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
        [[unroll]] for (uint e = 0u; e < L; e++) {
            erow[e] = uint(p[e]) >> 4;
            ecol[e] = uint(p[e]) & 15u;
        }
    }
    [[unroll]] for (uint i = 0u; i < NW * CFW_TM * L; i++) acc[i] = 0.0;

    if (sg < CFW_SPLIT && sg < pairs) {
        fetch(2u * sg, n0, m0);
        for (uint pr = sg; pr < pairs; pr += CFW_SPLIT) {
            put(base);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            if (pr + CFW_SPLIT < pairs) fetch(2u * (pr + CFW_SPLIT), n0, m0);
            multiply(base);
            subgroupBarrier();   // the region is rewritten by the next put
        }
    }
    // the split's partial sums, added positionally (every subgroup holds the same layout)
    if (sg < CFW_SPLIT) {
        [[unroll]] for (uint o = 0u; o < NW * CFW_TM * L; o++) red[(sg * NW * CFW_TM * L + o) * 32u + lane] = acc[o];
    }
    barrier();
    if (sg != 0u) return;
    [[unroll]] for (uint o = 0u; o < NW * CFW_TM * L; o++) {
        float v = 0.0;
        [[unroll]] for (uint s = 0u; s < CFW_SPLIT; s++) v += red[(s * NW * CFW_TM * L + o) * 32u + lane];
        acc[o] = v;
    }
    [[unroll]] for (uint i = 0u; i < CFW_TM; i++) {
        [[unroll]] for (uint e = 0u; e < L; e++) {
            const uint tok = m0 + 16u * i + erow[e], row = n0 + ecol[e];
            if (tok < pc.m && row < pc.n) {
#ifdef GEMM_GEGLU
                y[tok * pc.y_stride + pc.y_off + row] = gelu_tanh(acc[i * L + e]) * acc[(CFW_TM + i) * L + e];
#else
                y[tok * pc.y_stride + pc.y_off + row] = acc[i * L + e];
#endif
            }
        }
    }
}
