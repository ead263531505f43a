// Weights of a GGUF-layout matrix, dequantized: FN(w_at)(row, col, n_cols) one weight,
// FN(w_run16)(row, col0, n_cols, v) the 16 weights col0 .. col0 + 15 (col0 % 16 == 0).
// Reads the binding named by W16 / WF (u16 / f32 views of the same bytes); the GEMM includes
// this once per weight binding (FN renames). The GEMMs stage a weight tile per K step with
// runs of 16: every quantized type decodes a run from its block header and 8 u16 loads per 16
// bytes of quants (a run never crosses a scale). Block layouts: see matvec_dot.glsl (ggml-common.h).
// Needs include/common.glsl (half_lo, bf16, 16-bit storage).

#include "gguf_bytes.glsl"
#if defined(WTYPE_IQ4_NL) || defined(WTYPE_IQ4_XS)
#include "iq4_values.glsl"
#endif

#if (defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)) && !defined(KQ_BW)
#if defined(WTYPE_Q4_K)
#define KQ_BW 72u    // u16 words per 256-weight block
#define KQ_QS 16u    // byte offset of qs
#else
#define KQ_BW 88u
#define KQ_QS 48u
#endif
#endif

#ifndef GEMM_DEQUANT_BYTES
#define GEMM_DEQUANT_BYTES
// the 4 bytes of a word as floats (32-bit ops only: no int8 capability needed)
vec4 bytes_u4(uint q) { return vec4(q & 255u, (q >> 8) & 255u, (q >> 16) & 255u, q >> 24); }
#endif

float FN(w_at)(uint row, uint col, uint n_cols) {
#if defined(WTYPE_F32)
    return WF[row * n_cols + col];
#elif defined(WTYPE_F16)
    return half_lo(W16[row * n_cols + col]);
#elif defined(WTYPE_BF16)
    return bf16(W16[row * n_cols + col]);
#elif defined(WTYPE_Q8_0)
    uint w = (row * (n_cols >> 5) + (col >> 5)) * 17u;          // 34 B blocks
    uint j = col & 31u;
    return half_lo(W16[w]) * float(int(FN(byte)(2u * w + 2u + j) << 24) >> 24);
#elif defined(WTYPE_Q4_0)
    uint w = (row * (n_cols >> 5) + (col >> 5)) * 9u;           // 18 B
    uint j = col & 31u;
    uint q = FN(byte)(2u * w + 2u + (j & 15u));
    return half_lo(W16[w]) * (float(j < 16u ? (q & 15u) : (q >> 4)) - 8.0);
#elif defined(WTYPE_Q5_0)
    uint w = (row * (n_cols >> 5) + (col >> 5)) * 11u;          // 22 B
    uint j = col & 31u;
    uint qh = uint(W16[w + 1u]) | (uint(W16[w + 2u]) << 16);
    uint q = FN(byte)(2u * w + 6u + (j & 15u));
    q = (j < 16u ? (q & 15u) : (q >> 4)) | (((qh >> j) & 1u) << 4);
    return half_lo(W16[w]) * (float(q) - 16.0);
#elif defined(WTYPE_Q4_1)
    uint w = (row * (n_cols >> 5) + (col >> 5)) * 10u;          // 20 B: d, m, 16 B of nibbles
    uint j = col & 31u;
    uint q = FN(byte)(2u * w + 4u + (j & 15u));
    return half_lo(W16[w]) * float(j < 16u ? (q & 15u) : (q >> 4)) + half_lo(W16[w + 1u]);
#elif defined(WTYPE_Q5_1)
    uint w = (row * (n_cols >> 5) + (col >> 5)) * 12u;          // 24 B: d, m, qh[4], 16 B
    uint j = col & 31u;
    uint qh = uint(W16[w + 2u]) | (uint(W16[w + 3u]) << 16);
    uint q = FN(byte)(2u * w + 8u + (j & 15u));
    q = (j < 16u ? (q & 15u) : (q >> 4)) | (((qh >> j) & 1u) << 4);
    return half_lo(W16[w]) * float(q) + half_lo(W16[w + 1u]);
#elif defined(WTYPE_IQ4_NL)
    uint w = (row * (n_cols >> 5) + (col >> 5)) * 9u;           // 18 B: d, 16 B of level indexes
    uint j = col & 31u;
    uint q = FN(byte)(2u * w + 2u + (j & 15u));
    return half_lo(W16[w]) * iq4_kv(j < 16u ? (q & 15u) : (q >> 4));
#elif defined(WTYPE_IQ4_XS)
    uint w = (row * (n_cols >> 8) + (col >> 8)) * 68u;          // 136 B: d, scales_h, scales_l[4], qs[128]
    uint e = col & 255u, ib = e >> 5, j = e & 31u;
    uint q = FN(byte)(2u * w + 8u + 16u * ib + (j & 15u));
    return half_lo(W16[w]) * FN(iq4xs_scale)(w, ib) * iq4_kv(j < 16u ? (q & 15u) : (q >> 4));
#elif defined(WTYPE_Q2_K)
    uint w = (row * (n_cols >> 8) + (col >> 8)) * 42u;          // 84 B: scales[16], qs[64], d, dmin
    uint e = col & 255u, h = e >> 7, j = (e & 127u) >> 5, l = e & 31u;
    uint sc = FN(byte)(2u * w + (e >> 4));                      // sub-block of 16: scale | min << 4
    uint q = (FN(byte)(2u * w + 16u + 32u * h + l) >> (2u * j)) & 3u;
    return half_lo(W16[w + 40u]) * float(sc & 15u) * float(q) - half_lo(W16[w + 41u]) * float(sc >> 4);
#elif defined(WTYPE_Q3_K)
    uint w = (row * (n_cols >> 8) + (col >> 8)) * 55u;          // 110 B: hmask[32], qs[64], scales[12], d
    uint e = col & 255u, h = e >> 7, j = (e & 127u) >> 5, l = e & 31u;
    uint q = (FN(byte)(2u * w + 32u + 32u * h + l) >> (2u * j)) & 3u;
    uint hb = (FN(byte)(2u * w + l) >> (e >> 5)) & 1u;          // high bit set: no -4
    return half_lo(W16[w + 54u]) * FN(q3k_scale)(2u * w + 96u, e >> 4) * float(int(q | (hb << 2)) - 4);
#elif defined(WTYPE_IQ_GRID)
    uint w = IQ_GRID_W16 + (row * (n_cols >> 8) + (col >> 8)) * IQ_BW;
    uint e = col & 255u, lo, hi;
    float s = FN(iq_group)(w, e >> 3, lo, hi);
    return s * iq_byte((e & 4u) != 0u ? hi : lo, e & 3u);
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
    uint w = (row * (n_cols >> 8) + (col >> 8)) * KQ_BW;
    uint e = col & 255u, j = e >> 5, l = e & 31u;
    float sc, m;
    FN(scale_min)(2u * w + 4u, j, sc, m);
    uint q = (FN(byte)(2u * w + KQ_QS + (j >> 1) * 32u + l) >> ((j & 1u) * 4u)) & 15u;
#if defined(WTYPE_Q5_K)
    q |= ((FN(byte)(2u * w + 16u + l) >> j) & 1u) << 4;
#endif
    return half_lo(W16[w]) * sc * float(q) - half_lo(W16[w + 1u]) * m;
#elif defined(WTYPE_Q6_K)
    uint w = (row * (n_cols >> 8) + (col >> 8)) * 105u;         // 210 B
    uint B = 2u * w;
    uint e = col & 255u, h = e >> 7, r = e & 127u, qq = r >> 5, l = r & 31u;
    uint lo = (FN(byte)(B + 64u * h + (qq & 1u) * 32u + l) >> ((qq >> 1) * 4u)) & 15u;
    uint hi = (FN(byte)(B + 128u + 32u * h + l) >> (2u * qq)) & 3u;
    int s = int(FN(byte)(B + 192u + 8u * h + (l >> 4) + 2u * qq) << 24) >> 24;
    return half_lo(W16[w + 104u]) * float(s) * float(int(lo | (hi << 4)) - 32);
#else
#error "gemm_dequant.glsl: no weight type defined"
#endif
}

void FN(w_run16)(uint row, uint col0, uint n_cols, out float v[16]) {
    // one run shares its block's scale (16 divides every sub-block), so each type decodes it
    // from one header and 8 u16 loads per 16 bytes of quants, not 16 separate w_at calls
#if defined(WTYPE_F32) || defined(WTYPE_F16) || defined(WTYPE_BF16)
    const uint base = row * n_cols + col0;
    [[unroll]] for (uint i = 0; i < 16; i++) {
#if defined(WTYPE_F32)
        v[i] = WF[base + i];
#elif defined(WTYPE_F16)
        v[i] = half_lo(W16[base + i]);
#else
        v[i] = bf16(W16[base + i]);
#endif
    }
#elif defined(WTYPE_Q4_0)
    const uint w = (row * (n_cols >> 5) + (col0 >> 5)) * 9u;    // 18 B blocks: d, 16 B of nibbles
    const float d = half_lo(W16[w]);
    const uint shift = (col0 & 16u) >> 2;                        // low nibbles: 0..15, high: 16..31
    [[unroll]] for (uint i = 0; i < 8; i++) {
        const uint q = uint(W16[w + 1u + i]) >> shift;
        v[2 * i] = d * (float(q & 15u) - 8.0);
        v[2 * i + 1] = d * (float((q >> 8) & 15u) - 8.0);
    }
#elif defined(WTYPE_Q8_0)
    const uint w = (row * (n_cols >> 5) + (col0 >> 5)) * 17u;   // 34 B blocks: d, 32 int8
    const float d = half_lo(W16[w]);
    const uint o = w + 1u + ((col0 & 16u) >> 1);
    [[unroll]] for (uint i = 0; i < 8; i++) {
        const uint q = uint(W16[o + i]);
        v[2 * i] = d * float(int(q << 24) >> 24);
        v[2 * i + 1] = d * float(int(q << 16) >> 24);
    }
#elif defined(WTYPE_Q5_0)
    const uint w = (row * (n_cols >> 5) + (col0 >> 5)) * 11u;   // 22 B: d, qh[4], 16 B of nibbles
    const float d = half_lo(W16[w]);
    const uint j0 = col0 & 16u;
    const uint qh = (uint(W16[w + 1u]) | (uint(W16[w + 2u]) << 16)) >> j0;
    [[unroll]] for (uint i = 0; i < 8; i++) {
        const uint q = uint(W16[w + 3u + i]) >> (j0 >> 2);
        v[2 * i] = d * (float((q & 15u) | (((qh >> (2u * i)) & 1u) << 4)) - 16.0);
        v[2 * i + 1] = d * (float(((q >> 8) & 15u) | (((qh >> (2u * i + 1u)) & 1u) << 4)) - 16.0);
    }
#elif defined(WTYPE_Q4_1) || defined(WTYPE_IQ4_NL)
#if defined(WTYPE_Q4_1)
    const uint w = (row * (n_cols >> 5) + (col0 >> 5)) * 10u;   // 20 B: d, m, 16 B of nibbles
    const float m = half_lo(W16[w + 1u]);
    const uint qo = w + 2u;
#else
    const uint w = (row * (n_cols >> 5) + (col0 >> 5)) * 9u;    // 18 B: d, 16 B of level indexes
    const uint qo = w + 1u;
#endif
    const float d = half_lo(W16[w]);
    const uint shift = (col0 & 16u) >> 2;
    [[unroll]] for (uint i = 0; i < 8; i++) {
        const uint q = uint(W16[qo + i]) >> shift;
#if defined(WTYPE_Q4_1)
        v[2 * i] = d * float(q & 15u) + m;
        v[2 * i + 1] = d * float((q >> 8) & 15u) + m;
#else
        v[2 * i] = d * iq4_kv(q & 15u);
        v[2 * i + 1] = d * iq4_kv((q >> 8) & 15u);
#endif
    }
#elif defined(WTYPE_Q5_1)
    const uint w = (row * (n_cols >> 5) + (col0 >> 5)) * 12u;   // 24 B: d, m, qh[4], 16 B of nibbles
    const float d = half_lo(W16[w]), m = half_lo(W16[w + 1u]);
    const uint j0 = col0 & 16u;
    const uint qh = (uint(W16[w + 2u]) | (uint(W16[w + 3u]) << 16)) >> j0;
    [[unroll]] for (uint i = 0; i < 8; i++) {
        const uint q = uint(W16[w + 4u + i]) >> (j0 >> 2);
        v[2 * i] = d * float((q & 15u) | (((qh >> (2u * i)) & 1u) << 4)) + m;
        v[2 * i + 1] = d * float(((q >> 8) & 15u) | (((qh >> (2u * i + 1u)) & 1u) << 4)) + m;
    }
#elif defined(WTYPE_IQ4_XS)
    const uint w = (row * (n_cols >> 8) + (col0 >> 8)) * 68u;
    const uint e = col0 & 255u, ib = e >> 5;
    const float d = half_lo(W16[w]) * FN(iq4xs_scale)(w, ib);
    const uint qo = w + 4u + 8u * ib, shift = (e & 16u) >> 2;
    [[unroll]] for (uint i = 0; i < 8; i++) {
        const uint q = uint(W16[qo + i]) >> shift;
        v[2 * i] = d * iq4_kv(q & 15u);
        v[2 * i + 1] = d * iq4_kv((q >> 8) & 15u);
    }
#elif defined(WTYPE_Q2_K) || defined(WTYPE_Q3_K)
    // a run of 16 is one sub-block: one scale; its 16 quants are 2 bits of 16 consecutive bytes
    const uint e = col0 & 255u, h = e >> 7, j = (e & 127u) >> 5, l0 = e & 31u;
#if defined(WTYPE_Q2_K)
    const uint w = (row * (n_cols >> 8) + (col0 >> 8)) * 42u;
    const uint sc = FN(byte)(2u * w + (e >> 4));
    const float d = half_lo(W16[w + 40u]) * float(sc & 15u), dm = half_lo(W16[w + 41u]) * float(sc >> 4);
    const uint qo = w + 8u + 16u * h + l0 / 2u;
#else
    const uint w = (row * (n_cols >> 8) + (col0 >> 8)) * 55u;
    const float d = half_lo(W16[w + 54u]) * FN(q3k_scale)(2u * w + 96u, e >> 4);
    const uint qo = w + 16u + 16u * h + l0 / 2u, ho = w + l0 / 2u, hs = e >> 5;
#endif
    [[unroll]] for (uint i = 0; i < 8; i++) {
        const uint q = uint(W16[qo + i]) >> (2u * j);
#if defined(WTYPE_Q2_K)
        v[2 * i] = d * float(q & 3u) - dm;
        v[2 * i + 1] = d * float((q >> 8) & 3u) - dm;
#else
        const uint hb = uint(W16[ho + i]) >> hs;
        v[2 * i] = d * float(int((q & 3u) | ((hb & 1u) << 2)) - 4);
        v[2 * i + 1] = d * float(int(((q >> 8) & 3u) | (((hb >> 8) & 1u) << 2)) - 4);
#endif
    }
#elif defined(WTYPE_IQ_GRID)
    // a run of 16 is two groups of 8, each one scale and 8 signed grid bytes
    const uint w = IQ_GRID_W16 + (row * (n_cols >> 8) + (col0 >> 8)) * IQ_BW;
    const uint g0 = (col0 & 255u) >> 3;
    [[unroll]] for (uint k = 0; k < 2; k++) {
        uint lo, hi;
        const float s = FN(iq_group)(w, g0 + k, lo, hi);
        [[unroll]] for (uint i = 0; i < 4; i++) {
            v[8 * k + i] = s * iq_byte(lo, i);
            v[8 * k + 4 + i] = s * iq_byte(hi, i);
        }
    }
#elif (defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)) && defined(W32)
    // 144 / 176 B blocks keep every 4-byte group of quants word-aligned: 32-bit loads (H100,
    // 27B shapes: 10-20% faster GEMMs than 16-bit ones; for Q4_0's 18 B blocks the same words,
    // shifted into place, were slower in the 64 x 64 subgroup tile, so they keep 16-bit loads)
    const uint w = (row * (n_cols >> 8) + (col0 >> 8)) * KQ_BW;
    const uint e = col0 & 255u, j = e >> 5, l0 = e & 31u;
    float sc, m;
    FN(scale_min)(2u * w + 4u, j, sc, m);
    const float d = half_lo(W16[w]) * sc, dm = half_lo(W16[w + 1u]) * m;
    const uint qa = (w + (KQ_QS + (j >> 1) * 32u + l0) / 2u) >> 1u, shift = (j & 1u) * 4u;
    [[unroll]] for (uint i = 0; i < 4; i++) {
        uint q = (W32[qa + i] >> shift) & 0x0F0F0F0Fu;
#if defined(WTYPE_Q5_K)
        q |= ((W32[(w + (16u + l0) / 2u) / 2u + i] >> j) & 0x01010101u) << 4;   // qh[32] at byte 16, bit j
#endif
        const vec4 qv = bytes_u4(q);
        [[unroll]] for (uint c = 0; c < 4; c++) v[4 * i + c] = d * qv[c] - dm;
    }
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
    const uint w = (row * (n_cols >> 8) + (col0 >> 8)) * KQ_BW;
    const uint e = col0 & 255u, j = e >> 5, l0 = e & 31u;
    float sc, m;
    FN(scale_min)(2u * w + 4u, j, sc, m);
    const float d = half_lo(W16[w]) * sc, dm = half_lo(W16[w + 1u]) * m;
    const uint qo = w + (KQ_QS + (j >> 1) * 32u + l0) / 2u, shift = (j & 1u) * 4u;
    [[unroll]] for (uint i = 0; i < 8; i++) {
        const uint q = uint(W16[qo + i]) >> shift;
        uint q0 = q & 15u, q1 = (q >> 8) & 15u;
#if defined(WTYPE_Q5_K)
        const uint h = uint(W16[w + (16u + l0) / 2u + i]) >> j;     // qh[32] at byte 16, bit j
        q0 |= (h & 1u) << 4;
        q1 |= ((h >> 8) & 1u) << 4;
#endif
        v[2 * i] = d * float(q0) - dm;
        v[2 * i + 1] = d * float(q1) - dm;
    }
#elif defined(WTYPE_Q6_K)
    const uint w = (row * (n_cols >> 8) + (col0 >> 8)) * 105u;  // 210 B: ql[128], qh[64], scales[16], d
    const uint e = col0 & 255u, h = e >> 7, qq = (e & 127u) >> 5, l0 = e & 31u;
    const int s = int(FN(byte)(2u * w + 192u + 8u * h + (l0 >> 4) + 2u * qq) << 24) >> 24;
    const float ds = half_lo(W16[w + 104u]) * float(s);
    const uint lo = w + (64u * h + (qq & 1u) * 32u + l0) / 2u, ls = (qq >> 1) * 4u;
    const uint hi = w + (128u + 32u * h + l0) / 2u, hs = 2u * qq;
    [[unroll]] for (uint i = 0; i < 8; i++) {
        const uint a = uint(W16[lo + i]) >> ls, b = uint(W16[hi + i]) >> hs;
        v[2 * i] = ds * float(int((a & 15u) | ((b & 3u) << 4)) - 32);
        v[2 * i + 1] = ds * float(int(((a >> 8) & 15u) | (((b >> 8) & 3u) << 4)) - 32);
    }
#else
    [[unroll]] for (uint i = 0; i < 16; i++) v[i] = FN(w_at)(row, col0 + i, n_cols);
#endif
}
