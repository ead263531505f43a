#version 450
// A GEMM of a few tokens (a batched decode step's 8-32 rows, a short forward) on f16 matrix
// cores: the contract of gemm_coopmat.comp (x f32 rows, W in its GGUF layout, -D WTYPE_* of
// the block types, GEMM_GEGLU), shaped so that the weights stream instead of waiting.
//
// Why: with a few tokens a GEMM is one pass over the weights. The prefill tiles stage a 32-wide
// K step of x and W through shared memory behind two workgroup barriers, so each step waits a
// whole global-load latency for ~18 bytes a row (a 27B gate/up product of 32 tokens ran at a
// fifth of the memory bandwidth); the int8 few-token tiles fold every 32-wide chunk's products
// into f32 with gathered scales, which made them shared-memory bound.
// Here a workgroup owns 16 CF_NSG weight rows (each subgroup its own 16, and the up rows beside
// them for GEGLU) and 16 CF_FT tokens, and walks K in slabs of 64 CF_KC:
//   - each lane holds the next two slabs' records of its subgroup's weights in registers (row
//     lane % 16, chunk lane / 16, unpacked to int8 with its scale and min by the int8 matvecs'
//     decoder), loaded while the current slab multiplies: two slabs of loads in flight. The loop
//     runs two slabs per iteration so that each register set is refilled in place — rotating
//     them (next = after-next) made every slab wait for the loads it had just issued, and the
//     kernel ran at one load latency per slab;
//   - the subgroup writes its records to its own shared region as f16 (d q + m) and reads them
//     back as 16 x 16 fragments: only subgroup barriers, the scales applied once per weight, and
//     the accumulators sum over all of K in f32 (no per-chunk fold);
//   - x (f32, clamped to the f16 range as in gemm_coopmat.comp) is staged once per slab for the
//     whole workgroup, double-buffered through registers: one workgroup barrier per slab.
// Compiled for 32-lane subgroups (ops_gemm.CF_SUBGROUP): a subgroup's 16 rows x 2 chunks are its
// 32 lanes' records.
// Bindings: 0 x, 1 y, 2 W (GEGLU: 2 W_gate, 3 W_up).
// Push: m, n, k, x_stride, y_stride, y_off.   Dispatch: (ceil(n / (16 CF_NSG)), ceil(m / (16 CF_FT)), S);
// WG = CF_NSG x 32. K must be a multiple of the slab, 64 CF_KC (ops_gemm checks).
// Prefill chunks take some CF_DIRECT tiles too (Q4_0, Q4_K; ops_table.CF_PREFILL_TILES: 32-64 tokens x 128-256
// rows, ~90-140 registers a lane, or two matrices' fragments for GEGLU): on the H100 they ran a 27B
// layer's 512-token products 1.5x faster than gemm_coopmat.comp's 128 x 128 tiles, whose few
// workgroups (a 5,376-row product is 168 of them) and shared copy of the weights held them back.
// CF_SPLITK: the S workgroups along z split K between them (a 5,376-row matrix is only 168
// workgroups of 32 rows — 2.5 subgroups per H100 SM, too few loads in flight) and write their
// partial sums to binding 1 as [split][matrix][token][row]; gemm_splitk_reduce.comp adds them
// in a fixed order (the same result every run) and applies the GEGLU.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#include "include/common.glsl"
#extension GL_EXT_spirv_intrinsics : require
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int fmt);
#define INT_DOT 1   // the decoder's include also defines the int8 dot, which is never called here

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;

#ifndef CF_FT
#define CF_FT 2
#endif
#ifndef CF_NSG
#define CF_NSG 4
#endif
#define BM (16u * CF_FT)      // tokens per workgroup
#ifndef CF_KC
#define CF_KC 1
#endif
#define KS (64u * CF_KC)      // K per slab: 2 CF_KC chunks of 32 (each lane holds CF_KC of them)
#define SX4 ((KS + 8u) / 4u)  // shared row stride in f16vec4s (144 bytes, a multiple of 16)
#ifdef GEMM_GEGLU
#define NW 2u
#else
#define NW 1u
#endif
#define XR ((BM * KS / 4u + CF_NSG * 32u - 1u) / (CF_NSG * 32u))   // x vec4s per invocation per slab

PUSH_CONSTANTS

layout(binding = 0) readonly buffer X { uint xq[]; };     // (the decoder include's name; unused)
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
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

#if defined(CF_RAW) && !defined(WTYPE_Q4_0) && !defined(WTYPE_Q8_0)
#undef CF_RAW
#endif
#ifdef CF_RAW
// CF_RAW (Q4_0 / Q8_0): a slab's weights arrive as whole words, consecutive lanes reading consecutive words
// of a row (its 2 blocks are 36 / 68 bytes, word-aligned since K % 64 == 0), go through a shared
// copy of the raw blocks, and are unpacked from there. Why: one lane per (row, chunk) makes every
// 16-bit load touch 16 rows' cache lines. On the H100 this made the o and q+k+v products 20-25 %
// faster but not gate/up, so the tiles with and without it are timed at load.
#if defined(WTYPE_Q4_0)
#define BLK16 9u      // 16-bit words per block
#else
#define BLK16 17u
#endif
#define RW (CF_KC * BLK16)                // 32-bit words per row and slab (2 CF_KC blocks)
#define RPL ((16u * RW + 31u) / 32u)      // words per lane per slab and matrix
shared uint wraw[CF_NSG * NW * 16u * RW];
#endif

#if defined(CF_DIRECT) && !defined(WTYPE_Q4_0) && !(defined(WTYPE_Q4_K) && !defined(CF_WIDE)) && !(defined(WTYPE_Q8_0) && defined(CF_WIDE))
#error CF_DIRECT is built for Q4_0, without CF_WIDE for Q4_K, with it for Q8_0
#endif
#ifdef CF_DIRECT
// CF_DIRECT (Q4_0; Q4_K below): no shared copy of the weights at all. Each lane loads the 16-bit words its own
// elements of the 16 x 16 weight fragment need and builds the fragment in registers: in a 16-row,
// 32-wide Q4_0 block, lane (g = lane / 4, t = lane % 4) holds rows g and g + 8, its words t and
// t + 4 of each row's quants (bytes 2t, 2t+1, 2t+8, 2t+9) and the two scales — 3 loads a row and
// block, ~20 ALU operations for its 16 weights. The low nibbles are the block's K 0..15, the high
// ones 16..31; the four weights of a byte pair land in the fragment's K slots with bits 0 and 3 of
// the slot swapped, and put_x stages x in that same order, so the products are unchanged.
// Which (row, K slot) each fragment element is belongs to the driver: the kernel assumes a lane's
// elements are 4 pairs of consecutive K slots, pair q at row g + 8 PR_q and slots 2t + 8 PK_q,
// with (PR, PK) the bit masks below, and ops_gemm.cf_direct_layout checks exactly that on the
// device (coopmat_fragment_layout.comp) and passes them, or refuses these tiles.
// Why: the record tiles' shared round trip (unpack to int8, f16 stores, fragment loads) is most of
// their code (~116 KB of binary for two unrolled slabs, 182 registers a lane for the GEGLU tile:
// bench.pipeline_stats), and on the H100 they ran at a fifth of the memory bandwidth or less;
// these tiles take a 27B gate/up of 32 tokens from 305 to 140 µs (docs/PERFORMANCE.md).
layout(constant_id = 1) const uint CF_PR = 12u;
layout(constant_id = 2) const uint CF_PK = 10u;
#ifdef CF_WIDE
// CF_WIDE (with CF_DIRECT, a 256-wide slab: CF_KC 4): lane t takes the whole of block pair t of the
// slab (two Q4_0 blocks, 36 bytes, word-aligned as K % 64 == 0) for rows g and g + 8 as nine
// 32-bit loads a row, where CF_DIRECT's 16-bit loads fetch 8 bytes a row and block: each load
// instruction of a subgroup touches 8 rows' cache lines either way, so wider loads are fewer of
// them. The 16 fragments of the slab take their lane-t K slots from pair t: step j from block
// j / 8, quant word (j % 8) / 2, low (even j) or high nibbles, and put_x stages x to match.
// Q8_0 (CF_WIDE only): a pair is 68 bytes (17 words); step j takes quant word j % 8 of block j / 8,
// its even bytes into K slots 2t, 2t + 1 and its odd ones into 2t + 8, 2t + 9, and put_x stages x
// to match (fetch_x's `base`). Why: the LM head (Q8_0 in Gemma 3's Q4_0 files) of a 32-row batched
// step took the record tiles, ~0.8 TB/s on the H100 — 2 ms of a 27B step.
#if defined(WTYPE_Q8_0)
#define PW 17u                  // 32-bit words of a block pair
#else
#define PW 9u
#endif
#define DW (2u * PW)            // words per lane, matrix and slab: row g's pair, then row g + 8's
#define XU ((BM * 16u + CF_NSG * 32u - 1u) / (CF_NSG * 32u))   // x units (4 vec4s) per invocation per slab
#elif defined(WTYPE_Q4_K)
// CF_DIRECT for Q4_K: a 64-weight group of a 256-weight super-block is 32 quant bytes, the low
// nibbles its first 32 weights (sub-block 2j), the high ones the next 32 (2j + 1), byte b holding
// weight b of each: each 16-wide K step is laid out as a Q4_0 block's, so the lanes load the same
// byte pairs and x is staged in the same slot order. Scales and mins are 6-bit (12 bytes a
// super-block, with d and dmin), decoded where the fragments are built.
#define NG (KS / 64u)           // 64-weight groups per row and slab
#define DW (12u * NG)           // per group: rows g's and g + 8's two quant words, then each row's d/dmin and 3 scale words
#define XU ((BM * KS / 8u + CF_NSG * 32u - 1u) / (CF_NSG * 32u))
#else
#define NBK (KS / 32u)          // Q4_0 blocks per row and slab
#define DW (3u * NBK)           // words per lane, matrix and slab: per block row g's quants, row g+8's, both scales
#define XU ((BM * KS / 8u + CF_NSG * 32u - 1u) / (CF_NSG * 32u))   // x units (2 vec4s) per invocation per slab
#endif
#ifdef CF_WIDE
#define XV 4u                   // vec4s per x unit
#else
#define XV 2u
#endif
#endif

shared f16vec4 xs[2u * BM * SX4];               // x, two slabs
#ifndef CF_DIRECT
shared f16vec4 ws[CF_NSG * NW * 16u * SX4];     // each subgroup's weight rows of the slab
#endif
shared float cs[CF_NSG * 256u];                 // one 16 x 16 output tile per subgroup

#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

#if defined(CF_WIDE)
// this lane's words of slab `slab` (see CF_WIDE): block pair t of rows g and g + 8
void fetch_w(uint slab, uint row0, out uint r[NW][DW]) {
    const uint lane = gl_SubgroupInvocationID, wpr = (pc.k / 64u) * PW;   // 32-bit words a row
    const uint o = slab * 4u * PW + (lane % 4u) * PW;
    const uint ra = min(row0 + lane / 4u, pc.n - 1u) * wpr + o, rb = min(row0 + lane / 4u + 8u, pc.n - 1u) * wpr + o;
    [[unroll]] for (uint i = 0u; i < PW; i++) {
        r[0][i] = w0_32[ra + i];
        r[0][PW + i] = w0_32[rb + i];
#ifdef GEMM_GEGLU
        r[1][i] = w1_32[ra + i];
        r[1][PW + i] = w1_32[rb + i];
#endif
    }
}
#elif defined(CF_DIRECT) && defined(WTYPE_Q4_K)
// this lane's words of slab `slab` (Q4_K): per group, rows g's and g + 8's quant bytes (2t, 2t + 1,
// 2t + 8, 2t + 9) of the group's first 16 bytes and of its last 16, then each row's d/dmin word and
// the 3 words of its super-block's scales
void fetch_w(uint slab, uint row0, out uint r[NW][DW]) {
    const uint lane = gl_SubgroupInvocationID, t = lane % 4u;
    const uint wpr = (pc.k / 256u) * 72u;   // 16-bit words a row
    const uint ra = min(row0 + lane / 4u, pc.n - 1u) * wpr, rb = min(row0 + lane / 4u + 8u, pc.n - 1u) * wpr;
    [[unroll]] for (uint j = 0u; j < NG; j++) {
        const uint grp = slab * NG + j, sb = (grp / 4u) * 72u, q = sb + 8u + (grp % 4u) * 16u + t;
        [[unroll]] for (uint r2 = 0u; r2 < 2u; r2++) {
            const uint a = r2 == 0u ? ra : rb;
            r[0][12u * j + 2u * r2] = uint(w0_16[a + q]) | (uint(w0_16[a + q + 4u]) << 16);
            r[0][12u * j + 2u * r2 + 1u] = uint(w0_16[a + q + 8u]) | (uint(w0_16[a + q + 12u]) << 16);
            [[unroll]] for (uint i = 0u; i < 4u; i++) r[0][12u * j + 4u + 4u * r2 + i] = w0_32[(a + sb) / 2u + i];
#ifdef GEMM_GEGLU
            r[1][12u * j + 2u * r2] = uint(w1_16[a + q]) | (uint(w1_16[a + q + 4u]) << 16);
            r[1][12u * j + 2u * r2 + 1u] = uint(w1_16[a + q + 8u]) | (uint(w1_16[a + q + 12u]) << 16);
            [[unroll]] for (uint i = 0u; i < 4u; i++) r[1][12u * j + 4u + 4u * r2 + i] = w1_32[(a + sb) / 2u + i];
#endif
        }
    }
}
#elif defined(CF_DIRECT)
// this lane's words of slab `slab` (see CF_DIRECT): per block, rows g's and g + 8's quant words t
// and t + 4 as one 32-bit value each, then both rows' scales
void fetch_w(uint slab, uint row0, out uint r[NW][DW]) {
    const uint lane = gl_SubgroupInvocationID, t = lane % 4u;
    const uint wpr = (pc.k / 32u) * 9u;   // 16-bit words a row
    const uint ra = min(row0 + lane / 4u, pc.n - 1u) * wpr, rb = min(row0 + lane / 4u + 8u, pc.n - 1u) * wpr;
    [[unroll]] for (uint j = 0u; j < NBK; j++) {
        const uint a = ra + (slab * NBK + j) * 9u, b = rb + (slab * NBK + j) * 9u;
        r[0][3u * j] = uint(w0_16[a + 1u + t]) | (uint(w0_16[a + 5u + t]) << 16);
        r[0][3u * j + 1u] = uint(w0_16[b + 1u + t]) | (uint(w0_16[b + 5u + t]) << 16);
        r[0][3u * j + 2u] = uint(w0_16[a]) | (uint(w0_16[b]) << 16);
#ifdef GEMM_GEGLU
        r[1][3u * j] = uint(w1_16[a + 1u + t]) | (uint(w1_16[a + 5u + t]) << 16);
        r[1][3u * j + 1u] = uint(w1_16[b + 1u + t]) | (uint(w1_16[b + 5u + t]) << 16);
        r[1][3u * j + 2u] = uint(w1_16[a]) | (uint(w1_16[b]) << 16);
#endif
    }
}
#elif defined(CF_RAW)
// this lane's raw words of its subgroup's rows: word i = lane + 32 j is row i / RW, word i % RW
void fetch_w(uint slab, uint row0, out uint r[NW][RPL]) {
    const uint lane = gl_SubgroupInvocationID;
    [[unroll]] for (uint j = 0u; j < RPL; j++) {
        const uint i = min(lane + 32u * j, 16u * RW - 1u);
        const uint row = min(row0 + i / RW, pc.n - 1u);
        const uint w = row * (pc.k / 64u) * BLK16 + slab * RW + i % RW;
        r[0][j] = w0_32[w];
#ifdef GEMM_GEGLU
        r[1][j] = w1_32[w];
#endif
    }
}

// the 16-bit word j of the shared raw blocks, and the 32 bits from there
uint raw16(uint j) { return (wraw[j >> 1] >> ((j & 1u) << 4)) & 0xFFFFu; }
uint raw32(uint j) { return (j & 1u) == 0u ? wraw[j >> 1] : (wraw[j >> 1] >> 16) | (wraw[(j >> 1) + 1u] << 16); }

// matrix g's raw words to the subgroup's shared copy
void store_raw(uint r[NW][RPL], uint g) {
    const uint lane = gl_SubgroupInvocationID, base = (gl_SubgroupID * NW + g) * 16u * RW;
    [[unroll]] for (uint j = 0u; j < RPL; j++) {
        const uint i = lane + 32u * j;
        if (i < 16u * RW) wraw[base + i] = r[g][j];
    }
}

// record j of this lane (row lane % 16, chunk lane / 16 + 2 j of the slab) from the shared copy,
// unpacked as the int8 matvecs' decoder does
void unpack_raw(uint g, uint j, out CHUNK u) {
    const uint lane = gl_SubgroupInvocationID, base = (gl_SubgroupID * NW + g) * 16u * RW;
    const uint b = base * 2u + ((lane % 16u) * 2u * CF_KC + lane / 16u + 2u * j) * BLK16;   // in 16-bit words
    u.d0 = unpackHalf2x16(raw16(b)).x;
    u.d1 = u.d0;
    u.m1 = 0.0;
#if defined(WTYPE_Q4_0)
    u.m0 = -8.0 * u.d0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        const uint w = raw32(b + 1u + 2u * i);
        u.q[i] = w & 0x0F0F0F0Fu;
        u.q[4u + i] = (w >> 4) & 0x0F0F0F0Fu;
    }
#else
    u.m0 = 0.0;
    [[unroll]] for (uint i = 0u; i < 8u; i++) u.q[i] = raw32(b + 1u + 2u * i);
#endif
}
#else
// records [g CF_KC + j]: matrix g, chunk lane / 16 + 2 j of the slab
void fetch_w(uint slab, uint row, out CHUNK r[NW * CF_KC]) {
    [[unroll]] for (uint j = 0u; j < CF_KC; j++) {
        const uint c = (KS / 32u) * slab + gl_SubgroupInvocationID / 16u + 2u * j;
        unpack_chunk_w0(row, c, pc.k, r[j]);
#ifdef GEMM_GEGLU
        unpack_chunk_w1(row, c, pc.k, r[CF_KC + j]);
#endif
    }
}
#endif

#ifdef CF_WIDE
// x in the weights' slot order (CF_WIDE): a unit is step j of a token, whose 16 slots take x at
// base + {0, 2, 64, 66, 128, 130, 192, 194, 1, 3, 65, ...}: the vec4s at base + 64 t', t' = 0..3
void fetch_x(uint slab, uint m0, out vec4 xr[XV * XU]) {
    [[unroll]] for (uint i = 0u; i < XU; i++) {
        const uint unit = gl_LocalInvocationID.x + i * WG, j = unit % 16u;
        const uint t = min(m0 + min(unit / 16u, BM - 1u), pc.m - 1u);
#if defined(WTYPE_Q8_0)
        const uint base = 32u * (j / 8u) + 4u * (j % 8u);   // quant word j % 8 of block j / 8
#else
        const uint base = 32u * (j / 8u) + 4u * ((j % 8u) / 2u) + 16u * (j % 2u);
#endif
        const uint v = (t * pc.x_stride + slab * KS + base) / 4u;
        [[unroll]] for (uint q = 0u; q < 4u; q++) xr[4u * i + q] = x4[v + 16u * q];
    }
}

void put_x(vec4 xr[XV * XU], uint buf) {
    const vec4 big = vec4(65504.0);
    [[unroll]] for (uint i = 0u; i < XU; i++) {
        const uint unit = gl_LocalInvocationID.x + i * WG;
        if (unit < BM * 16u) {
            const uint o = (buf * BM + unit / 16u) * SX4 + (unit % 16u) * 4u;
            const vec4 a = clamp(xr[4u * i], -big, big), b = clamp(xr[4u * i + 1u], -big, big);
            const vec4 c = clamp(xr[4u * i + 2u], -big, big), d = clamp(xr[4u * i + 3u], -big, big);
            xs[o] = f16vec4(a.x, a.z, b.x, b.z);
            xs[o + 1u] = f16vec4(c.x, c.z, d.x, d.z);
            xs[o + 2u] = f16vec4(a.y, a.w, b.y, b.w);
            xs[o + 3u] = f16vec4(c.y, c.w, d.y, d.w);
        }
    }
}
#elif defined(CF_DIRECT)
// x in the weights' slot order (CF_DIRECT): a unit is vec4s u and u + 2 of a 16-wide group of a
// token's slab (K 4u..4u+3 and 8+4u..), which fill the group's slot vec4s u and u + 2
void fetch_x(uint slab, uint m0, out vec4 xr[XV * XU]) {
    [[unroll]] for (uint i = 0u; i < XU; i++) {
        const uint unit = gl_LocalInvocationID.x + i * WG, within = unit % (KS / 8u);
        const uint t = min(m0 + min(unit / (KS / 8u), BM - 1u), pc.m - 1u);
        const uint v = (t * pc.x_stride + slab * KS) / 4u + (within / 2u) * 4u + within % 2u;
        xr[2u * i] = x4[v];
        xr[2u * i + 1u] = x4[v + 2u];
    }
}

void put_x(vec4 xr[XV * XU], uint buf) {
    const vec4 big = vec4(65504.0);
    [[unroll]] for (uint i = 0u; i < XU; i++) {
        const uint unit = gl_LocalInvocationID.x + i * WG, within = unit % (KS / 8u);
        if (unit < BM * KS / 8u) {
            const uint o = (buf * BM + unit / (KS / 8u)) * SX4 + (within / 2u) * 4u + within % 2u;
            const vec4 a = clamp(xr[2u * i], -big, big), b = clamp(xr[2u * i + 1u], -big, big);
            xs[o] = f16vec4(a.x, b.x, a.z, b.z);
            xs[o + 2u] = f16vec4(a.y, b.y, a.w, b.w);
        }
    }
}
#else
void fetch_x(uint slab, uint m0, out vec4 xr[XR]) {
    [[unroll]] for (uint i = 0u; i < XR; i++) {
        const uint run = gl_LocalInvocationID.x + i * WG;   // token run / (KS / 4), vec4 run % (KS / 4)
        const uint t = min(m0 + min(run / (KS / 4u), BM - 1u), pc.m - 1u);
        xr[i] = x4[(t * pc.x_stride + slab * KS) / 4u + run % (KS / 4u)];
    }
}

void put_x(vec4 xr[XR], uint buf) {
    [[unroll]] for (uint i = 0u; i < XR; i++) {
        const uint run = gl_LocalInvocationID.x + i * WG;
        if (run < BM * KS / 4u)
            xs[(buf * BM + run / (KS / 4u)) * SX4 + run % (KS / 4u)] =
                f16vec4(clamp(xr[i].xzyw, vec4(-65504.0), vec4(65504.0)));   // put_w's order
    }
}
#endif

#ifndef CF_DIRECT
// one weight record as f16 into the subgroup's region: w = d q + m per value (Q2_K: each half's
// own min; the other types' m1 is 0 and m0 applies to all 32 values). The int8 values become f16
// without a conversion instruction (those run at a quarter of the ALU rate on NVIDIA):
// 0x6400 | b is the half 1024 + b for a byte b, so (q ^ 0x80) | 0x6400 - 1152 is q exactly, two
// values per 32-bit operation. The even bytes of a word land in slots 0 and 1 of its f16vec4, the
// odd ones in 2 and 3 — put_x stores x's values in the same order, so the products are unchanged.
void put_w(CHUNK u, uint region, uint j) {
    const uint lane = gl_SubgroupInvocationID;
    const uint o = (region + lane % 16u) * SX4 + (lane / 16u + 2u * j) * 8u;
    const f16vec2 bias = f16vec2(1152.0);
    [[unroll]] for (uint i = 0u; i < 8u; i++) {
        const float16_t d = float16_t(i < 4u ? u.d0 : u.d1);
#if defined(WTYPE_Q2_K)
        const float16_t m = float16_t(i < 4u ? u.m0 : u.m1);
#else
        const float16_t m = float16_t(u.m0);
#endif
        const uint t = u.q[i] ^ 0x80808080u;
        const f16vec2 ev = unpackFloat2x16((t & 0x00FF00FFu) | 0x64006400u) - bias;
        const f16vec2 od = unpackFloat2x16(((t >> 8) & 0x00FF00FFu) | 0x64006400u) - bias;
        const f16vec2 e = fma(ev, f16vec2(d), f16vec2(m)), f = fma(od, f16vec2(d), f16vec2(m));
        ws[o + i] = f16vec4(e.x, e.y, f.x, f.y);
    }
}

#endif

#ifdef CF_DIRECT
// weights of nibble pair `v` (4 bits at bit 0 and bit 16) times d: 0x6400 | q is the half 1024 + q
f16vec2 nib(uint v, f16vec2 d) { return (unpackFloat2x16((v & 0x000F000Fu) | 0x64006400u) - f16vec2(1032.0)) * d; }
// weights of int8 pair `v` (bytes 0 and 2) times d: (q ^ 0x80) | 0x6400 is the half 1152 + q
f16vec2 byte_pair(uint v, f16vec2 d) {
    return (unpackFloat2x16(((v ^ 0x00800080u) & 0x00FF00FFu) | 0x64006400u) - f16vec2(1152.0)) * d;
}

#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
// the B fragment of a lane's four weight pairs p[row g / g + 8][K slots 2t.. / 2t + 8..], placed
// where the driver's layout puts them (CF_PR, CF_PK: ops_gemm.cf_direct_layout)
void fragment(f16vec2 p[2][2], out FRAG_B b) {
    [[unroll]] for (uint e = 0u; e < 8u; e++) {
        const uint q = e / 2u;
        const f16vec2 r0 = ((CF_PK >> q) & 1u) != 0u ? p[0][1] : p[0][0];
        const f16vec2 r1 = ((CF_PK >> q) & 1u) != 0u ? p[1][1] : p[1][0];
        const f16vec2 pr = ((CF_PR >> q) & 1u) != 0u ? r1 : r0;
        b[e] = (e & 1u) != 0u ? pr.y : pr.x;
    }
}

#ifdef CF_WIDE
// one slab: 16 K steps, the weight fragments built in registers from each lane's block pair
void multiply(uint w[NW][DW], uint buf, inout ACC acc[NW][CF_FT]) {
    [[unroll]] for (uint j = 0u; j < 16u; j++) {
        coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[CF_FT];
        [[unroll]] for (uint i = 0u; i < CF_FT; i++)
            coopMatLoad(a[i], xs, (buf * BM + 16u * i) * SX4 + j * 4u, SX4, gl_CooperativeMatrixLayoutRowMajor);
        const uint blk = j / 8u;   // which block of the lane's pair this K step reads
        [[unroll]] for (uint g = 0u; g < NW; g++) {
            f16vec2 p[2][2];   // [row g / g + 8][K slots 2t.. / 2t + 8..]
            [[unroll]] for (uint r = 0u; r < 2u; r++) {
                const uint o = PW * r;
#if defined(WTYPE_Q8_0)
                // block 0's quants start at byte 2 of the pair (after its scale), block 1's at 36
                const uint q = j % 8u;
                const uint v = blk == 0u ? (w[g][o + q] >> 16) | (w[g][o + q + 1u] << 16) : w[g][o + 9u + q];
                const float16_t dv = blk == 0u ? unpackFloat2x16(w[g][o]).x : unpackFloat2x16(w[g][o + 8u]).y;
                p[r][0] = byte_pair(v, f16vec2(dv));
                p[r][1] = byte_pair(v >> 8, f16vec2(dv));
#else
                // block 0's quants start at byte 2 of the pair (after its scale), block 1's at 20;
                // a word holds 8 nibbles: K steps 2w and 2w + 1 read its low and high ones
                const uint wd = (j % 8u) / 2u, sh = 4u * (j % 2u);
                const uint v = blk == 0u ? (w[g][o + wd] >> 16) | (w[g][o + wd + 1u] << 16) : w[g][o + 5u + wd];
                const float16_t dv = blk == 0u ? unpackFloat2x16(w[g][o]).x : unpackFloat2x16(w[g][o + 4u]).y;
                p[r][0] = nib(v >> sh, f16vec2(dv));
                p[r][1] = nib(v >> (sh + 8u), f16vec2(dv));
#endif
            }
            FRAG_B b;
            fragment(p, b);
            [[unroll]] for (uint i = 0u; i < CF_FT; i++) acc[g][i] = coopMatMulAdd(a[i], b, acc[g][i]);
        }
    }
}
#elif defined(WTYPE_Q4_K)
// byte k of a Q4_K super-block's 12 scale bytes, held as 3 words
uint scale_byte(uint s0, uint s1, uint s2, uint k) { return ((k < 4u ? s0 : k < 8u ? s1 : s2) >> (8u * (k & 3u))) & 0xFFu; }

// the 6-bit scale and min of sub-block i (0..7), as llama.cpp's get_scale_min_k4 reads them
uvec2 scale_min(uint s0, uint s1, uint s2, uint i) {
    if (i < 4u) return uvec2(scale_byte(s0, s1, s2, i) & 63u, scale_byte(s0, s1, s2, i + 4u) & 63u);
    const uint c = scale_byte(s0, s1, s2, i + 4u);
    return uvec2((c & 0xFu) | ((scale_byte(s0, s1, s2, i - 4u) >> 6) << 4), (c >> 4) | ((scale_byte(s0, s1, s2, i) >> 6) << 4));
}

// weights of nibble pair `v` (bits 0 and 16): q s - m
f16vec2 nib_k(uint v, f16vec2 sc, f16vec2 mn) {
    return fma(unpackFloat2x16((v & 0x000F000Fu) | 0x64006400u) - f16vec2(1024.0), sc, -mn);
}

// one slab (Q4_K): each group's four 16-wide K steps (st: the low nibbles of its first 16 bytes, of
// its last 16, then the high nibbles of both), each sub-block's scale and min applied in f16
void multiply(uint w[NW][DW], uint buf, uint slab, inout ACC acc[NW][CF_FT]) {
    [[unroll]] for (uint j = 0u; j < NG; j++) {
        const uint sub0 = 2u * ((slab * NG + j) % 4u);   // the group's first sub-block in its super-block
        f16vec2 sc[NW][2][2], mn[NW][2][2];   // [matrix][row g / g + 8][sub-block 2j / 2j + 1]
        [[unroll]] for (uint g = 0u; g < NW; g++) [[unroll]] for (uint r = 0u; r < 2u; r++) {
            const uint o = 12u * j + 4u + 4u * r;
            const vec2 dm = unpackHalf2x16(w[g][o]);
            [[unroll]] for (uint h = 0u; h < 2u; h++) {
                const uvec2 q = scale_min(w[g][o + 1u], w[g][o + 2u], w[g][o + 3u], sub0 + h);
                sc[g][r][h] = f16vec2(float16_t(dm.x * float(q.x)));
                mn[g][r][h] = f16vec2(float16_t(dm.y * float(q.y)));
            }
        }
        [[unroll]] for (uint st = 0u; st < 4u; st++) {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[CF_FT];
            [[unroll]] for (uint i = 0u; i < CF_FT; i++)
                coopMatLoad(a[i], xs, (buf * BM + 16u * i) * SX4 + (4u * j + st) * 4u, SX4, gl_CooperativeMatrixLayoutRowMajor);
            const uint h = st / 2u;
            [[unroll]] for (uint g = 0u; g < NW; g++) {
                f16vec2 p[2][2];
                [[unroll]] for (uint r = 0u; r < 2u; r++) {
                    const uint v = w[g][12u * j + 2u * r + (st & 1u)] >> (4u * h);
                    p[r][0] = nib_k(v, sc[g][r][h], mn[g][r][h]);
                    p[r][1] = nib_k(v >> 8, sc[g][r][h], mn[g][r][h]);
                }
                FRAG_B b;
                fragment(p, b);
                [[unroll]] for (uint i = 0u; i < CF_FT; i++) acc[g][i] = coopMatMulAdd(a[i], b, acc[g][i]);
            }
        }
    }
}
#else
// one slab: each block's two 16-wide K steps (h: the low nibbles, K 0..15, then the high ones),
// the weight fragments built in registers (CF_DIRECT); x's fragments of one step at a time (the
// prefill tiles' CF_FT of 3-4 would hold twice as many registers for both steps' at once)
void multiply(uint w[NW][DW], uint buf, inout ACC acc[NW][CF_FT]) {
    [[unroll]] for (uint j = 0u; j < NBK; j++) [[unroll]] for (uint h = 0u; h < 2u; h++) {
        coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[CF_FT];
        [[unroll]] for (uint i = 0u; i < CF_FT; i++)
            coopMatLoad(a[i], xs, (buf * BM + 16u * i) * SX4 + (2u * j + h) * 4u, SX4, gl_CooperativeMatrixLayoutRowMajor);
        [[unroll]] for (uint g = 0u; g < NW; g++) {
            const f16vec2 dd = unpackFloat2x16(w[g][3u * j + 2u]);
            f16vec2 p[2][2];   // [row g (0) / g + 8 (1)][K slots 2t.. (0) / 2t + 8.. (1)]
            [[unroll]] for (uint r = 0u; r < 2u; r++) {
                const uint v = w[g][3u * j + r] >> (4u * h);
                p[r][0] = nib(v, f16vec2(dd[r]));
                p[r][1] = nib(v >> 8, f16vec2(dd[r]));
            }
            FRAG_B b;
            fragment(p, b);
            [[unroll]] for (uint i = 0u; i < CF_FT; i++) acc[g][i] = coopMatMulAdd(a[i], b, acc[g][i]);
        }
    }
}
#endif
#else
// one slab: the subgroup's weights (this lane's records `w`) into its region as f16, then the
// products with x's slab in shared buffer `buf`
#ifdef CF_RAW
void multiply(uint w[NW][RPL], uint buf, uint region, inout ACC acc[NW][CF_FT]) {
#else
void multiply(CHUNK w[NW * CF_KC], uint buf, uint region, inout ACC acc[NW][CF_FT]) {
#endif
#ifdef CF_RAW
    [[unroll]] for (uint g = 0u; g < NW; g++) store_raw(w, g);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
#endif
    [[unroll]] for (uint g = 0u; g < NW; g++) [[unroll]] for (uint j = 0u; j < CF_KC; j++) {
#ifdef CF_RAW
        CHUNK u;
        unpack_raw(g, j, u);
        put_w(u, region + g * 16u, j);
#else
        put_w(w[g * CF_KC + j], region + g * 16u, j);
#endif
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    [[unroll]] for (uint kk = 0u; kk < KS / 16u; kk++) {
        coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[CF_FT];
        [[unroll]] for (uint i = 0u; i < CF_FT; i++)
            coopMatLoad(a[i], xs, (buf * BM + 16u * i) * SX4 + kk * 4u, SX4, gl_CooperativeMatrixLayoutRowMajor);
        [[unroll]] for (uint g = 0u; g < NW; g++) {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
            coopMatLoad(b, ws, (region + g * 16u) * SX4 + kk * 4u, SX4, gl_CooperativeMatrixLayoutColumnMajor);
            [[unroll]] for (uint i = 0u; i < CF_FT; i++) acc[g][i] = coopMatMulAdd(a[i], b, acc[g][i]);
        }
    }
    subgroupBarrier();   // the region is rewritten by the next slab
}
#endif

void main() {
    const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    const uint n0 = gl_WorkGroupID.x * (16u * CF_NSG), m0 = gl_WorkGroupID.y * BM;
#if defined(CF_RAW) || defined(CF_DIRECT)
    const uint row = n0 + sg * 16u;                                 // the subgroup's first row
#else
    const uint row = min(n0 + sg * 16u + lane % 16u, pc.n - 1u);   // rows past n repeat the last
#endif
#ifdef CF_DIRECT
#define MREGION
#else
    const uint region = sg * NW * 16u;
#define MREGION region,
#endif
#if defined(CF_DIRECT) && defined(WTYPE_Q4_K)
#define MSLAB(s) s,   // the Q4_K tiles' multiply finds each group's sub-blocks from the slab
#else
#define MSLAB(s)
#endif
#ifdef CF_SPLITK
    // this workgroup's share of K: slabs [first, first + slabs) of split gl_WorkGroupID.z
    const uint all = pc.k / KS, per = (all + gl_NumWorkGroups.z - 1u) / gl_NumWorkGroups.z;
    const uint first = min(gl_WorkGroupID.z * per, all), slabs = min(first + per, all) - first;
#else
    const uint first = 0u, slabs = pc.k / KS;
#endif

    ACC acc[NW][CF_FT];
    [[unroll]] for (uint g = 0u; g < NW; g++) [[unroll]] for (uint i = 0u; i < CF_FT; i++) acc[g][i] = ACC(0.0);

#if defined(CF_DIRECT)
    uint wa[NW][DW], wb[NW][DW];
    vec4 xa[XV * XU], xb[XV * XU];
#elif defined(CF_RAW)
    uint wa[NW][RPL], wb[NW][RPL];
    vec4 xa[XR], xb[XR];
#else
    CHUNK wa[NW * CF_KC], wb[NW * CF_KC];
    vec4 xa[XR], xb[XR];
#endif
    if (slabs > 0u) {   // (a split past the end of K only writes zeros)
        const uint last = first + slabs - 1u;
        fetch_w(first, row, wa);
        fetch_w(min(first + 1u, last), row, wb);
        fetch_x(first, m0, xa);
        fetch_x(min(first + 1u, last), m0, xb);
        put_x(xa, 0u);
        barrier();
        fetch_x(min(first + 2u, last), m0, xa);
        // slab s: weights in wa, x in shared buffer 0; slab s + 1: wb, buffer 1 (x from xb)
        for (uint s = first; s <= last; s += 2u) {
            multiply(wa, 0u, MREGION MSLAB(s) acc);
            fetch_w(min(s + 2u, last), row, wa);
            put_x(xb, 1u);
            barrier();
            fetch_x(min(s + 3u, last), m0, xb);
            if (s + 1u <= last) {
                multiply(wb, 1u, MREGION MSLAB(s + 1u) acc);
                fetch_w(min(s + 3u, last), row, wb);
                put_x(xa, 0u);
                barrier();
                fetch_x(min(s + 4u, last), m0, xa);
            }
        }
    }

#ifdef CF_SPLITK
    // partial sums to binding 1 as [split][matrix][token][row] (gemm_splitk_reduce.comp adds them)
    [[unroll]] for (uint g = 0u; g < NW; g++) [[unroll]] for (uint i = 0u; i < CF_FT; i++) {
        coopMatStore(acc[g][i], cs, sg * 256u, 16, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        for (uint e = lane; e < 256u; e += 32u) {
            const uint m = m0 + 16u * i + e / 16u, n = n0 + sg * 16u + e % 16u;
            if (m < pc.m && n < pc.n) y[((gl_WorkGroupID.z * NW + g) * pc.m + m) * pc.n + n] = cs[sg * 256u + e];
        }
        subgroupBarrier();
    }
#else
    // out through the subgroup's staging tile (bounds checks at the edges)
    [[unroll]] for (uint i = 0u; i < CF_FT; i++) {
        ACC r = acc[0][i];
#ifdef GEMM_GEGLU
        for (int e = 0; e < r.length(); e++) r[e] = gelu_tanh(acc[0][i][e]) * acc[1][i][e];
#endif
        coopMatStore(r, cs, sg * 256u, 16, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        for (uint e = lane; e < 256u; e += 32u) {
            const uint m = m0 + 16u * i + e / 16u, n = n0 + sg * 16u + e % 16u;
            if (m < pc.m && n < pc.n) y[m * pc.y_stride + pc.y_off + n] = cs[sg * 256u + e];
        }
        subgroupBarrier();
    }
#endif
}
