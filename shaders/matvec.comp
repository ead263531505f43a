#version 450
// Matrix-vector product for decode: y[r] = W[r, :] . x, weights in their GGUF block layout.
// One workgroup computes ROWS consecutive output rows; its threads stride over the row's
// 32-weight chunks and reduce through subgroupAdd + shared memory. Up to three matrices of
// one type are concatenated in one dispatch (fused QKV: rows0 from W0, rows1 from W1, rows2
// from W2; MIXED_V: W2 of type V_WTYPE_*, include/wtype_v.glsl). Epilogues:
// EPI_ADD y = res + Wx; EPI_GEGLU y = gelu_tanh(W0 x) * (W1 x).
// INT_DOT: x is q8_1 blocks and the dot uses the packed int8 dot-product instruction.
// INT_DOT + QUANT_IN_REGS (Q4_0/Q8_0, n_cols % 64 == 0 only): x stays f32 and each lane
// quantizes the two blocks it needs in registers, saving a quantize dispatch and a barrier.
// Workgroups are laid out 2-D (x up to 65535) so 262k-row LM heads fit the dispatch limits;
// workgroup z is the token (prefill without a GEMM: x and y advance by x_stride / y_stride).
// EPI_NORM (decode, one token, one matrix in one binding): y = W x as the plain kernel, then
// the norm_add of norm.comp on the whole of y, in the same dispatch: every workgroup counts
// itself in an arrival counter once its rows of y are written, and the last to arrive runs
//   residual += rmsnorm(y) * w_post;  h = rmsnorm(residual) * w_next   [+ q8_1 of h if pc.q8]
// (include/last_arrival.glsl, include/norm_row.glsl), saving a dispatch and a barrier.
// Residual, h and the q8_1 blocks start at element / block 0.
// EPI_ROPE (decode, one token, fused QKV at y_off 0): each head's QK-norm + RoPE + KV-cache
// write (include/rope_head.glsl) run by the last workgroup to finish that head's rows (per-head
// arrival counters): the rope dispatch and its barrier go away. head_dim % rows per group == 0.
// EPI_GEGLU + OUT_Q8_1 (decode, one token): also writes y's q8_1 blocks (binding 5) for an int8
// down matvec, so it needs no quantize dispatch. A workgroup whose rows are whole blocks encodes
// them from shared memory; where 32 / (its rows) workgroups share a block, they count themselves
// in that block's arrival counter (binding 6) and the last to arrive encodes it.
// PRO_NORM_ADD / PRO_QUANT (decode, one token, INT_DOT only): x is not read from binding 0 but
// made by every workgroup itself, in shared memory, from the op before, whose own dispatch and
// barrier go away: PRO_NORM_ADD runs norm.comp's split norm_add (the four sums over the whole
// row, then  r = res_in + rmsnorm(pin) * w_post;  x = q8_1 of rmsnorm(r) * w_next;  workgroup 0
// writes r to res_out), PRO_QUANT quantizes pin. Redundant work per workgroup, so the dispatch
// strides its row groups over as many workgroups as the host launches (a few hundred, chosen by
// timing: autotune.choose_prologue). n_cols % 32 == 0, n_cols <= PRO_MAX_BLOCKS * 32 (per kind).
#include "include/common.glsl"
#ifdef INT_DOT
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (SPV_KHR_integer_dot_product), emitted directly: Debian 12's glslc lacks GL_EXT_integer_dot_product
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int fmt);
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint ROWS = 2;
// THREAD_ROWS = 1: each invocation computes ROWS consecutive whole rows alone (no reduction,
// no barrier), loading each chunk of x once for all of them. CPU Vulkan (lavapipe) runs
// invocations as SIMD lanes and pays for every barrier and load lane by lane, so there this is
// ~10x faster; GPUs want the cooperative form (THREAD_ROWS = 0).
layout(constant_id = 2) const uint THREAD_ROWS = 0;
layout(constant_id = 3) const uint SUBGROUP_ROWS = 0;
// NCOLS > 1 (f32 x, plain or GEGLU, SUBGROUP_ROWS shape): the product for NCOLS vectors at once,
// x and y advancing by x_stride / y_stride: each weight chunk is read from memory once for all of
// them (a few tokens: speculative decoding's verify pass, short prompts) instead of once per
// token (workgroup z) or dequantized into a GEMM tile per 64 tokens.
layout(constant_id = 4) const uint NCOLS = 1;
// MATS = 1 (THREAD_ROWS shape, one matrix, not GEGLU): the rows come from W0 only, so the
// decoders of W1 and W2 drop out at specialization; on CPU Vulkan each inlined decoder is LLVM
// compile time (lavapipe: the Q8_0 matvec compiled in ~20 s with all three, each row unrolled)
layout(constant_id = 5) const uint MATS = 3;

PUSH_CONSTANTS

#if defined(PRO_NORM_ADD) || defined(PRO_QUANT)
#define PRO
#ifndef INT_DOT
#error "the prologues make q8_1 blocks: INT_DOT only"
#endif
#ifdef PRO_NORM_ADD
#define PRO_MAX_BLOCKS 168u       // matvec.PRO_MAX_COLS["norm_add"] / 32: Gemma 3 27B's hidden size
shared float h_sh[PRO_MAX_BLOCKS * 32u];   // x in f32, before its q8_1 blocks
#else
#define PRO_MAX_BLOCKS 672u       // matvec.PRO_MAX_COLS["quant"] / 32: Gemma 3 27B's 21504-wide down input
#endif
shared uint xq[PRO_MAX_BLOCKS * 10u];   // x's q8_1 blocks, made by this workgroup (pro_make_x)
uvec4 xq4_at(uint i) { return uvec4(xq[4u * i], xq[4u * i + 1u], xq[4u * i + 2u], xq[4u * i + 3u]); }
#elif defined(INT_DOT)
layout(binding = 0) readonly buffer X { uint xq[]; };
layout(binding = 0) readonly buffer X4 { uvec4 xq4[]; };
#define xq4_at(i) xq4[i]
#ifdef QUANT_IN_REGS
layout(binding = 0) readonly buffer XF4 { vec4 xf4[]; };
#endif
#else
layout(binding = 0) readonly buffer X { float xf[]; };
layout(binding = 0) readonly buffer X4 { vec4 xf4[]; };
#endif
#if defined(EPI_NORM) || defined(OUT_Q8_1) || defined(EPI_ROPE)
layout(binding = 1) coherent buffer Y { float y[]; };     // read back by the last workgroup
#else
layout(binding = 1) buffer Y { float y[]; };
#endif
layout(binding = 2) readonly buffer W0a { uint16_t w0_16[]; };
layout(binding = 2) readonly buffer W0b { float w0_f[]; };
layout(binding = 2) readonly buffer W0c { uint w0_32[]; };
layout(binding = 3) readonly buffer W1a { uint16_t w1_16[]; };
layout(binding = 3) readonly buffer W1b { float w1_f[]; };
layout(binding = 3) readonly buffer W1c { uint w1_32[]; };
layout(binding = 4) readonly buffer W2a { uint16_t w2_16[]; };
layout(binding = 4) readonly buffer W2b { float w2_f[]; };
layout(binding = 4) readonly buffer W2c { uint w2_32[]; };
#ifdef EPI_NORM
layout(binding = 5) buffer R { float res[]; };            // the residual stream, updated
layout(binding = 6) readonly buffer NW0 { float w_post[]; };
layout(binding = 7) readonly buffer NW1 { float w_next[]; };
layout(binding = 8) coherent buffer NO { float h_out[]; };
layout(binding = 9) writeonly buffer NQ { uint h_q[]; };
#define ARRIVAL_BINDING 10
#include "include/last_arrival.glsl"
#define NORM_IN y
#define NORM_W0 w_post
#define NORM_RES res
#define NORM_W1 w_next
#define NORM_OUT h_out
#define NORM_Q h_q
#define NORM_ROW_ADD
#define NORM_ROW_Q8_1
#include "include/norm_row.glsl"
#elif defined(EPI_GEGLU) && defined(OUT_Q8_1)
layout(binding = 5) writeonly buffer YQ { uint yq[]; };   // q8_1 blocks of y (no residual here)
#define Q8_1_OUT yq
#define ARRIVAL_BINDING 6
#include "include/last_arrival.glsl"
#else
layout(binding = 5) readonly buffer R { float res[]; };
#endif
#include "include/q8_1_block.glsl"

#ifdef EPI_ROPE
#extension GL_GOOGLE_include_directive : require
#include "include/step.glsl"
STEP_BUFFER(6)
layout(binding = 7) readonly buffer QW { float qw[]; };
layout(binding = 8) readonly buffer KW { float kw[]; };
layout(binding = 9) writeonly buffer KC { uint kc[]; };
layout(binding = 10) writeonly buffer VC { uint vc[]; };
#define ARRIVAL_BINDING 11
#include "include/last_arrival.glsl"
#include "include/wg_reduce.glsl"
#define ROPE_Q y
#define ROPE_K y
#define ROPE_V y
#define ROPE_QW qw
#define ROPE_KW kw
#define ROPE_KC kc
#define ROPE_VC vc
#include "include/rope_head.glsl"
#endif

// rows of y in all: the gate's with a GEGLU (its up's rows follow in the same binding), else
// every bound range's (a fused QKV: three)
uint total_rows() {
#ifdef EPI_GEGLU
    return pc.rows0;
#else
    return pc.rows0 + pc.rows1 + pc.rows2;
#endif
}

// rows of y one workgroup computes (contiguous, from group * group_rows())
uint group_rows() { return THREAD_ROWS != 0u ? ROWS * WG : (SUBGROUP_ROWS != 0u ? ROWS * SUBGROUP_ROWS : ROWS); }

#ifdef OUT_Q8_1
#define OUT_Q8_1_MAX_ROWS 256u     // matvec.OUT_Q8_1_MAX_ROWS
shared float yq_sh[OUT_Q8_1_MAX_ROWS];   // this workgroup's rows of y, for the q8_1 step
#endif

// y[yi] = v for row `local` of this workgroup's rows (kept for the q8_1 step with OUT_Q8_1)
void store_row(uint yi, uint local, float v) {
    y[yi] = v;
#ifdef OUT_Q8_1
    yq_sh[local] = v;
#endif
}

// each binding's block decoders, then the same over x in registers (matvec_dot_regs.glsl:
// FN suffix r; f32 path only) for the whole-row-per-invocation shape
#define W16 w0_16
#define WF w0_f
#define W32 w0_32
#define FN(n) PASTE(n, _w0)
#include "include/matvec_dot.glsl"
#undef FN
#define FN(n) PASTE(n, _w0r)
#include "include/matvec_dot_regs.glsl"
#undef W16
#undef WF
#undef W32
#undef FN
#define W16 w1_16
#define WF w1_f
#define W32 w1_32
#define FN(n) PASTE(n, _w1)
#include "include/matvec_dot.glsl"
#undef FN
#define FN(n) PASTE(n, _w1r)
#include "include/matvec_dot_regs.glsl"
#undef W16
#undef WF
#undef W32
#undef FN
#define W16 w2_16
#define WF w2_f
#define W32 w2_32
#define FN(n) PASTE(n, _w2)
#ifdef MIXED_V
#include "include/wtype_v.glsl"
#endif
#include "include/matvec_dot.glsl"
#ifdef MIXED_V
#undef HAS_PAIRS
#endif
#undef FN
#define FN(n) PASTE(n, _w2r)
#include "include/matvec_dot_regs.glsl"

shared float red[ROWS][64];   // [0,32): sums, [32,64): GEGLU up sums

// Partial dot products of rows first..first+ROWS-1 over the chunks t, t+stride, ... of each row.
void accumulate(uint first, uint t, uint stride, uint total, uint x_off, uint n_chunks,
                inout float acc[ROWS], inout float acc_up[ROWS]) {
#ifdef HAS_PAIRS
#if defined(INT_DOT) && !defined(QUANT_IN_REGS)
    if ((pc.n_cols & 63u) == 0u && (x_off & 1u) == 0u) {
#else
    if ((pc.n_cols & 63u) == 0u && (x_off & 3u) == 0u) {
#endif
        // pairs of blocks: x loaded once per pair and reused by every row of the group
        [[unroll]] for (uint i = 0u; i < ROWS; i++) {
            acc[i] = 0.0;
#ifdef EPI_GEGLU
            acc_up[i] = 0.0;
#endif
        }
        uint n_pairs = pc.n_cols >> 6;
        for (uint p = t; p < n_pairs; p += stride) {
#if defined(INT_DOT) && defined(QUANT_IN_REGS)
            uint xw[20];
            uint xi = (x_off >> 2) + 16u * p;
            [[unroll]] for (uint b = 0u; b < 2u; b++) {
                float v[32];
                [[unroll]] for (uint k = 0u; k < 8u; k++) {
                    const vec4 t = xf4[xi + 8u * b + k];
                    v[4u * k] = t.x; v[4u * k + 1u] = t.y; v[4u * k + 2u] = t.z; v[4u * k + 3u] = t.w;
                }
                uint words[10];
                q8_1_encode(v, words);
                [[unroll]] for (uint k = 0u; k < 10u; k++) xw[10u * b + k] = words[k];
            }
#elif defined(INT_DOT)
            uint xw[20];
            uint xi = (x_off + 2u * p) * 10u;        // 80 B per pair: uvec4-aligned
            [[unroll]] for (uint k = 0u; k < 5u; k++) {
                uvec4 v = xq4_at((xi >> 2) + k);
                xw[4u * k] = v.x; xw[4u * k + 1u] = v.y; xw[4u * k + 2u] = v.z; xw[4u * k + 3u] = v.w;
            }
#else
            vec4 xw[16];
            uint xi = (x_off >> 2) + 16u * p;
            [[unroll]] for (uint k = 0u; k < 16u; k++) xw[k] = xf4[xi + k];
#endif
            [[unroll]] for (uint i = 0u; i < ROWS; i++) {
                uint g = first + i;
                if (g >= total) break;
#ifdef EPI_GEGLU
                acc[i] += pair_dot_w0(g, p, pc.n_cols, xw);
                acc_up[i] += pair_dot_w1(g, p, pc.n_cols, xw);
#else
                if (g < pc.rows0) acc[i] += pair_dot_w0(g, p, pc.n_cols, xw);
                else if (g < pc.rows0 + pc.rows1) acc[i] += pair_dot_w1(g - pc.rows0, p, pc.n_cols, xw);
                else acc[i] += pair_dot_w2(g - pc.rows0 - pc.rows1, p, pc.n_cols, xw);
#endif
            }
        }
    } else
#endif
#ifndef INT_DOT
    if (THREAD_ROWS != 0u) {
        // one invocation, whole rows (CPU devices, which pay for every load lane by lane):
        // each chunk of x loaded once, into registers, for all ROWS rows
        [[unroll]] for (uint i = 0u; i < ROWS; i++) {
            acc[i] = 0.0;
#ifdef EPI_GEGLU
            acc_up[i] = 0.0;
#endif
        }
        for (uint c = t; c < n_chunks; c += stride) {
            const uint xb = x_off + c * 32u, lim = min(32u, pc.n_cols - c * 32u);
            float xr[32];
            [[unroll]] for (uint k = 0u; k < 32u; k++) xr[k] = k < lim ? xf[xb + k] : 0.0;
            [[unroll]] for (uint i = 0u; i < ROWS; i++) {
                const uint g = first + i;
                if (g >= total) break;
#ifdef EPI_GEGLU
                acc[i] += chunk_dot_w0r(g, c, pc.n_cols, xr);
                acc_up[i] += chunk_dot_w1r(g, c, pc.n_cols, xr);
#else
                if (MATS == 1u || g < pc.rows0) acc[i] += chunk_dot_w0r(g, c, pc.n_cols, xr);
                else if (g < pc.rows0 + pc.rows1) acc[i] += chunk_dot_w1r(g - pc.rows0, c, pc.n_cols, xr);
                else acc[i] += chunk_dot_w2r(g - pc.rows0 - pc.rows1, c, pc.n_cols, xr);
#endif
            }
        }
    } else
#endif
    [[unroll]] for (uint i = 0u; i < ROWS; i++) {
        acc[i] = 0.0;
#ifdef EPI_GEGLU
        acc_up[i] = 0.0;
#endif
        uint g = first + i;
        if (g >= total) continue;
        for (uint c = t; c < n_chunks; c += stride) {
#ifdef INT_DOT
            uint xb = (x_off + c) * 10u;     // x_off counts q8_1 blocks
#else
            uint xb = x_off + c * 32u;
#endif
#ifdef EPI_GEGLU
            acc[i] += chunk_dot_w0(g, c, pc.n_cols, xb);
            acc_up[i] += chunk_dot_w1(g, c, pc.n_cols, xb);
#else
            // the matrix is uniform across the workgroup except where a group straddles two
            if (g < pc.rows0) acc[i] += chunk_dot_w0(g, c, pc.n_cols, xb);
            else if (g < pc.rows0 + pc.rows1) acc[i] += chunk_dot_w1(g - pc.rows0, c, pc.n_cols, xb);
            else acc[i] += chunk_dot_w2(g - pc.rows0 - pc.rows1, c, pc.n_cols, xb);
#endif
        }
    }
}

// Invocations this subgroup really has, lane ids 0..n-1 (call in the subgroup's uniform control
// flow). gl_SubgroupSize is only the most it may have: a partial subgroup (a workgroup narrower
// than the subgroup, e.g. 32 invocations at RADV's wave64; Vulkan promises full subgroups only
// under REQUIRE_FULL_SUBGROUPS) has fewer, and lavapipe reporting 32 or 64 lanes runs compute
// subgroups of at most 16. Striding rows by gl_SubgroupSize there skipped chunks (issue 23).
uint subgroup_lanes() { return subgroupAdd(1u); }

#ifndef INT_DOT
// NCOLS vectors at once (see NCOLS): acc[i * NCOLS + j] is row first + i against vector j. A
// chunk's weights are decoded once per vector, from the cache after the first. (The arrays are
// sized by spec constants, so they stay in this function: passing them on fails to compile.)
void main_subgroup_rows_cols() {
    const uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint n_chunks = (pc.n_cols + 31u) >> 5;
    const uint total = total_rows();
    const uint lanes = subgroup_lanes();
    for (uint rg = gl_SubgroupID; rg < SUBGROUP_ROWS; rg += gl_NumSubgroups) {
        const uint first = (group * SUBGROUP_ROWS + rg) * ROWS;
        if (first >= total) break;
        float acc[ROWS * NCOLS];
        float acc_up[ROWS * NCOLS];
        [[unroll]] for (uint i = 0u; i < ROWS * NCOLS; i++) {
            acc[i] = 0.0;
            acc_up[i] = 0.0;
        }
#ifdef HAS_PAIRS
        if ((pc.n_cols & 63u) == 0u && (pc.x_off & 3u) == 0u && (pc.x_stride & 3u) == 0u) {
            // block pairs: each row's pair of weight blocks loaded into registers once, then
            // every vector's 64 values of x loaded once and dotted with all of the rows
            const uint n_pairs = pc.n_cols >> 6;
            for (uint p = gl_SubgroupInvocationID; p < n_pairs; p += lanes) {
                float da[ROWS], db[ROWS];
                uint qa[ROWS * QWORDS], qb[ROWS * QWORDS];
#ifdef EPI_GEGLU
                float ua[ROWS], ub[ROWS];
                uint uqa[ROWS * QWORDS], uqb[ROWS * QWORDS];
#endif
                [[unroll]] for (uint i = 0u; i < ROWS; i++) {
                    const uint g = min(first + i, total - 1u);      // rows past the end: read, never stored
                    float a, b;
                    uint t0[QWORDS], t1[QWORDS];
#ifdef EPI_GEGLU
                    load_pair_w1(g, p, pc.n_cols, a, b, t0, t1);
                    ua[i] = a; ub[i] = b;
                    [[unroll]] for (uint k = 0u; k < uint(QWORDS); k++) { uqa[i * QWORDS + k] = t0[k]; uqb[i * QWORDS + k] = t1[k]; }
                    load_pair_w0(g, p, pc.n_cols, a, b, t0, t1);
#else
                    if (g < pc.rows0) load_pair_w0(g, p, pc.n_cols, a, b, t0, t1);
                    else if (g < pc.rows0 + pc.rows1) load_pair_w1(g - pc.rows0, p, pc.n_cols, a, b, t0, t1);
                    else load_pair_w2(g - pc.rows0 - pc.rows1, p, pc.n_cols, a, b, t0, t1);
#endif
                    da[i] = a; db[i] = b;
                    [[unroll]] for (uint k = 0u; k < uint(QWORDS); k++) { qa[i * QWORDS + k] = t0[k]; qb[i * QWORDS + k] = t1[k]; }
                }
                [[unroll]] for (uint j = 0u; j < NCOLS; j++) {
                    vec4 xv[16];
                    const uint xi = ((pc.x_off + j * pc.x_stride) >> 2) + 16u * p;
                    [[unroll]] for (uint k = 0u; k < 16u; k++) xv[k] = xf4[xi + k];
                    [[unroll]] for (uint i = 0u; i < ROWS; i++) {
                        uint t0[QWORDS], t1[QWORDS];
                        [[unroll]] for (uint k = 0u; k < uint(QWORDS); k++) { t0[k] = qa[i * QWORDS + k]; t1[k] = qb[i * QWORDS + k]; }
                        acc[i * NCOLS + j] += da[i] * block_f32_w0(t0, xv, 0u) + db[i] * block_f32_w0(t1, xv, 8u);
#ifdef EPI_GEGLU
                        [[unroll]] for (uint k = 0u; k < uint(QWORDS); k++) { t0[k] = uqa[i * QWORDS + k]; t1[k] = uqb[i * QWORDS + k]; }
                        acc_up[i * NCOLS + j] += ua[i] * block_f32_w0(t0, xv, 0u) + ub[i] * block_f32_w0(t1, xv, 8u);
#endif
                    }
                }
            }
        } else
#endif
        [[unroll]] for (uint i = 0u; i < ROWS; i++) {
            const uint g = first + i;
            if (g >= total) continue;
            for (uint c = gl_SubgroupInvocationID; c < n_chunks; c += lanes) {
                [[unroll]] for (uint j = 0u; j < NCOLS; j++) {
                    const uint xb = pc.x_off + j * pc.x_stride + c * 32u;
#ifdef EPI_GEGLU
                    acc[i * NCOLS + j] += chunk_dot_w0(g, c, pc.n_cols, xb);
                    acc_up[i * NCOLS + j] += chunk_dot_w1(g, c, pc.n_cols, xb);
#else
                    if (g < pc.rows0) acc[i * NCOLS + j] += chunk_dot_w0(g, c, pc.n_cols, xb);
                    else if (g < pc.rows0 + pc.rows1) acc[i * NCOLS + j] += chunk_dot_w1(g - pc.rows0, c, pc.n_cols, xb);
                    else acc[i * NCOLS + j] += chunk_dot_w2(g - pc.rows0 - pc.rows1, c, pc.n_cols, xb);
#endif
                }
            }
        }
        [[unroll]] for (uint i = 0u; i < ROWS; i++) {
            const uint g = first + i;
            [[unroll]] for (uint j = 0u; j < NCOLS; j++) {
                const float s = subgroupAdd(acc[i * NCOLS + j]);
#ifdef EPI_GEGLU
                const float su = subgroupAdd(acc_up[i * NCOLS + j]);
                if (subgroupElect() && g < total) y[pc.y_off + j * pc.y_stride + g] = gelu_tanh(s) * su;
#else
                if (subgroupElect() && g < total) y[pc.y_off + j * pc.y_stride + g] = s;
#endif
            }
        }
    }
}
#endif

// SUBGROUP_ROWS = RG > 0: each subgroup owns its own ROWS rows (RG row groups per workgroup),
// reduced with subgroupAdd alone: no shared memory, no barrier. Short rows (a few hundred
// blocks) keep every lane busy this way. Correct for any actual subgroup size, full or partial:
// a subgroup takes row groups sid, sid + nsg, ... < RG; its lanes stride by subgroup_lanes().
void main_subgroup_rows(const uint group) {
    uint n_chunks = (pc.n_cols + 31u) >> 5;
    const uint total = total_rows();
    uint tok = gl_WorkGroupID.z;
    uint x_off = pc.x_off + tok * pc.x_stride;
    uint y_off = pc.y_off + tok * pc.y_stride;
    uint res_off = pc.res_off + tok * pc.y_stride;
    const uint lanes = subgroup_lanes();
    for (uint rg = gl_SubgroupID; rg < SUBGROUP_ROWS; rg += gl_NumSubgroups) {
        uint first = (group * SUBGROUP_ROWS + rg) * ROWS;
        if (first >= total) break;
        float acc[ROWS];
        float acc_up[ROWS];
        accumulate(first, gl_SubgroupInvocationID, lanes, total, x_off, n_chunks, acc, acc_up);
        [[unroll]] for (uint i = 0u; i < ROWS; i++) {
            float s = subgroupAdd(acc[i]);
#ifdef EPI_GEGLU
            float su = subgroupAdd(acc_up[i]);
#endif
            uint g = first + i;
            if (subgroupElect() && g < total) {
#if defined(EPI_GEGLU)
                store_row(y_off + g, g - group * group_rows(), gelu_tanh(s) * su);
#elif defined(EPI_ADD)
                y[y_off + g] = res[res_off + g] + s;
#else
                y[y_off + g] = s;
#endif
            }
        }
    }
}

void main_thread_rows(const uint group) {
    // each invocation owns ROWS consecutive rows; `accumulate` (stride 1: every chunk) loads x
    // once per block pair or chunk for all of them
    uint n_chunks = (pc.n_cols + 31u) >> 5;
    const uint total = total_rows();
    uint tok = gl_WorkGroupID.z;
    uint x_off = pc.x_off + tok * pc.x_stride;
    uint y_off = pc.y_off + tok * pc.y_stride;
    uint res_off = pc.res_off + tok * pc.y_stride;
    uint first = (group * WG + gl_LocalInvocationID.x) * ROWS;
    if (first >= total) return;
    float acc[ROWS];
    float acc_up[ROWS];
    accumulate(first, 0u, 1u, total, x_off, n_chunks, acc, acc_up);
    [[unroll]] for (uint i = 0u; i < ROWS; i++) {
        uint g = first + i;
        if (g >= total) break;
#if defined(EPI_GEGLU)
        store_row(y_off + g, g - group * group_rows(), gelu_tanh(acc[i]) * acc_up[i]);
#elif defined(EPI_ADD)
        y[y_off + g] = res[res_off + g] + acc[i];
#else
        y[y_off + g] = acc[i];
#endif
    }
}

void main_cooperative(const uint group) {
    uint t = gl_LocalInvocationID.x;
    uint n_chunks = (pc.n_cols + 31u) >> 5;
    const uint total = total_rows();
    uint first = group * ROWS;
    if (first >= total) return;     // whole workgroup leaves together
    uint tok = gl_WorkGroupID.z;
    uint x_off = pc.x_off + tok * pc.x_stride;
    uint y_off = pc.y_off + tok * pc.y_stride;
    uint res_off = pc.res_off + tok * pc.y_stride;

    float acc[ROWS];
    float acc_up[ROWS];
    accumulate(first, t, WG, total, x_off, n_chunks, acc, acc_up);

    // reduce: subgroups first, then across subgroups through shared memory
    uint sg = gl_SubgroupID;
    uint nsg = gl_NumSubgroups;
    [[unroll]] for (uint i = 0u; i < ROWS; i++) {
        float s = subgroupAdd(acc[i]);
#ifdef EPI_GEGLU
        float su = subgroupAdd(acc_up[i]);
#endif
        if (nsg == 1u) {
            acc[i] = s;
#ifdef EPI_GEGLU
            acc_up[i] = su;
#endif
        } else if (subgroupElect()) {
            red[i][sg] = s;
#ifdef EPI_GEGLU
            red[i][32u + sg] = su;
#endif
        }
    }
    if (nsg > 1u) {
        barrier();
        if (t == 0u) {
            [[unroll]] for (uint i = 0u; i < ROWS; i++) {
                float s = 0.0;
                for (uint k = 0u; k < nsg; k++) s += red[i][k];
                acc[i] = s;
#ifdef EPI_GEGLU
                float su = 0.0;
                for (uint k = 0u; k < nsg; k++) su += red[i][32u + k];
                acc_up[i] = su;
#endif
            }
        }
    }
    if (t == 0u) {
        [[unroll]] for (uint i = 0u; i < ROWS; i++) {
            uint g = first + i;
            if (g >= total) break;
#if defined(EPI_GEGLU)
            store_row(y_off + g, i, gelu_tanh(acc[i]) * acc_up[i]);
#elif defined(EPI_ADD)
            y[y_off + g] = res[res_off + g] + acc[i];
#else
            y[y_off + g] = acc[i];
#endif
        }
    }
}

// One row group's work: its rows of y, then the epilogues that count row groups (the q8_1
// blocks of y, the rope per head). Uniform over the workgroup.
void run_group(const uint group) {
    // spec constants: uniform branches; the sub-kernels' early returns end only their own call
#ifndef INT_DOT
    if (NCOLS > 1u) main_subgroup_rows_cols();
    else
#endif
    if (THREAD_ROWS != 0u) main_thread_rows(group);
    else if (SUBGROUP_ROWS != 0u) main_subgroup_rows(group);
    else main_cooperative(group);
#ifdef OUT_Q8_1
    const uint gr = group_rows();       // rows0 is a multiple of 32; gr a multiple or divisor of 32
    if (gr >= 32u) {
        // this workgroup's rows of y are whole q8_1 blocks
        barrier();
        for (uint b = gl_LocalInvocationID.x; b < gr / 32u; b += WG) {
            const uint row0 = group * gr + 32u * b;
            if (row0 >= pc.rows0) break;
            float v[32];
            [[unroll]] for (uint k = 0u; k < 32u; k++) v[k] = yq_sh[32u * b + k];
            q8_1_store(v, row0 / 32u);
        }
    } else if (group * gr < pc.rows0) {
        // 32 / gr workgroups share the block: the last to arrive encodes it from y
        const uint blk = group * gr / 32u;
        if (arrive_last(blk, 32u / gr) && gl_LocalInvocationIndex == 0u) {
            float v[32];
            [[unroll]] for (uint k = 0u; k < 32u; k++) v[k] = y[32u * blk + k];
            q8_1_store(v, blk);
        }
    }
#endif
#ifdef EPI_ROPE
    {
        // the row groups of one head (head_dim / group_rows() of them) count themselves in the
        // head's counter; the last one runs QK-norm + RoPE (q in place) or the cache write (k, v)
        const uint first = group * group_rows();
        if (first < total_rows()) {
            const uint D = pc.head_dim, hh = first / D;
            if (arrive_last(hh, D / group_rows())) {
                if (hh < pc.n_heads) rope_q_head(hh * D, step.pos);
                else if (hh < pc.n_heads + pc.n_kv_heads) rope_k_head(hh * D, hh - pc.n_heads, step.pos);
                else copy_v_head(hh * D, hh - pc.n_heads - pc.n_kv_heads, step.pos);
            }
        }
    }
#endif
}

#ifdef PRO
#if defined(EPI_NORM) || defined(OUT_Q8_1) || defined(QUANT_IN_REGS)
#error "a prologue goes with the plain, GEGLU and rope epilogues on q8_1 blocks"
#endif
layout(binding = 12) readonly buffer PIN4 { vec4 pin4[]; };
#ifdef PRO_NORM_ADD
layout(binding = 13) readonly buffer PRI4 { vec4 pres_in4[]; };
layout(binding = 14) readonly buffer PW04 { vec4 pw_post4[]; };
layout(binding = 15) readonly buffer PW14 { vec4 pw_next4[]; };
layout(binding = 16) writeonly buffer PRO4 { vec4 pres_out4[]; };
shared vec4 pro_red[64];

// norm.comp's four sums over the whole row (NORM_ADD_SPLIT): S(x^2), S(res^2), S(res*a),
// S(a^2) with a = x * w_post; two steps' loads in flight per invocation
vec4 pro_sums(uint n4) {
    vec4 s = vec4(0.0);
    for (uint i = gl_LocalInvocationIndex; i < n4; i += 2u * WG) {
        const uint j = min(i + WG, n4 - 1u);
        const float keep = i + WG < n4 ? 1.0 : 0.0;
        const vec4 x0 = pin4[i], r0 = pres_in4[i], w0 = pw_post4[i];
        const vec4 x1 = pin4[j] * keep, r1 = pres_in4[j] * keep, w1 = pw_post4[j];
        const vec4 a0 = x0 * w0, a1 = x1 * w1;
        s += vec4(dot(x0, x0), dot(r0, r0), dot(r0, a0), dot(a0, a0));
        s += vec4(dot(x1, x1), dot(r1, r1), dot(r1, a1), dot(a1, a1));
    }
    s = subgroupAdd(s);
    if (subgroupElect()) pro_red[gl_SubgroupID] = s;
    barrier();
    vec4 t = vec4(0.0);
    for (uint k = 0u; k < gl_NumSubgroups; k++) t += pro_red[k];
    return t;
}
#endif

// x's q8_1 blocks into shared memory (xq), the same in every workgroup; workgroup 0 also writes
// the new residual (PRO_NORM_ADD: every invocation's elements i = tid + k * WG, coalesced, into
// h_sh, then a block per invocation encoded from there)
void pro_make_x() {
    const uint n = pc.n_cols, nb = n / 32u, tid = gl_LocalInvocationIndex;
#ifdef PRO_NORM_ADD
    const vec4 s = pro_sums(n / 4u);
    const float inv = inversesqrt(s.x / float(n) + pc.pro_eps);
    const float ss2 = max(0.0, s.y + 2.0 * inv * s.z + inv * inv * s.w);
    const float inv2 = inversesqrt(ss2 / float(n) + pc.pro_eps);
    const bool writer = gl_WorkGroupID.x == 0u && gl_WorkGroupID.y == 0u;
    for (uint i = tid; i < n / 4u; i += WG) {
        const vec4 r = pres_in4[i] + pin4[i] * inv * pw_post4[i];
        if (writer) pres_out4[i] = r;
        const vec4 o = r * inv2 * pw_next4[i];
        h_sh[4u * i] = o.x; h_sh[4u * i + 1u] = o.y; h_sh[4u * i + 2u] = o.z; h_sh[4u * i + 3u] = o.w;
    }
    barrier();
#endif
    for (uint b = tid; b < nb; b += WG) {
        float v[32];
#ifdef PRO_NORM_ADD
        [[unroll]] for (uint k = 0u; k < 32u; k++) v[k] = h_sh[32u * b + k];
#else
        [[unroll]] for (uint k = 0u; k < 8u; k++) {
            const vec4 o = pin4[8u * b + k];
            v[4u * k] = o.x; v[4u * k + 1u] = o.y; v[4u * k + 2u] = o.z; v[4u * k + 3u] = o.w;
        }
#endif
        uint words[10];
        q8_1_encode(v, words);
        [[unroll]] for (uint k = 0u; k < 10u; k++) xq[10u * b + k] = words[k];
    }
    barrier();
}
#endif

void main() {
#ifdef PRO
    // x made here, then the row groups strided over the workgroups launched
    pro_make_x();
    const uint total = total_rows();
    const uint n_groups = (total + group_rows() - 1u) / group_rows();
    const uint n_wg = gl_NumWorkGroups.x * gl_NumWorkGroups.y;
    for (uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; group < n_groups; group += n_wg) {
        run_group(group);
        barrier();      // the reduction's shared slots are free again
    }
#else
    run_group(gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x);
#endif
#ifdef EPI_NORM
    if (arrive_last(0u, gl_NumWorkGroups.x * gl_NumWorkGroups.y)) {
        float ov[NORM_MAXE];
        if (norm_add_row_regs(pc.y_off, 0u, pc.rows0, pc.eps, ov)) {
            if (pc.q8 != 0u) quantize_regs_q8_1(ov, pc.rows0, 0u);
        } else {
            norm_add_row(pc.y_off, 0u, pc.rows0, pc.eps);
            if (pc.q8 != 0u) quantize_row_q8_1(0u, pc.rows0, 0u);
        }
    }
#endif
}
