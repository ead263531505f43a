#version 450
// Multi-column int8 matvec: Y[v][r] = W[r, :] . X[v] for n_vecs vectors X[v] given as q8_1 blocks
// (include/q8_1_block.glsl), each weight block read from memory and unpacked to packed int8 ONCE
// for NCOLS of them, the dot products on the packed int8 dot instruction (OpSDot, as the int8
// path of matvec.comp), f32 accumulation. For the batched decode step and forwards of a few
// tokens: B vectors cost one pass over the weights instead of B (the single-vector int8 matvec)
// or a GEMM tile dequantized per 64 tokens.
//
// Shape: each subgroup owns ROWS consecutive rows (SUBGROUP_ROWS row groups per workgroup); its
// lanes stride over the row's blocks (pairs of blocks for Q4_0 / Q8_0: 32-bit loads, as
// matvec.comp's block-pair path), reduce with subgroupAdd. A workgroup takes NCOLS of the
// n_vecs vectors: the workgroups of one row group and the successive column tiles are
// neighbours in dispatch order (group = row_group * col_tiles + tile), so where n_vecs > NCOLS
// the later tiles find the row group's weights in L2.
// Q4_K and Q6_K: each 32-weight chunk's 8 words of 4- / 6-bit values are unpacked once into
// packed int8 (with the chunk's scale and min) and dotted with every vector's block.
// Epilogues: plain (up to three matrices of one type concatenated: fused QKV; MIXED_V: W2 of
// type V_WTYPE_*, include/wtype_v.glsl, no block-pair path) and EPI_GEGLU
// (y = gelu_tanh(W0 x) * (W1 x)).
// Layout: x of vector v at block x_off + v * x_stride; y at y_off + v * y_stride.
#include "include/common.glsl"
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (SPV_KHR_integer_dot_product), emitted directly: Debian 12's glslc lacks GL_EXT_integer_dot_product
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int fmt);
#define INT_DOT 1

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint ROWS = 2;           // rows per subgroup
layout(constant_id = 2) const uint SUBGROUP_ROWS = 4;  // row groups per workgroup
layout(constant_id = 3) const uint NCOLS = 8;          // vectors per workgroup (column tile)

PUSH_CONSTANTS

layout(binding = 0) readonly buffer X { uint xq[]; };
layout(binding = 0) readonly buffer X4 { uvec4 xq4[]; };
layout(binding = 1) writeonly buffer Y { float y[]; };
layout(binding = 2) readonly buffer W0a { uint16_t w0_16[]; };
layout(binding = 2) readonly buffer W0c { uint w0_32[]; };
layout(binding = 3) readonly buffer W1a { uint16_t w1_16[]; };
layout(binding = 3) readonly buffer W1c { uint w1_32[]; };
layout(binding = 4) readonly buffer W2a { uint16_t w2_16[]; };
layout(binding = 4) readonly buffer W2c { uint w2_32[]; };

#include "include/matvec_cols_unpack.glsl"

#define W16 w0_16
#define W32 w0_32
#define FN(n) PASTE(n, _w0)
#include "include/matvec_dot.glsl"
#include "include/matvec_cols_chunk.glsl"
#undef FN
#undef W16
#undef W32
#define W16 w1_16
#define W32 w1_32
#define FN(n) PASTE(n, _w1)
#include "include/matvec_dot.glsl"
#include "include/matvec_cols_chunk.glsl"
#undef FN
#undef W16
#undef W32
#define W16 w2_16
#define W32 w2_32
#define FN(n) PASTE(n, _w2)
#ifdef MIXED_V
#include "include/wtype_v.glsl"
#endif
#include "include/matvec_dot.glsl"
#include "include/matvec_cols_chunk.glsl"
#ifdef MIXED_V
#undef HAS_PAIRS
#endif

#ifdef HAS_PAIRS
// Q4_0 / Q8_0 block of packed words -> 8 words of packed int8 (Q4_0: its nibbles 0..15; the -8
// offset is applied through the x block's sum)
void unpack_block(uint q[QWORDS], out uint u[8]) {
#if defined(WTYPE_Q4_0)
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        u[j] = q[j] & 0x0F0F0F0Fu;
        u[4u + j] = (q[j] >> 4) & 0x0F0F0F0Fu;
    }
#else
    [[unroll]] for (uint j = 0u; j < 8u; j++) u[j] = q[j];
#endif
}

// the pair's sum(w x) from its blocks' integer dots s0, s1 with the vector's two q8_1 blocks xw
float pair_i8(float d0, float d1, int s0, int s1, uint xw[20]) {
    const float dx0 = uintBitsToFloat(xw[8]), dx1 = uintBitsToFloat(xw[18]);
#if defined(WTYPE_Q4_0)
    return d0 * (dx0 * float(s0) - 8.0 * uintBitsToFloat(xw[9])) + d1 * (dx1 * float(s1) - 8.0 * uintBitsToFloat(xw[19]));
#else
    return d0 * dx0 * float(s0) + d1 * dx1 * float(s1);
#endif
}
#endif

void main() {
    const uint col_tiles = (pc.n_vecs + NCOLS - 1u) / NCOLS;
    const uint wg_index = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint group = wg_index / col_tiles;
    const uint v0 = (wg_index % col_tiles) * NCOLS;           // this workgroup's first vector
    const uint nv = min(NCOLS, pc.n_vecs - v0);           // and how many (uniform)
    const uint n_chunks = pc.n_cols >> 5;
    // the invocations this subgroup really has (a 32-wide workgroup at wave64 is one half-empty
    // subgroup; lavapipe runs subgroups of <= 16 while reporting 32/64): the lanes' stride
    const uint lanes = subgroupAdd(1u);
#ifdef EPI_GEGLU
    const uint total = pc.rows0;
#else
    const uint total = pc.rows0 + pc.rows1 + pc.rows2;
#endif
    for (uint rg = gl_SubgroupID; rg < SUBGROUP_ROWS; rg += gl_NumSubgroups) {
        const uint first = (group * SUBGROUP_ROWS + rg) * ROWS;
        if (first >= total) break;
        float acc[ROWS * NCOLS];
#ifdef EPI_GEGLU
        float acc_up[ROWS * NCOLS];
#endif
        [[unroll]] for (uint i = 0u; i < ROWS * NCOLS; i++) {
            acc[i] = 0.0;
#ifdef EPI_GEGLU
            acc_up[i] = 0.0;
#endif
        }
#ifdef HAS_PAIRS
        if ((pc.n_cols & 63u) == 0u && ((pc.x_off | pc.x_stride) & 1u) == 0u) {
            // block pairs: each row's two blocks loaded (32-bit loads) and unpacked once, then
            // each vector's two q8_1 blocks (80 B, uvec4-aligned) loaded once for all the rows
            const uint n_pairs = pc.n_cols >> 6;
            for (uint p = gl_SubgroupInvocationID; p < n_pairs; p += lanes) {
                float da[ROWS], db[ROWS];
                uint ua[ROWS * 8u], ub[ROWS * 8u];
#ifdef EPI_GEGLU
                float ea[ROWS], eb[ROWS];
                uint va[ROWS * 8u], vb[ROWS * 8u];
#endif
                [[unroll]] for (uint i = 0u; i < ROWS; i++) {
                    const uint g = min(first + i, total - 1u);   // rows past the end: read, never stored
                    float a, b;
                    uint t0[QWORDS], t1[QWORDS], u0[8], u1[8];
#ifdef EPI_GEGLU
                    load_pair_w1(g, p, pc.n_cols, a, b, t0, t1);
                    unpack_block(t0, u0);
                    unpack_block(t1, u1);
                    ea[i] = a; eb[i] = b;
                    [[unroll]] for (uint k = 0u; k < 8u; k++) { va[i * 8u + k] = u0[k]; vb[i * 8u + k] = u1[k]; }
                    load_pair_w0(g, p, pc.n_cols, a, b, t0, t1);
#else
                    if (g < pc.rows0) load_pair_w0(g, p, pc.n_cols, a, b, t0, t1);
                    else if (g < pc.rows0 + pc.rows1) load_pair_w1(g - pc.rows0, p, pc.n_cols, a, b, t0, t1);
                    else load_pair_w2(g - pc.rows0 - pc.rows1, p, pc.n_cols, a, b, t0, t1);
#endif
                    unpack_block(t0, u0);
                    unpack_block(t1, u1);
                    da[i] = a; db[i] = b;
                    [[unroll]] for (uint k = 0u; k < 8u; k++) { ua[i * 8u + k] = u0[k]; ub[i * 8u + k] = u1[k]; }
                }
                [[unroll]] for (uint j = 0u; j < NCOLS; j++) {
                    if (j >= nv) break;
                    uint xw[20];
                    const uint xi = (pc.x_off + (v0 + j) * pc.x_stride + 2u * p) * 10u;   // words; 80 B per pair
                    [[unroll]] for (uint k = 0u; k < 5u; k++) {
                        const uvec4 t = xq4[(xi >> 2) + k];
                        xw[4u * k] = t.x; xw[4u * k + 1u] = t.y; xw[4u * k + 2u] = t.z; xw[4u * k + 3u] = t.w;
                    }
                    [[unroll]] for (uint i = 0u; i < ROWS; i++) {
                        int s0 = 0, s1 = 0;
                        [[unroll]] for (uint k = 0u; k < 8u; k++) {
                            s0 = sdot4x8(ua[i * 8u + k], xw[k], 0) + s0;
                            s1 = sdot4x8(ub[i * 8u + k], xw[10u + k], 0) + s1;
                        }
                        acc[i * NCOLS + j] += pair_i8(da[i], db[i], s0, s1, xw);
#ifdef EPI_GEGLU
                        s0 = 0; s1 = 0;
                        [[unroll]] for (uint k = 0u; k < 8u; k++) {
                            s0 = sdot4x8(va[i * 8u + k], xw[k], 0) + s0;
                            s1 = sdot4x8(vb[i * 8u + k], xw[10u + k], 0) + s1;
                        }
                        acc_up[i * NCOLS + j] += pair_i8(ea[i], eb[i], s0, s1, xw);
#endif
                    }
                }
            }
        } else
#endif
        {
            // any type, any multiple of 32 columns: chunk by chunk, each chunk's weights unpacked
            // once per row (matvec_cols_chunk.glsl) and dotted with every vector's block
            for (uint c = gl_SubgroupInvocationID; c < n_chunks; c += lanes) {
                [[unroll]] for (uint i = 0u; i < ROWS; i++) {
                    const uint g = first + i;
                    if (g >= total) break;
                    CHUNK u;
#ifdef EPI_GEGLU
                    CHUNK e;
                    unpack_chunk_w0(g, c, pc.n_cols, u);
                    unpack_chunk_w1(g, c, pc.n_cols, e);
#else
                    if (g < pc.rows0) unpack_chunk_w0(g, c, pc.n_cols, u);
                    else if (g < pc.rows0 + pc.rows1) unpack_chunk_w1(g - pc.rows0, c, pc.n_cols, u);
                    else unpack_chunk_w2(g - pc.rows0 - pc.rows1, c, pc.n_cols, u);
#endif
                    [[unroll]] for (uint j = 0u; j < NCOLS; j++) {
                        if (j >= nv) break;
                        const uint xb = (pc.x_off + (v0 + j) * pc.x_stride + c) * 10u;
#ifdef EPI_GEGLU
                        acc[i * NCOLS + j] += chunk_i8_w0(u, xb);
                        acc_up[i * NCOLS + j] += chunk_i8_w1(e, xb);
#else
                        if (g < pc.rows0) acc[i * NCOLS + j] += chunk_i8_w0(u, xb);
                        else if (g < pc.rows0 + pc.rows1) acc[i * NCOLS + j] += chunk_i8_w1(u, xb);
                        else acc[i * NCOLS + j] += chunk_i8_w2(u, xb);
#endif
                    }
                }
            }
        }
        [[unroll]] for (uint i = 0u; i < ROWS; i++) {
            const uint g = first + i;
            [[unroll]] for (uint j = 0u; j < NCOLS; j++) {
                if (j >= nv) break;
                const float s = subgroupAdd(acc[i * NCOLS + j]);
#ifdef EPI_GEGLU
                const float su = subgroupAdd(acc_up[i * NCOLS + j]);
                if (subgroupElect() && g < total) y[pc.y_off + (v0 + j) * pc.y_stride + g] = gelu_tanh(s) * su;
#else
                if (subgroupElect() && g < total) y[pc.y_off + (v0 + j) * pc.y_stride + g] = s;
#endif
            }
        }
    }
}
