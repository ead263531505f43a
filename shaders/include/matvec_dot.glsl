// One chunk (32 weights) of a row dotted with x, per weight type, for the weight binding named
// by the macros W16 / WF (u16 / f32 views of the same bytes) and functions named FN(...).
// Included once per weight binding by matvec.comp. GGUF block layouts (ggml-common.h):
//   Q8_0 {f16 d; i8 qs[32]}                                    34 B
//   Q4_0 {f16 d; u8 qs[16]}                                     18 B   q = nibble - 8
//   Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}                           22 B   q = (nibble | hbit<<4) - 16
//   Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]}              144 B   256 weights, 8 x 32
//   Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}   176 B
//   Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}         210 B   16 x 16
//   Q4_1 {f16 d, m; u8 qs[16]}                                  20 B   w = d q + m
//   Q5_1 {f16 d, m; u8 qh[4]; u8 qs[16]}                        24 B
//   IQ4_NL {f16 d; u8 qs[16]}                                   18 B   w = d level[nibble]
//   IQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}   136 B   8 x 32, 6-bit scales
//   Q2_K {u8 scales[16]; u8 qs[64]; f16 d, dmin}                84 B   16 x 16, 2-bit q, 4-bit sc / m
//   Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}       110 B   16 x 16, 3-bit q - 4
//   IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S: codebook types, see gguf_bytes.glsl (grid first in the binding)
// All sizes are even, so every block is read through 16-bit loads.

#include "gguf_bytes.glsl"
#if defined(WTYPE_IQ4_NL) || defined(WTYPE_IQ4_XS)
#include "iq4_values.glsl"
#endif

// x of the f32 path: XF(i) is x[i] of the chunk, XARG the parameter it comes from (by default the
// chunk's offset in xf; include/matvec_dot_regs.glsl builds the same decoders over 32 values
// already in registers)
#ifndef XF
#define XF(i) xf[xb + (i)]
#define XARG uint xb
#endif

#ifndef INT_DOT
// ---- f32 activations: x chunk XF(0 .. 31) ----
float FN(chunk_dot)(uint row, uint c, uint n_cols, XARG) {
    float acc = 0.0;
#if defined(WTYPE_F32) || defined(WTYPE_F16) || defined(WTYPE_BF16)
    uint base = row * n_cols + c * 32u;
    uint lim = min(32u, n_cols - c * 32u);
    [[unroll]] for (uint i = 0u; i < 32u; i++) {
        if (i < lim) {
#if defined(WTYPE_F32)
            float w = WF[base + i];
#elif defined(WTYPE_F16)
            float w = half_lo(W16[base + i]);
#else
            float w = bf16(W16[base + i]);
#endif
            acc += w * XF(i);
        }
    }
    return acc;
#elif defined(WTYPE_Q8_0)
    uint b = (row * (n_cols >> 5) + c) * 17u;
    float d = half_lo(W16[b]);
    [[unroll]] for (uint i = 0u; i < 16u; i++) {
        uint u = uint(W16[b + 1u + i]);
        acc += float(int(u << 24) >> 24) * XF(2u * i) + float(int(u << 16) >> 24) * XF(2u * i + 1u);
    }
    return d * acc;
#elif defined(WTYPE_Q4_0)
    uint b = (row * (n_cols >> 5) + c) * 9u;
    float d = half_lo(W16[b]);
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint u = uint(W16[b + 1u + j]);
        acc += (float(u & 0xFu) - 8.0) * XF(2u * j)
             + (float((u >> 8) & 0xFu) - 8.0) * XF(2u * j + 1u)
             + (float((u >> 4) & 0xFu) - 8.0) * XF(2u * j + 16u)
             + (float((u >> 12) & 0xFu) - 8.0) * XF(2u * j + 17u);
    }
    return d * acc;
#elif defined(WTYPE_Q5_0)
    uint b = (row * (n_cols >> 5) + c) * 11u;
    float d = half_lo(W16[b]);
    uint qh = uint(W16[b + 1u]) | (uint(W16[b + 2u]) << 16);
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint u = uint(W16[b + 3u + j]);
        uint k = 2u * j;
        acc += (float((u & 0xFu) | (((qh >> k) & 1u) << 4)) - 16.0) * XF(k)
             + (float(((u >> 8) & 0xFu) | (((qh >> (k + 1u)) & 1u) << 4)) - 16.0) * XF(k + 1u)
             + (float(((u >> 4) & 0xFu) | (((qh >> (k + 16u)) & 1u) << 4)) - 16.0) * XF(k + 16u)
             + (float(((u >> 12) & 0xFu) | (((qh >> (k + 17u)) & 1u) << 4)) - 16.0) * XF(k + 17u);
    }
    return d * acc;
#elif defined(WTYPE_Q4_1) || defined(WTYPE_IQ4_NL) || defined(WTYPE_IQ4_XS)
    // 16 words of 2 bytes: low nibbles are weights 2j, 2j+1, high ones 2j+16, 2j+17
#if defined(WTYPE_Q4_1)
    uint b = (row * (n_cols >> 5) + c) * 10u;
    float d = half_lo(W16[b]);
    uint qo = b + 2u;
#elif defined(WTYPE_IQ4_NL)
    uint b = (row * (n_cols >> 5) + c) * 9u;
    float d = half_lo(W16[b]);
    uint qo = b + 1u;
#else
    uint b = (row * (n_cols >> 8) + (c >> 3)) * 68u;
    float d = half_lo(W16[b]) * FN(iq4xs_scale)(b, c & 7u);
    uint qo = b + 4u + 8u * (c & 7u);
#endif
    float sx = 0.0;
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint u = uint(W16[qo + j]);
        float x0 = XF(2u * j), x1 = XF(2u * j + 1u), x2 = XF(2u * j + 16u), x3 = XF(2u * j + 17u);
#if defined(WTYPE_Q4_1)
        acc += float(u & 0xFu) * x0 + float((u >> 8) & 0xFu) * x1 + float((u >> 4) & 0xFu) * x2
             + float((u >> 12) & 0xFu) * x3;
        sx += (x0 + x1) + (x2 + x3);
#else
        acc += iq4_kv(u & 0xFu) * x0 + iq4_kv((u >> 8) & 0xFu) * x1 + iq4_kv((u >> 4) & 0xFu) * x2
             + iq4_kv((u >> 12) & 0xFu) * x3;
#endif
    }
#if defined(WTYPE_Q4_1)
    return d * acc + half_lo(W16[b + 1u]) * sx;
#else
    return d * acc;
#endif
#elif defined(WTYPE_Q5_1)
    uint b = (row * (n_cols >> 5) + c) * 12u;
    float d = half_lo(W16[b]);
    uint qh = uint(W16[b + 2u]) | (uint(W16[b + 3u]) << 16);
    float sx = 0.0;
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint u = uint(W16[b + 4u + j]);
        uint k = 2u * j;
        float x0 = XF(k), x1 = XF(k + 1u), x2 = XF(k + 16u), x3 = XF(k + 17u);
        acc += float((u & 0xFu) | (((qh >> k) & 1u) << 4)) * x0
             + float(((u >> 8) & 0xFu) | (((qh >> (k + 1u)) & 1u) << 4)) * x1
             + float(((u >> 4) & 0xFu) | (((qh >> (k + 16u)) & 1u) << 4)) * x2
             + float(((u >> 12) & 0xFu) | (((qh >> (k + 17u)) & 1u) << 4)) * x3;
        sx += (x0 + x1) + (x2 + x3);
    }
    return d * acc + half_lo(W16[b + 1u]) * sx;
#elif defined(WTYPE_Q2_K) || defined(WTYPE_Q3_K)
    // chunk c of a super-block: 32 weights, 2 bits each of 32 consecutive bytes (shift 2 * (c & 3)),
    // two sub-blocks of 16 with their own scales; Q3_K adds a high bit from hmask (bit c & 7)
    uint ib = c & 7u, h = ib >> 2, sh = 2u * (ib & 3u);
#if defined(WTYPE_Q2_K)
    uint w0 = (row * (n_cols >> 8) + (c >> 3)) * 42u;
    uint qo = w0 + 8u + 16u * h;
#else
    uint w0 = (row * (n_cols >> 8) + (c >> 3)) * 55u;
    uint qo = w0 + 16u + 16u * h;
#endif
    [[unroll]] for (uint half_ = 0u; half_ < 2u; half_++) {
        float part = 0.0, sx = 0.0;
        [[unroll]] for (uint l = half_ * 16u; l < half_ * 16u + 16u; l += 2u) {
            uint u = uint(W16[qo + l / 2u]) >> sh;
            float x0 = XF(l), x1 = XF(l + 1u);
#if defined(WTYPE_Q2_K)
            part += float(u & 3u) * x0 + float((u >> 8) & 3u) * x1;
            sx += x0 + x1;
#else
            uint hb = uint(W16[w0 + l / 2u]) >> ib;
            part += float(int((u & 3u) | ((hb & 1u) << 2)) - 4) * x0
                  + float(int(((u >> 8) & 3u) | (((hb >> 8) & 1u) << 2)) - 4) * x1;
#endif
        }
#if defined(WTYPE_Q2_K)
        uint sc = FN(byte)(2u * w0 + 2u * ib + half_);
        acc += float(sc & 15u) * part * half_lo(W16[w0 + 40u]) - float(sc >> 4) * sx * half_lo(W16[w0 + 41u]);
#else
        acc += FN(q3k_scale)(2u * w0 + 96u, 2u * ib + half_) * part;
#endif
    }
#if defined(WTYPE_Q2_K)
    return acc;
#else
    return half_lo(W16[w0 + 54u]) * acc;
#endif
#elif defined(WTYPE_IQ_GRID)
    // chunk c: groups 4 (c & 7) .. +3 of its block, each a scale and 8 signed grid bytes
    uint w = IQ_GRID_W16 + (row * (n_cols >> 8) + (c >> 3)) * IQ_BW;
    [[unroll]] for (uint k = 0u; k < 4u; k++) {
        uint lo, hi;
        float s = FN(iq_group)(w, 4u * (c & 7u) + k, lo, hi);
        float part = 0.0;
        [[unroll]] for (uint i = 0u; i < 4u; i++) part += iq_byte(lo, i) * XF(8u * k + i) + iq_byte(hi, i) * XF(8u * k + 4u + i);
        acc += s * part;
    }
    return acc;
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
#if defined(WTYPE_Q4_K)
    const uint BW = 72u;          // u16 words per block
    const uint QS = 16u;          // byte offset of qs
#else
    const uint BW = 88u;
    const uint QS = 48u;
#endif
    uint sb = row * (n_cols >> 8) + (c >> 3);
    uint j = c & 7u;
    uint w0 = sb * BW;
    float d = half_lo(W16[w0]);
    float dmin = half_lo(W16[w0 + 1u]);
    float sc, m;
    FN(scale_min)(w0 * 2u + 4u, j, sc, m);
    uint qbyte = w0 * 2u + QS + (j >> 1) * 32u;   // 32 bytes, nibble j&1
    uint shift = (j & 1u) * 4u;
    float sx = 0.0;
    [[unroll]] for (uint l = 0u; l < 32u; l += 2u) {
        uint u = uint(W16[(qbyte + l) >> 1]);
        float q0 = float((u >> shift) & 0xFu);
        float q1 = float((u >> (8u + shift)) & 0xFu);
#if defined(WTYPE_Q5_K)
        uint h = uint(W16[(w0 * 2u + 16u + l) >> 1]);
        q0 += float((h >> j) & 1u) * 16.0;
        q1 += float((h >> (8u + j)) & 1u) * 16.0;
#endif
        float x0 = XF(l), x1 = XF(l + 1u);
        acc += q0 * x0 + q1 * x1;
        sx += x0 + x1;
    }
    return d * sc * acc - dmin * m * sx;
#elif defined(WTYPE_Q6_K)
    uint sb = row * (n_cols >> 8) + (c >> 3);
    uint h = (c & 7u) >> 2;
    uint q = c & 3u;
    uint w0 = sb * 105u;
    uint B = w0 * 2u;
    float d = half_lo(W16[w0 + 104u]);
    uint ql = B + 64u * h + (q & 1u) * 32u;
    uint qhb = B + 128u + 32u * h;
    uint nsh = (q >> 1) * 4u;
    uint hsh = 2u * q;
    [[unroll]] for (uint half_ = 0u; half_ < 2u; half_++) {
        float part = 0.0;
        [[unroll]] for (uint l = half_ * 16u; l < half_ * 16u + 16u; l += 2u) {
            uint u = uint(W16[(ql + l) >> 1]);
            uint hh = uint(W16[(qhb + l) >> 1]);
            int q0 = int(((u >> nsh) & 0xFu) | (((hh >> hsh) & 3u) << 4)) - 32;
            int q1 = int(((u >> (8u + nsh)) & 0xFu) | (((hh >> (8u + hsh)) & 3u) << 4)) - 32;
            part += float(q0) * XF(l) + float(q1) * XF(l + 1u);
        }
        int s = int(FN(byte)(B + 192u + 8u * h + half_ + 2u * q) << 24) >> 24;
        acc += float(s) * part;
    }
    return d * acc;
#else
#error "no weight type defined"
#endif
}
#else
// ---- int8 activations (q8_1 blocks: 8 words of packed int8, f32 d, f32 d*sum(q)) ----
float FN(chunk_dot)(uint row, uint c, uint n_cols, uint xb) {
    float dx = uintBitsToFloat(xq[xb + 8u]);
    float sx = uintBitsToFloat(xq[xb + 9u]);
    int acc = 0;
#if defined(WTYPE_Q8_0)
    uint b = (row * (n_cols >> 5) + c) * 17u;
    float d = half_lo(W16[b]);
    [[unroll]] for (uint i = 0u; i < 8u; i++) {
        uint w = uint(W16[b + 1u + 2u * i]) | (uint(W16[b + 2u + 2u * i]) << 16);
        acc += sdot4x8(w, xq[xb + i], 0);
    }
    return d * dx * float(acc);
#elif defined(WTYPE_Q4_0)
    uint b = (row * (n_cols >> 5) + c) * 9u;
    float d = half_lo(W16[b]);
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        uint w = uint(W16[b + 1u + 2u * i]) | (uint(W16[b + 2u + 2u * i]) << 16);
        acc += sdot4x8(w & 0x0F0F0F0Fu, xq[xb + i], 0);
        acc += sdot4x8((w >> 4) & 0x0F0F0F0Fu, xq[xb + 4u + i], 0);
    }
    return d * (dx * float(acc) - 8.0 * sx);
#elif defined(WTYPE_Q5_0)
    uint b = (row * (n_cols >> 5) + c) * 11u;
    float d = half_lo(W16[b]);
    uint qh = uint(W16[b + 1u]) | (uint(W16[b + 2u]) << 16);
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        uint w = uint(W16[b + 3u + 2u * i]) | (uint(W16[b + 4u + 2u * i]) << 16);
        uint hl = qh >> (4u * i);
        uint hh = qh >> (4u * i + 16u);
        uint bl = ((hl & 1u) << 4) | ((hl & 2u) << 11) | ((hl & 4u) << 18) | ((hl & 8u) << 25);
        uint bh = ((hh & 1u) << 4) | ((hh & 2u) << 11) | ((hh & 4u) << 18) | ((hh & 8u) << 25);
        acc += sdot4x8((w & 0x0F0F0F0Fu) | bl, xq[xb + i], 0);
        acc += sdot4x8(((w >> 4) & 0x0F0F0F0Fu) | bh, xq[xb + 4u + i], 0);
    }
    return d * (dx * float(acc) - 16.0 * sx);
#elif defined(WTYPE_Q4_1) || defined(WTYPE_IQ4_NL) || defined(WTYPE_IQ4_XS)
#if defined(WTYPE_Q4_1)
    uint b = (row * (n_cols >> 5) + c) * 10u;
    float d = half_lo(W16[b]);
    uint qo = b + 2u;
#elif defined(WTYPE_IQ4_NL)
    uint b = (row * (n_cols >> 5) + c) * 9u;
    float d = half_lo(W16[b]);
    uint qo = b + 1u;
#else
    uint b = (row * (n_cols >> 8) + (c >> 3)) * 68u;
    float d = half_lo(W16[b]) * FN(iq4xs_scale)(b, c & 7u);
    uint qo = b + 4u + 8u * (c & 7u);
#endif
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        uint w = uint(W16[qo + 2u * i]) | (uint(W16[qo + 2u * i + 1u]) << 16);
#if defined(WTYPE_Q4_1)
        acc += sdot4x8(w & 0x0F0F0F0Fu, xq[xb + i], 0);
        acc += sdot4x8((w >> 4) & 0x0F0F0F0Fu, xq[xb + 4u + i], 0);
#else
        acc += sdot4x8(iq4_bytes(w), xq[xb + i], 0);
        acc += sdot4x8(iq4_bytes(w >> 4), xq[xb + 4u + i], 0);
#endif
    }
#if defined(WTYPE_Q4_1)
    return d * dx * float(acc) + half_lo(W16[b + 1u]) * sx;
#else
    return d * dx * float(acc);
#endif
#elif defined(WTYPE_Q5_1)
    uint b = (row * (n_cols >> 5) + c) * 12u;
    float d = half_lo(W16[b]);
    uint qh = uint(W16[b + 2u]) | (uint(W16[b + 3u]) << 16);
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        uint w = uint(W16[b + 4u + 2u * i]) | (uint(W16[b + 5u + 2u * i]) << 16);
        uint hl = qh >> (4u * i);
        uint hh = qh >> (4u * i + 16u);
        uint bl = ((hl & 1u) << 4) | ((hl & 2u) << 11) | ((hl & 4u) << 18) | ((hl & 8u) << 25);
        uint bh = ((hh & 1u) << 4) | ((hh & 2u) << 11) | ((hh & 4u) << 18) | ((hh & 8u) << 25);
        acc += sdot4x8((w & 0x0F0F0F0Fu) | bl, xq[xb + i], 0);
        acc += sdot4x8(((w >> 4) & 0x0F0F0F0Fu) | bh, xq[xb + 4u + i], 0);
    }
    return d * dx * float(acc) + half_lo(W16[b + 1u]) * sx;
#elif defined(WTYPE_Q2_K) || defined(WTYPE_Q3_K)
    // two sub-blocks of 16 (4 words of xq each) with their own scales; sum(xq) per half through a
    // dot with ones: Q2_K's mins, Q3_K's -4 offset (q = (2 low bits | high bit << 2) - 4)
    uint ib = c & 7u, h = ib >> 2, sh = 2u * (ib & 3u);
#if defined(WTYPE_Q2_K)
    uint w0 = (row * (n_cols >> 8) + (c >> 3)) * 42u;
    uint qo = w0 + 8u + 16u * h;
#else
    uint w0 = (row * (n_cols >> 8) + (c >> 3)) * 55u;
    uint qo = w0 + 16u + 16u * h;
#endif
    float r = 0.0;
    [[unroll]] for (uint half_ = 0u; half_ < 2u; half_++) {
        int a = 0, sq = 0;
        [[unroll]] for (uint k = half_ * 4u; k < half_ * 4u + 4u; k++) {
            uint lw = uint(W16[qo + 2u * k]) | (uint(W16[qo + 2u * k + 1u]) << 16);
            uint u = (lw >> sh) & 0x03030303u;
#if defined(WTYPE_Q3_K)
            uint hw = uint(W16[w0 + 2u * k]) | (uint(W16[w0 + 2u * k + 1u]) << 16);
            u |= ((hw >> ib) & 0x01010101u) << 2;
#endif
            a += sdot4x8(u, xq[xb + k], 0);
            sq += sdot4x8(0x01010101u, xq[xb + k], 0);
        }
#if defined(WTYPE_Q2_K)
        uint sc = FN(byte)(2u * w0 + 2u * ib + half_);
        r += half_lo(W16[w0 + 40u]) * float(sc & 15u) * float(a) - half_lo(W16[w0 + 41u]) * float(sc >> 4) * float(sq);
#else
        r += FN(q3k_scale)(2u * w0 + 96u, 2u * ib + half_) * float(a - 4 * sq);
#endif
    }
#if defined(WTYPE_Q2_K)
    return dx * r;
#else
    return half_lo(W16[w0 + 54u]) * dx * r;
#endif
#elif defined(WTYPE_IQ_GRID)
    // four groups of 8: the signed grid bytes dot 2 words of xq each, times the group's scale
    uint w = IQ_GRID_W16 + (row * (n_cols >> 8) + (c >> 3)) * IQ_BW;
    float r = 0.0;
    [[unroll]] for (uint k = 0u; k < 4u; k++) {
        uint lo, hi;
        float s = FN(iq_group)(w, 4u * (c & 7u) + k, lo, hi);
        r += s * float(sdot4x8(lo, xq[xb + 2u * k], 0) + sdot4x8(hi, xq[xb + 2u * k + 1u], 0));
    }
    return dx * r;
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
    // sub-block j: 32 nibbles (low or high half of 32 bytes), scale d * sc, offset dmin * m:
    // sum(w x) = d sc dx sum(q xq) - dmin m sx
#if defined(WTYPE_Q4_K)
    const uint BW = 72u;
    const uint QS = 16u;
#else
    const uint BW = 88u;
    const uint QS = 48u;
#endif
    uint j = c & 7u;
    uint w0 = (row * (n_cols >> 8) + (c >> 3)) * BW;
    float d = half_lo(W16[w0]);
    float dmin = half_lo(W16[w0 + 1u]);
    float sc, m;
    FN(scale_min)(w0 * 2u + 4u, j, sc, m);
    uint qw = w0 + QS / 2u + (j >> 1) * 16u;      // u16 index of the sub-block's 32 bytes
    uint shift = (j & 1u) * 4u;
    [[unroll]] for (uint k = 0u; k < 8u; k++) {
        uint w = uint(W16[qw + 2u * k]) | (uint(W16[qw + 2u * k + 1u]) << 16);
        uint q = (w >> shift) & 0x0F0F0F0Fu;
#if defined(WTYPE_Q5_K)
        uint h = uint(W16[w0 + 8u + 2u * k]) | (uint(W16[w0 + 9u + 2u * k]) << 16);
        q |= ((h >> j) & 0x01010101u) << 4;
#endif
        acc += sdot4x8(q, xq[xb + k], 0);
    }
    return d * sc * dx * float(acc) - dmin * m * sx;
#elif defined(WTYPE_Q6_K)
    // chunk c of a super-block: 32 six-bit values (4 low bits from ql, 2 high from qh) - 32, in
    // two halves of 16 with their own int8 scales; sum(xq) per half through a dot with ones
    uint w0 = (row * (n_cols >> 8) + (c >> 3)) * 105u;
    uint h = (c & 7u) >> 2;
    uint q = c & 3u;
    float d = half_lo(W16[w0 + 104u]);
    uint ql = w0 + 32u * h + (q & 1u) * 16u;       // u16 indexes
    uint qh = w0 + 64u + 16u * h;
    uint nsh = (q >> 1) * 4u;
    uint hsh = 2u * q;
    float r = 0.0;
    [[unroll]] for (uint half_ = 0u; half_ < 2u; half_++) {
        int a = 0, sq = 0;
        [[unroll]] for (uint k = half_ * 4u; k < half_ * 4u + 4u; k++) {
            uint lw = uint(W16[ql + 2u * k]) | (uint(W16[ql + 2u * k + 1u]) << 16);
            uint hw = uint(W16[qh + 2u * k]) | (uint(W16[qh + 2u * k + 1u]) << 16);
            uint u = ((lw >> nsh) & 0x0F0F0F0Fu) | (((hw >> hsh) & 0x03030303u) << 4);
            a += sdot4x8(u, xq[xb + k], 0);
            sq += sdot4x8(0x01010101u, xq[xb + k], 0);
        }
        int s = int(FN(byte)(w0 * 2u + 192u + 8u * h + half_ + 2u * q) << 24) >> 24;
        r += float(s) * float(a - 32 * sq);
    }
    return d * dx * r;
#else
#error "int8 path: unsupported weight type"
#endif
}
#endif

// ---- block pairs: Q4_0 / Q8_0 rows with n_cols % 64 == 0 --------------------------------
// Two consecutive blocks (Q4_0: 36 B, Q8_0: 68 B) start 4-byte aligned, so they are read with
// 32-bit loads (9 / 17 per pair instead of 18 / 34 16-bit loads) and re-aligned with shifts.
// x arrives pre-loaded: 16 vec4 (f32 path) or 20 words of two q8_1 blocks (int8 path).
#ifndef XREGS   // the block-pair path has no register form
#if defined(WTYPE_Q4_0) || defined(WTYPE_Q8_0)
#define HAS_PAIRS 1
#if defined(WTYPE_Q4_0)
#define PAIR_WORDS 9u
#define QWORDS 4
#else
#define PAIR_WORDS 17u
#define QWORDS 8
#endif
void FN(load_pair)(uint row, uint p, uint n_cols, out float d0, out float d1, out uint q0[QWORDS],
                   out uint q1[QWORDS]) {
    uint w = (row * (n_cols >> 6) + p) * PAIR_WORDS;
    uint a[QWORDS + 1];
    [[unroll]] for (uint j = 0u; j <= uint(QWORDS); j++) a[j] = W32[w + j];
    d0 = unpackHalf2x16(a[0]).x;
    [[unroll]] for (uint j = 0u; j < uint(QWORDS); j++) q0[j] = (a[j] >> 16) | (a[j + 1u] << 16);
    d1 = unpackHalf2x16(a[QWORDS]).y;
    [[unroll]] for (uint j = 0u; j < uint(QWORDS); j++) q1[j] = W32[w + uint(QWORDS) + 1u + j];
}

#ifndef INT_DOT
float FN(block_f32)(uint q[QWORDS], vec4 xv[16], uint o) {
    float acc = 0.0;
#if defined(WTYPE_Q4_0)
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        uint v = q[j];
        vec4 lo = vec4(float(v & 15u), float((v >> 8) & 15u), float((v >> 16) & 15u), float((v >> 24) & 15u)) - 8.0;
        vec4 hi = vec4(float((v >> 4) & 15u), float((v >> 12) & 15u), float((v >> 20) & 15u), float(v >> 28)) - 8.0;
        acc += dot(lo, xv[o + j]) + dot(hi, xv[o + 4u + j]);
    }
#else
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint v = q[j];
        vec4 w = vec4(float(int(v << 24) >> 24), float(int(v << 16) >> 24), float(int(v << 8) >> 24), float(int(v) >> 24));
        acc += dot(w, xv[o + j]);
    }
#endif
    return acc;
}

float FN(pair_dot)(uint row, uint p, uint n_cols, vec4 xv[16]) {
    float d0, d1;
    uint q0[QWORDS], q1[QWORDS];
    FN(load_pair)(row, p, n_cols, d0, d1, q0, q1);
    return d0 * FN(block_f32)(q0, xv, 0u) + d1 * FN(block_f32)(q1, xv, 8u);
}
#else
float FN(block_i8)(float d, uint q[QWORDS], uint xw[20], uint o) {
    int acc = 0;
    float dx = uintBitsToFloat(xw[o + 8u]);
#if defined(WTYPE_Q4_0)
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        acc += sdot4x8(q[j] & 0x0F0F0F0Fu, xw[o + j], 0);
        acc += sdot4x8((q[j] >> 4) & 0x0F0F0F0Fu, xw[o + 4u + j], 0);
    }
    return d * (dx * float(acc) - 8.0 * uintBitsToFloat(xw[o + 9u]));
#else
    [[unroll]] for (uint j = 0u; j < 8u; j++) acc += sdot4x8(q[j], xw[o + j], 0);
    return d * dx * float(acc);
#endif
}

float FN(pair_dot)(uint row, uint p, uint n_cols, uint xw[20]) {
    float d0, d1;
    uint q0[QWORDS], q1[QWORDS];
    FN(load_pair)(row, p, n_cols, d0, d1, q0, q1);
    return FN(block_i8)(d0, q0, xw, 0u) + FN(block_i8)(d1, q1, xw, 10u);
}
#endif
#endif
#endif
