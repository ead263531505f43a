// The 16 non-linear levels of IQ4_NL / IQ4_XS (ggml-common.h kvalues_iq4nl): a weight is
// d * IQ4_KV[nibble] (IQ4_XS: d * (6-bit sub-block scale - 32) * IQ4_KV[nibble]).
#ifndef IQ4_VALUES_GLSL
#define IQ4_VALUES_GLSL
const float IQ4_KV[16] = float[16](-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
                                    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
// the same as int8 bytes, for building packed int8 words of the dot-product path
const uint IQ4_KB[16] = uint[16](0x81u, 0x98u, 0xADu, 0xBFu, 0xCFu, 0xDDu, 0xEAu, 0xF6u,
                                 0x01u, 0x0Du, 0x19u, 0x26u, 0x35u, 0x45u, 0x59u, 0x71u);
// 4 nibbles (bits 0..3 of each byte of q) -> 4 int8 levels packed the same way
uint iq4_bytes(uint q) {
    return IQ4_KB[q & 15u] | (IQ4_KB[(q >> 8) & 15u] << 8) | (IQ4_KB[(q >> 16) & 15u] << 16)
         | (IQ4_KB[(q >> 24) & 15u] << 24);
}
#endif
