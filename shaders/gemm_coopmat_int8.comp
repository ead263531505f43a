#version 450
// Prefill GEMM on int8 matrix cores (VK_KHR_cooperative_matrix, sint8 x sint8 -> sint32): the
// contract of gemm.comp with x given as q8_1 blocks (include/q8_1_block.glsl; the caller
// quantizes it, as for gemm_int8.comp):
//   y[m, y_off + n] = sum_k x[m, k] * W[n, k]        (GEMM_GEGLU: gelu_tanh(x Wg^T) * (x Wu^T))
// W in its GGUF layout (-D WTYPE_*: the types whose 32-weight chunk has one scale and one min,
// unpacked by the int8 matvecs' decoder, include/matvec_cols_chunk.glsl).
//
// Why: int8 operands are half the staging bytes of f16 ones and an int8 matrix product does a
// K of 32 where f16 does 16, the weights stay integers (no conversion to f16), and the
// activations are the q8_1 blocks the int8 matvecs already use. Each 32-wide K step is one q8_1
// block of x and one chunk of each weight row, so it has its own scales: the step's integer
// product (16 x 16 per matrix: one 16 x 16 x 32 product, or two of K = 16) starts
// from the bits of 1.5 * 2^23 and is folded into f32 sums element by element:
//   sum += (float(acc) - 1.5 * 2^23) * dx[token] * d[row] + sx[token] * m[row]
// (dx, sx: the token block's scale and scaled sum; d, m: the row chunk's scale and min). Which
// row and column each accumulator element of this invocation holds is implementation-defined:
// the kernel asks the hardware at start — a 16 x 16 matrix of r * 16 + c loaded as an
// accumulator says it — so no vendor's layout is assumed. Sums leave the kernel straight from
// registers, bounds-checked per element.
//
// Tile: a CM8_GM (tokens) x CM8_GN (rows) grid of subgroups, each owning CM8_TM x CM8_TN 16 x 16
// fragments: BM = 16 GM TM tokens x BN = 16 GN TN rows per workgroup. Two shared buffers filled
// through registers, as gemm_coopmat.comp's "_p" tiles: the next step's records (a row's
// unpacked chunk: 8 words of int8, a token's block: 8 words) are loaded into registers before
// the current step's products and stored after them, one barrier per step. Rows / tokens past
// the edge read the last one (no branch) and are never stored. CM8_PF2: two register sets, each
// step's loads issued two steps ahead.
// On the H100 these tiles ran prefill products at 0.66-0.81x the f16 ones (docs/PERFORMANCE.md),
// so ops_gemm offers them only on request (PHOENIX_VULKAN_CM8=1).
// CM8_KC 32-wide chunks per step (one barrier each step). Compiled for 32-lane subgroups (CM8_L = 8
// accumulator elements per invocation) and 16 x 16 x 32 products (CM8_K; 16: two per chunk), the
// shapes of NVIDIA GPUs — compile-time, so the element loops unroll into registers; ops_gemm refuses
// other devices. Spec constant: WG = GM GN x 32.
// Bindings: 0 xq (q8_1 words), 1 y, 2 W (GEGLU: 2 W_gate, 3 W_up).
// Push: m, n, k, x_stride (q8_1 blocks from one token to the next), y_stride, y_off.
// Dispatch: (ceil(n / BN), ceil(m / BM), 1).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#include "include/common.glsl"
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (SPV_KHR_integer_dot_product), emitted directly: the chunk decoder's includes use it
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int fmt);
#define INT_DOT 1

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
#ifndef CM8_L
#define CM8_L 8
#endif
#ifndef CM8_K
#define CM8_K 32
#endif
#ifndef CM8_KC
#define CM8_KC 1
#endif
#define L CM8_L               // accumulator elements per invocation (16 x 16 over the subgroup)
#define K8 CM8_K
#define KH (32u / K8)         // products per 32-wide chunk

#ifndef CM8_GM
#define CM8_GM 2
#endif
#ifndef CM8_GN
#define CM8_GN 2
#endif
#ifndef CM8_TM
#define CM8_TM 2
#endif
#ifndef CM8_TN
#define CM8_TN 4
#endif
#define NSG (CM8_GM * CM8_GN)
#define BM (CM8_GM * CM8_TM * 16u)
#define BN (CM8_GN * CM8_TN * 16u)
#ifdef GEMM_GEGLU
#define NW 2u
#else
#define NW 1u
#endif
#define QP 12u                          // shared words per record: 8 of int8 + 4 of padding (48 bytes)
#define NITEM (NW * BN + BM)            // rows and tokens of a step
#define NREC (NITEM * CM8_KC)           // records per step: chunk kc of item i is record i KC + kc
#define RR ((NREC + NSG * 32u - 1u) / (NSG * 32u))   // per invocation at the nominal grid
#define BIAS_BITS 0x4B400000
#define BIAS_F 12582912.0

PUSH_CONSTANTS

layout(binding = 0) readonly buffer X { uint xq[]; };   // (the decoder's dot functions name it)
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

shared uint qs[2u * NREC * QP];        // [buffer][record]: weight rows (gate, then up), then tokens
shared vec2 sc[2u * NREC];             // [buffer][record]: (d, m) of a row chunk, (dx, sx) of a block
shared int lay[256];                   // r * 16 + c: the accumulator layout probe

#define ACC8 coopmat<int, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

// Record r of the step starting at chunk c0, loaded (and, for a weight row, unpacked) into registers.
void load_record(uint r, uint c0, uint n0, uint m0, out uvec4 a, out uvec4 b, out vec2 s) {
    const uint c = c0 + r % CM8_KC;
    r /= CM8_KC;
    if (r < NW * BN) {
        const uint row = min(n0 + r % BN, pc.n - 1u);
        CHUNK u;
#ifdef GEMM_GEGLU
        if (r >= BN) unpack_chunk_w1(row, c, pc.k, u); else
#endif
        unpack_chunk_w0(row, c, pc.k, u);
        a = uvec4(u.q[0], u.q[1], u.q[2], u.q[3]);
        b = uvec4(u.q[4], u.q[5], u.q[6], u.q[7]);
        s = vec2(u.d0, u.m0);
    } else {
        const uint tok = min(m0 + r - NW * BN, pc.m - 1u);
        const uint w = (tok * pc.x_stride + c) * 10u;   // words; blocks are 8-byte aligned
        uvec2 v[5];
        [[unroll]] for (uint i = 0u; i < 5u; i++) v[i] = xq2[(w >> 1) + i];
        a = uvec4(v[0], v[1]);
        b = uvec4(v[2], v[3]);
        s = uintBitsToFloat(v[4]);
    }
}

void store_record(uint buf, uint r, uvec4 a, uvec4 b, vec2 s) {
    const uint o = (buf * NREC + r) * QP;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        qs[o + i] = a[i];
        qs[o + 4u + i] = b[i];
    }
    sc[buf * NREC + r] = s;
}

// per invocation, at global scope so that the step functions below share them without copies
uint erow[L], ecol[L];                 // which (token, row) of a 16 x 16 fragment each element is
float acc[CM8_TM * CM8_TN * L];
#ifdef GEMM_GEGLU
float acc_up[CM8_TM * CM8_TN * L];
#endif
#ifdef CM8_PF2
#define NSET 2u                        // register sets: loads issued two steps ahead
#else
#define NSET 1u
#endif
uvec4 ra[NSET][RR], rb[NSET][RR];
vec2 rs[NSET][RR];

void fetch(uint set, uint st, uint n0, uint m0) {
    const uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint q = 0u; q < RR; q++) {
        const uint r = tid + WG * q;
        if (r < NREC) load_record(r, st * CM8_KC, n0, m0, ra[set][q], rb[set][q], rs[set][q]);
    }
}

void put(uint set, uint buf) {
    const uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint q = 0u; q < RR; q++) {
        const uint r = tid + WG * q;
        if (r < NREC) store_record(buf, r, ra[set][q], rb[set][q], rs[set][q]);
    }
}

// the products of the step in shared buffer `cur`, folded into acc / acc_up
void multiply(uint cur, uint tb, uint cb) {
    [[unroll]] for (uint kc = 0u; kc < CM8_KC; kc++) {
        // this subgroup's tokens: their int8 fragments and, per element, dx and sx
        const uint xr = cur * NREC + (NW * BN + tb) * CM8_KC + kc;
        coopmat<int8_t, gl_ScopeSubgroup, 16, K8, gl_MatrixUseA> a[CM8_TM * KH];
        float dx[CM8_TM * L], sx[CM8_TM * L];
        [[unroll]] for (uint i = 0u; i < CM8_TM; i++) {
            [[unroll]] for (uint h = 0u; h < KH; h++)
                coopMatLoad(a[i * KH + h], qs, (xr + 16u * CM8_KC * i) * QP + h * (K8 / 4u), QP * CM8_KC,
                            gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint e = 0u; e < L; e++) {
                const vec2 s = sc[xr + CM8_KC * (16u * i + erow[e])];
                dx[i * L + e] = s.x;
                sx[i * L + e] = s.y;
            }
        }
        // every product of the chunk first, then the folds: the scale arithmetic waits on none
        // of the matrix products one at a time
        ACC8 p[NW * CM8_TN * CM8_TM];
        [[unroll]] for (uint g = 0u; g < NW; g++) {
            [[unroll]] for (uint j = 0u; j < CM8_TN; j++) {
                const uint wr = cur * NREC + (g * BN + cb + 16u * j) * CM8_KC + kc;
                coopmat<int8_t, gl_ScopeSubgroup, K8, 16, gl_MatrixUseB> b[KH];
                [[unroll]] for (uint h = 0u; h < KH; h++)
                    coopMatLoad(b[h], qs, wr * QP + h * (K8 / 4u), QP * CM8_KC, gl_CooperativeMatrixLayoutColumnMajor);
                [[unroll]] for (uint i = 0u; i < CM8_TM; i++) {
                    const uint pi = (g * CM8_TN + j) * CM8_TM + i;
                    p[pi] = ACC8(BIAS_BITS);
                    [[unroll]] for (uint h = 0u; h < KH; h++) p[pi] = coopMatMulAdd(a[i * KH + h], b[h], p[pi]);
                }
            }
        }
        [[unroll]] for (uint g = 0u; g < NW; g++) {
            [[unroll]] for (uint j = 0u; j < CM8_TN; j++) {
                const uint wr = cur * NREC + (g * BN + cb + 16u * j) * CM8_KC + kc;
                float dw[L], mw[L];
                [[unroll]] for (uint e = 0u; e < L; e++) {
                    const vec2 s = sc[wr + CM8_KC * ecol[e]];
                    dw[e] = s.x;
                    mw[e] = s.y;
                }
                [[unroll]] for (uint i = 0u; i < CM8_TM; i++) {
                    const uint pi = (g * CM8_TN + j) * CM8_TM + i;
                    [[unroll]] for (uint e = 0u; e < L; e++) {
                        // `precise`: the bias must come off before any other arithmetic
                        precise const float f = intBitsToFloat(p[pi][e]) - BIAS_F;
                        const uint o = (i * CM8_TN + j) * L + e;
#ifdef GEMM_GEGLU
                        if (g == 1u) acc_up[o] = fma(sx[i * L + e], mw[e], fma(f, dx[i * L + e] * dw[e], acc_up[o])); else
#endif
                        acc[o] = fma(sx[i * L + e], mw[e], fma(f, dx[i * L + e] * dw[e], acc[o]));
                    }
                }
            }
        }
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID;
    const uint sg_m = sg / CM8_GN, sg_n = sg % CM8_GN;
    const uint n0 = gl_WorkGroupID.x * BN, m0 = gl_WorkGroupID.y * BM;
    const uint tb = sg_m * CM8_TM * 16u, cb = sg_n * CM8_TN * 16u;   // this subgroup's tokens / rows
    const uint steps = pc.k / (32u * CM8_KC);

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
    [[unroll]] for (uint i = 0u; i < CM8_TM * CM8_TN * L; i++) {
        acc[i] = 0.0;
#ifdef GEMM_GEGLU
        acc_up[i] = 0.0;
#endif
    }

    fetch(0u, 0u, n0, m0);
    put(0u, 0u);
#ifdef CM8_PF2
    // step s + 1 is in registers (set s & 1) while step s multiplies; step s + 2 is loaded then
    // into the other set, so each load has two steps' products to arrive
    if (steps > 1u) fetch(0u, 1u, n0, m0);
    barrier();
    for (uint st = 0u; st < steps; st += 2u) {
        if (st + 2u < steps) fetch(1u, st + 2u, n0, m0);
        if (sg < NSG) multiply(0u, tb, cb);
        if (st + 1u < steps) put(0u, 1u);
        barrier();
        if (st + 1u >= steps) break;
        if (st + 3u < steps) fetch(0u, st + 3u, n0, m0);
        if (sg < NSG) multiply(1u, tb, cb);
        if (st + 2u < steps) put(1u, 0u);
        barrier();
    }
#else
    barrier();
    for (uint st = 0u; st < steps; st++) {
        const uint cur = st & 1u;
        if (st + 1u < steps) fetch(0u, st + 1u, n0, m0);
        if (sg < NSG) multiply(cur, tb, cb);
        if (st + 1u < steps) put(0u, cur ^ 1u);
        barrier();
    }
#endif
    if (sg >= NSG) return;
    [[unroll]] for (uint i = 0u; i < CM8_TM; i++) {
        [[unroll]] for (uint j = 0u; j < CM8_TN; j++) {
            [[unroll]] for (uint e = 0u; e < L; e++) {
                const uint tok = m0 + tb + 16u * i + erow[e], row = n0 + cb + 16u * j + ecol[e];
                const uint o = (i * CM8_TN + j) * L + e;
                if (tok < pc.m && row < pc.n) {
#ifdef GEMM_GEGLU
                    y[tok * pc.y_stride + pc.y_off + row] = gelu_tanh(acc[o]) * acc_up[o];
#else
                    y[tok * pc.y_stride + pc.y_off + row] = acc[o];
#endif
                }
            }
        }
    }
}
