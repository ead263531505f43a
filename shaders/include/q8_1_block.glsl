// One q8_1 block (the int8 matvec's activation format, ggml's block_q8_1 with f32 scales):
// 32 values -> words 0..7: int8 q = round(v / d) packed 4 per word (lowest byte first),
// word 8: d = max|v| / 127 (f32 bits), word 9: d * sum(q) (f32 bits; the Q4_0/Q5_0 dots use it
// for their -8 / -16 offsets). Every kernel that writes q8_1 blocks (quantize_q8_1.comp, the
// norms, attention, the GEGLU matvec) and the matvec that quantizes in registers go through this
// one function, so their blocks are bit-identical (max and the integer sum are exact in any order).
#ifndef Q8_1_BLOCK_GLSL
#define Q8_1_BLOCK_GLSL

#define Q8_1_WORDS 10u     // 40 bytes per block (matvec.q8_1_bytes)

void q8_1_encode(float v[32], out uint words[10]) {
    float amax = 0.0;
    [[unroll]] for (uint k = 0u; k < 32u; k++) amax = max(amax, abs(v[k]));
    const float d = amax / 127.0;
    int sum = 0;
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        uint w = 0u;
        [[unroll]] for (uint k = 0u; k < 4u; k++) {
            const int qi = d > 0.0 ? int(round(v[4u * j + k] / d)) : 0;
            sum += qi;
            w |= (uint(qi) & 0xFFu) << (8u * k);
        }
        words[j] = w;
    }
    words[8] = floatBitsToUint(d);
    words[9] = floatBitsToUint(d * float(sum));
}

// The includer's buffer `Q8_1_OUT` (uint[]) gets the block at index `block`.
#ifdef Q8_1_OUT
void q8_1_store(float v[32], uint block) {
    uint words[10];
    q8_1_encode(v, words);
    [[unroll]] for (uint k = 0u; k < Q8_1_WORDS; k++) Q8_1_OUT[block * Q8_1_WORDS + k] = words[k];
}
#endif
#endif
