// Bytes of a GGUF weight block, read through the 16-bit view W16 (every block size is even),
// and the K-quants' packed 6-bit scale / min pairs (ggml's get_scale_min_k4). The one decoder
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
