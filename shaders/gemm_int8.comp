#version 450
// Prefill GEMM on the packed int8 dot product (no matrix cores needed): the contract of gemm.comp
// with x given as q8_1 blocks (include/q8_1_block.glsl; ops_gemm quantizes it first):
//   y[m, y_off + n] = sum_k x[m, k] * W[n, k]        (GEMM_GEGLU: gelu_tanh(x Wg^T) * (x Wu^T))
// W in its GGUF layout (-D WTYPE_*, any type the multi-column int8 matvec reads).
//
// Why: the weights stay integers — each 32-weight chunk is unpacked once per workgroup into
// packed int8 with its scales (include/matvec_cols_chunk.glsl, the decoder the int8 matvecs
// use) — and activations are 4x fewer bytes than f32; every product is an OpSDot of 4 int8
// pairs with integer accumulation, then one f32 scale per 32-wide chunk (f32 accumulation).
//
// Tile: BN = 16 I8_RT weight rows x BM = 16 I8_TT tokens per workgroup of 256 invocations; each
// invocation owns I8_RT rows (tr + 16 i) x I8_TT tokens (tt + 16 j) in registers. K advances
// I8_KC chunks (32 values each) a step. A step's chunks are records of 48 bytes in shared
// memory — a row's chunk: 8 words of int8 + (d0, d1, m0, m1); a token's q8_1 block: 8 words +
// (dx, dx sum, dx sum(first 16), dx sum(last 16)) — so one 16-byte-load pattern serves both and
// a 48-byte stride keeps eight lanes' 16-byte loads on distinct banks. Two buffers, filled
// through registers: the next step's records are loaded and unpacked before the current step's
// products and stored after them, one barrier per step. Rows / tokens past the edge read the
// last one (no branch) and are never stored.
// Integer sums start at the bit pattern of 1.5 * 2^23 so that intBitsToFloat(sum) - 1.5 * 2^23
// is the exact float of the sum (|sum| < 2^22 for 32 products of |q| <= 127) without a
// conversion instruction.
// Bindings: 0 xq (q8_1 words), 1 y, 2 W (GEGLU: 2 W_gate, 3 W_up).
// Push: m, n, k, x_stride (q8_1 blocks from one token to the next), y_stride, y_off.
// Dispatch: (ceil(n / BN), ceil(m / BM), 1).
#include "include/common.glsl"
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (SPV_KHR_integer_dot_product), emitted directly: Debian 12's glslc lacks GL_EXT_integer_dot_product
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int fmt);
#define INT_DOT 1

layout(local_size_x = 256) in;

#ifndef I8_RT
#define I8_RT 4
#endif
#ifndef I8_TT
#define I8_TT 4
#endif
#ifndef I8_KC
#define I8_KC 2
#endif
#define BN (16u * I8_RT)
#define BM (16u * I8_TT)
#ifdef GEMM_GEGLU
#define NW 2u                 // weight matrices: gate, up
#else
#define NW 1u
#endif
#define NREC ((NW * BN + BM) * I8_KC)   // records per step
#define RREC ((NREC + 255u) / 256u)     // per invocation
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

// [buffer][record][3]: words 0..7 int8, then 4 floats (as bits)
shared uvec4 recs[2u * NREC * 3u];

// Record r of a step starting at chunk c0, loaded from memory and unpacked: the weight rows'
// chunks first (gate rows, then up rows), then the tokens' blocks; chunk (r % I8_KC) of its row
// or token, so neighbouring invocations read neighbouring bytes of one row.
void load_record(uint r, uint c0, uint n0, uint m0, out uvec4 a, out uvec4 b, out uvec4 s) {
    const uint kc = r % I8_KC, item = r / I8_KC, c = c0 + kc;
    if (item < NW * BN) {
        const uint row = min(n0 + item % BN, pc.n - 1u);
        CHUNK u;
#ifdef GEMM_GEGLU
        if (item >= BN) unpack_chunk_w1(row, c, pc.k, u); else
#endif
        unpack_chunk_w0(row, c, pc.k, u);
        a = uvec4(u.q[0], u.q[1], u.q[2], u.q[3]);
        b = uvec4(u.q[4], u.q[5], u.q[6], u.q[7]);
        s = uvec4(floatBitsToUint(u.d0), floatBitsToUint(u.d1), floatBitsToUint(u.m0), floatBitsToUint(u.m1));
    } else {
        const uint tok = min(m0 + item - NW * BN, pc.m - 1u);
        const uint w = (tok * pc.x_stride + c) * 10u;   // words; blocks are 8-byte aligned
        uvec2 v[5];
        [[unroll]] for (uint i = 0u; i < 5u; i++) v[i] = xq2[(w >> 1) + i];
        a = uvec4(v[0], v[1]);
        b = uvec4(v[2], v[3]);
        const float dx = uintBitsToFloat(v[4].x);
        float h0 = 0.0, h1 = 0.0;
#if defined(WTYPE_Q2_K)
        int s0 = 0, s1 = 0;
        [[unroll]] for (uint i = 0u; i < 4u; i++) {
            s0 = sdot4x8(0x01010101u, a[i], 0) + s0;
            s1 = sdot4x8(0x01010101u, b[i], 0) + s1;
        }
        h0 = dx * float(s0);
        h1 = dx * float(s1);
#endif
        s = uvec4(v[4].x, v[4].y, floatBitsToUint(h0), floatBitsToUint(h1));
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint tr = tid % 16u, tt = tid / 16u;
    const uint n0 = gl_WorkGroupID.x * BN, m0 = gl_WorkGroupID.y * BM;
    const uint steps = pc.k / (32u * I8_KC);
    float acc[I8_RT * I8_TT];
#ifdef GEMM_GEGLU
    float acc_up[I8_RT * I8_TT];
#endif
    [[unroll]] for (uint i = 0u; i < I8_RT * I8_TT; i++) {
        acc[i] = 0.0;
#ifdef GEMM_GEGLU
        acc_up[i] = 0.0;
#endif
    }
    uvec4 ra[RREC], rb[RREC], rs[RREC];
    [[unroll]] for (uint q = 0u; q < RREC; q++) {
        const uint r = tid + 256u * q;
        if (r < NREC) {
            load_record(r, 0u, n0, m0, ra[q], rb[q], rs[q]);
            recs[3u * r] = ra[q]; recs[3u * r + 1u] = rb[q]; recs[3u * r + 2u] = rs[q];
        }
    }
    barrier();
    for (uint st = 0u; st < steps; st++) {
        const uint cur = (st & 1u) * NREC * 3u, nxt = ((st + 1u) & 1u) * NREC * 3u;
        const bool more = st + 1u < steps;
        if (more) {
            [[unroll]] for (uint q = 0u; q < RREC; q++) {
                const uint r = tid + 256u * q;
                if (r < NREC) load_record(r, (st + 1u) * I8_KC, n0, m0, ra[q], rb[q], rs[q]);
            }
        }
        [[unroll]] for (uint kc = 0u; kc < I8_KC; kc++) {
            // this invocation's rows' records: int8 words and scales
            uvec4 wa[NW * I8_RT], wb[NW * I8_RT];
            vec4 ws[NW * I8_RT];
            [[unroll]] for (uint i = 0u; i < NW * I8_RT; i++) {
                const uint item = (i / I8_RT) * BN + tr + 16u * (i % I8_RT);
                const uint o = cur + 3u * (item * I8_KC + kc);
                wa[i] = recs[o]; wb[i] = recs[o + 1u]; ws[i] = uintBitsToFloat(recs[o + 2u]);
            }
            [[unroll]] for (uint j = 0u; j < I8_TT; j++) {
                const uint o = cur + 3u * ((NW * BN + tt + 16u * j) * I8_KC + kc);
                const uvec4 xa = recs[o], xb = recs[o + 1u];
                const vec4 xs = uintBitsToFloat(recs[o + 2u]);   // dx, dx sum, dx h0, dx h1
                [[unroll]] for (uint i = 0u; i < NW * I8_RT; i++) {
                    // `precise`: the bias must come off before any other arithmetic (a driver that
                    // reassociates f0 + f1 into (b0 + b1) - 2 bias loses the sum's last bits)
#if defined(WTYPE_Q2_K) || defined(WTYPE_Q3_K) || defined(WTYPE_Q6_K)
                    int s0 = BIAS_BITS, s1 = BIAS_BITS;   // two halves, two scales
                    [[unroll]] for (uint w = 0u; w < 4u; w++) {
                        s0 = sdot4x8(wa[i][w], xa[w], 0) + s0;
                        s1 = sdot4x8(wb[i][w], xb[w], 0) + s1;
                    }
                    precise const float f0 = intBitsToFloat(s0) - BIAS_F;
                    precise const float f1 = intBitsToFloat(s1) - BIAS_F;
#if defined(WTYPE_Q2_K)
                    const float v = xs.x * (ws[i].x * f0 + ws[i].y * f1) + ws[i].z * xs.z + ws[i].w * xs.w;
#else
                    const float v = xs.x * (ws[i].x * f0 + ws[i].y * f1);
#endif
#else
                    int s = BIAS_BITS;   // one scale for the chunk: one integer sum of 32 products
                    [[unroll]] for (uint w = 0u; w < 4u; w++) {
                        s = sdot4x8(wa[i][w], xa[w], 0) + s;
                        s = sdot4x8(wb[i][w], xb[w], 0) + s;
                    }
                    precise const float f = intBitsToFloat(s) - BIAS_F;
                    const float v = ws[i].x * (xs.x * f) + ws[i].z * xs.y;
#endif
#ifdef GEMM_GEGLU
                    if (i >= I8_RT) acc_up[(i - I8_RT) * I8_TT + j] += v; else
#endif
                    acc[i * I8_TT + j] += v;
                }
            }
        }
        if (more) {
            [[unroll]] for (uint q = 0u; q < RREC; q++) {
                const uint r = tid + 256u * q;
                if (r < NREC) {
                    recs[nxt + 3u * r] = ra[q]; recs[nxt + 3u * r + 1u] = rb[q]; recs[nxt + 3u * r + 2u] = rs[q];
                }
            }
        }
        barrier();
    }
    [[unroll]] for (uint j = 0u; j < I8_TT; j++) {
        const uint tok = m0 + tt + 16u * j;
        [[unroll]] for (uint i = 0u; i < I8_RT; i++) {
            const uint row = n0 + tr + 16u * i;
            if (tok < pc.m && row < pc.n) {
#ifdef GEMM_GEGLU
                y[tok * pc.y_stride + pc.y_off + row] = gelu_tanh(acc[i * I8_TT + j]) * acc_up[i * I8_TT + j];
#else
                y[tok * pc.y_stride + pc.y_off + row] = acc[i * I8_TT + j];
#endif
            }
        }
    }
}
