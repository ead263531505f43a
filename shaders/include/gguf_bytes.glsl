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
