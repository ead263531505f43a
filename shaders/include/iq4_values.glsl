// The 16 non-linear levels of IQ4_NL / IQ4_XS (ggml-common.h kvalues_iq4nl): a weight is
// d * level[nibble] (IQ4_XS: d * (6-bit sub-block scale - 32) * level[nibble]).
//
// The levels live in a uvec4 of packed int8 bytes and are picked by a vector component select,
// not read from a `const` array: a dynamically indexed const array becomes a per-invocation
// private array, which NVIDIA's compiler writes to local memory on every call — the IQ4_XS
// matvec ran 17x slower than Q4_0 on an H100 (27B decode 10.7 tok/s against 112) with it.
#ifndef IQ4_VALUES_GLSL
#define IQ4_VALUES_GLSL
// bytes of -127, -104, -83, -65 | -49, -35, -22, -10 | 1, 13, 25, 38 | 53, 69, 89, 113
const uvec4 IQ4_PACKED = uvec4(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);

// the int8 level of nibble q (bits above 3 ignored), as a byte 0..255
uint iq4_kb(uint q) {
    const uint w = (q & 8u) != 0u ? ((q & 4u) != 0u ? IQ4_PACKED.w : IQ4_PACKED.z)
                                  : ((q & 4u) != 0u ? IQ4_PACKED.y : IQ4_PACKED.x);
    return (w >> ((q & 3u) * 8u)) & 0xFFu;
}

// the level of nibble q as a float
float iq4_kv(uint q) { return float(int(iq4_kb(q) << 24u) >> 24); }

// 4 nibbles (bits 0..3 of each byte of q) -> 4 int8 levels packed the same way
uint iq4_bytes(uint q) {
    return iq4_kb(q) | (iq4_kb(q >> 8) << 8) | (iq4_kb(q >> 16) << 16) | (iq4_kb(q >> 24) << 24);
}
#endif
