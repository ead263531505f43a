// Bytes of a GGUF weight block, read through the 16-bit view W16 (every block size is even),
// the K-quants' packed 6-bit scale / min pairs (ggml's get_scale_min_k4), Q3_K's packed signed
// 6-bit scales and IQ4_XS's split 6-bit scales. The one decoder
// of these for the matvec (matvec_dot.glsl) and the GEMM / embedding (gemm_dequant.glsl);
// included once per weight binding, FN renames.

uint FN(byte)(uint b) { return (uint(W16[b >> 1]) >> ((b & 1u) << 3)) & 0xFFu; }

#if defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
// sub-block j's scale and min from the 12 scale bytes starting at byte offset `s`
void FN(scale_min)(uint s, uint j, out float sc, out float m) {
    if (j < 4u) {
        sc = float(FN(byte)(s + j) & 63u);
        m  = float(FN(byte)(s + j + 4u) & 63u);
    } else {
        uint q = FN(byte)(s + j + 4u);
        sc = float((q & 0xFu) | ((FN(byte)(s + j - 4u) >> 6) << 4));
        m  = float((q >> 4) | ((FN(byte)(s + j) >> 6) << 4));
    }
}
#endif

#if defined(WTYPE_Q3_K)
// Q3_K sub-block i's (0..15) scale, minus its offset 32, from the 12 bytes at byte offset s:
// low 4 bits in byte i % 8 (nibble i / 8), high 2 bits in byte 8 + i % 4 (bits 2 (i / 4))
float FN(q3k_scale)(uint s, uint i) {
    uint lo = (FN(byte)(s + (i & 7u)) >> ((i >> 3) * 4u)) & 15u;
    uint hi = (FN(byte)(s + 8u + (i & 3u)) >> (2u * (i >> 2))) & 3u;
    return float(int(lo | (hi << 4)) - 32);
}
#endif

#if defined(WTYPE_IQ4_XS)
// IQ4_XS sub-block ib's (0..7) scale, minus its offset 32, of the block at u16 word w:
// {f16 d; u16 scales_h (2 bits each); u8 scales_l[4] (nibbles)}
float FN(iq4xs_scale)(uint w, uint ib) {
    uint lo = (FN(byte)(2u * w + 4u + (ib >> 1)) >> ((ib & 1u) * 4u)) & 15u;
    uint hi = (uint(W16[w + 1u]) >> (2u * ib)) & 3u;
    return float(int(lo | (hi << 4)) - 32);
}
#endif

#if defined(WTYPE_IQ3_XXS) || defined(WTYPE_IQ3_S) || defined(WTYPE_IQ2_XS) || defined(WTYPE_IQ2_S)
// The codebook types: weight 8g + k of a 256-weight block is d * scale(g) * sign * grid[index][k],
// with groups g = 0..31 of 8 weights (IQ3: two 4-byte grid entries per group, IQ2: one 8-byte
// entry). The grid is the first IQ_GRID_W16 u16 words of the matrix's own buffer (resident.py
// writes it there), so no kernel needs another binding, and is read through the cache like the
// blocks that follow it. Block sizes in u16 words: IQ_BW.
#define WTYPE_IQ_GRID
#if defined(WTYPE_IQ3_XXS)
#define IQ_GRID_W16 512u   // 256 entries x 4 B     {f16 d; u8 qs[64]; u32 scale_signs[8]}        98 B
#define IQ_BW 49u
#elif defined(WTYPE_IQ3_S)
#define IQ_GRID_W16 1024u  // 512 entries x 4 B     {f16 d; qs[64]; qh[8]; signs[32]; scales[4]}  110 B
#define IQ_BW 55u
#elif defined(WTYPE_IQ2_XS)
#define IQ_GRID_W16 2048u  // 512 entries x 8 B     {f16 d; u16 qs[32]; scales[8]}                74 B
#define IQ_BW 37u
#else
#define IQ_GRID_W16 4096u  // 1024 entries x 8 B    {f16 d; qs[32]; signs[32]; qh[8]; scales[8]}  82 B
#define IQ_BW 41u
#endif

#ifndef IQ_SIGNS_GLSL
#define IQ_SIGNS_GLSL
// ggml's ksigns_iq2xs: 7 stored sign bits, the 8th makes the count even
uint iq_ksigns(uint s7) { return s7 | ((bitCount(s7) & 1u) << 7); }

// 4 unsigned grid bytes (all < 128) negated where the low 4 bits of `signs` are set, as int8 bytes:
// per byte (e ^ 0xFF) + 1 never carries into the next, since e > 0
uint iq_signed(uint e, uint signs) {
    uint m = ((signs & 1u) * 0xFFu) | ((signs & 2u) * 0x7F80u) | ((signs & 4u) * 0x3FC000u) | ((signs & 8u) * 0x1FE00000u);
    return (e ^ m) + (m & 0x01010101u);
}

// int8 byte i (0..3) of a packed word, as a float
float iq_byte(uint q, uint i) { return float(int(q << (24u - 8u * i)) >> 24); }
#endif

// u32 word i of the grid at the start of the binding (one 32-bit load where the kernel has the
// binding's u32 view: the grid is 4-byte aligned, the blocks after it need not be)
#ifdef W32
uint FN(grid_word)(uint i) { return W32[i]; }
#else
uint FN(grid_word)(uint i) { return uint(W16[2u * i]) | (uint(W16[2u * i + 1u]) << 16); }
#endif

// group g (0..31) of the block at u16 word w: its scale, and its 8 signed grid values as int8
// bytes (weights 8g .. 8g+3 in lo, 8g+4 .. 8g+7 in hi)
float FN(iq_group)(uint w, uint g, out uint lo, out uint hi) {
#if defined(WTYPE_IQ3_XXS)
    uint ib = g >> 2, l = g & 3u;
    uint idx = uint(W16[w + 1u + 4u * ib + l]);
    uint ss = uint(W16[w + 33u + 2u * ib]) | (uint(W16[w + 34u + 2u * ib]) << 16);
    uint sg = iq_ksigns((ss >> (7u * l)) & 127u);
    lo = iq_signed(FN(grid_word)(idx & 255u), sg);
    hi = iq_signed(FN(grid_word)(idx >> 8), sg >> 4);
    return half_lo(W16[w]) * (0.5 + float(ss >> 28)) * 0.5;
#elif defined(WTYPE_IQ3_S)
    uint q = uint(W16[w + 1u + g]);
    uint qh = FN(byte)(2u * w + 66u + (g >> 2)) >> (2u * (g & 3u));
    uint sg = FN(byte)(2u * w + 74u + g);
    uint ib = g >> 2;
    uint sc = (FN(byte)(2u * w + 106u + (ib >> 1)) >> (4u * (ib & 1u))) & 15u;
    lo = iq_signed(FN(grid_word)((q & 255u) | ((qh & 1u) << 8)), sg);
    hi = iq_signed(FN(grid_word)((q >> 8) | ((qh & 2u) << 7)), sg >> 4);
    return half_lo(W16[w]) * float(1u + 2u * sc);
#else
#if defined(WTYPE_IQ2_XS)
    uint q = uint(W16[w + 1u + g]);
    uint i = q & 511u, sg = iq_ksigns(q >> 9);
    uint sb = 66u;
#else
    uint i = FN(byte)(2u * w + 2u + g) | (((FN(byte)(2u * w + 66u + (g >> 2)) >> (2u * (g & 3u))) & 3u) << 8);
    uint sg = FN(byte)(2u * w + 34u + g);
    uint sb = 74u;
#endif
    uint sc = (FN(byte)(2u * w + sb + (g >> 2)) >> (4u * ((g >> 1) & 1u))) & 15u;
    lo = iq_signed(FN(grid_word)(2u * i), sg);
    hi = iq_signed(FN(grid_word)(2u * i + 1u), sg >> 4);
    return half_lo(W16[w]) * (0.5 + float(sc)) * 0.25;
#endif
}
#endif
