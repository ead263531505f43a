#version 450
// Weights re-quantized on the device at load time (`--quant`): source values (f32, f16 or bf16,
// as the file stores them, or f32 the host dequantized from another quantized type) -> GGUF
// blocks of the target type, bit-identical to gguf-py's quantizer (= ggml-quants.c's reference
// rounding), so the device holds what a converted file would hold. Why on the device: gguf-py's
// numpy quantizer runs at ~50-100 M weights/s, minutes for a 27B BF16 checkpoint.
//
// -D OUT_Q8_0: one invocation per 32-value block {f16 d = amax / 127; i8 round(v / d)}   34 B
// -D OUT_Q4_0: one invocation per block {f16 d = m / -8 (m: the value of largest |v|, first
//              if tied); u8 nibbles trunc(v / d + 8.5) clipped to 15, v[j] | v[j + 16] << 4}  18 B
// -D OUT_Q4_1: one invocation per block {f16 d = (max - min) / 15, f16 m = min; u8 nibbles
//              trunc((v - min) / d + 0.5) clipped to 15, v[j] | v[j + 16] << 4}               20 B
// -D OUT_Q5_1: the same with d = (max - min) / 31, q clipped to 31: {f16 d, f16 m, u32 qh (bit j:
//              q[j] >> 4), u8 low nibbles q[j] & 15 | (q[j + 16] & 15) << 4}                    24 B
//              max and min are the first of equal values (ggml's `v < min` scan; numpy's reduction
//              may pick the other zero of a block holding both +0 and -0: only the sign of a zero
//              d or m can differ then, and the values decode the same)
// -D OUT_F16:  one invocation per value (f32 -> f16 rounded to nearest even, overflow -> inf)
// Exactness: divisions are done in integers (div_rn);
// products and sums are `precise` (no fma contraction), in loops left rolled: glslc -O's unroller
// turned the unrolled copies into fused Fma (one rounding instead of two), which the H100 ran
// fused (tests/vulkan/test_ops_quantize_weights.py checks the SPIR-V); f32 -> f16 in integer bits.
// Bindings: 0 source values (read as f32 or 16-bit), 1 destination (16-bit words).
// Push: n (values), src_kind (0 f32, 1 f16, 2 bf16), dst_off (16-bit words).
// Dispatch: ceil(n / 32 / WG) workgroups (block types), ceil(n / WG) (F16), 2-D over 65535.
#include "include/common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

PUSH_CONSTANTS

layout(binding = 0) readonly buffer SF { float src_f[]; };
layout(binding = 0) readonly buffer SH { uint16_t src_h[]; };
layout(binding = 1) writeonly buffer D { uint16_t dst[]; };

float source(uint i) {
    if (pc.src_kind == 0u) return src_f[i];
    if (pc.src_kind == 1u) return half_lo(src_h[i]);
    return bf16(src_h[i]);
}

// f32 -> f16 bits, round to nearest even (numpy's astype(float16)); overflow -> inf.
uint f16_bits(float f) {
    const uint x = floatBitsToUint(f);
    const uint sign = (x >> 16) & 0x8000u;
    const uint e = (x >> 23) & 0xFFu;
    const uint m = x & 0x7FFFFFu;
    if (e == 0xFFu) return sign | 0x7C00u | (m != 0u ? 0x200u : 0u);
    const int he = int(e) - 112;                       // f16 exponent field
    if (he >= 31) return sign | 0x7C00u;
    if (he <= 0) {                                     // f16 subnormal (or zero)
        if (he < -10) return sign;
        const uint mf = m | 0x800000u;
        const uint shift = uint(14 - he);
        uint q = mf >> shift;
        const uint rem = mf & ((1u << shift) - 1u), half_ulp = 1u << (shift - 1u);
        if (rem > half_ulp || (rem == half_ulp && (q & 1u) != 0u)) q++;
        return sign | q;
    }
    uint q = (uint(he) << 10) | (m >> 13);
    const uint rem = m & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u) != 0u)) q++;   // a carry into the exponent is right
    return sign | q;
}

// a / b rounded to nearest even, by integer long division of the significands: exact on any
// device (Vulkan allows a division 2.5 ulp off, and fma() may round twice, as on lavapipe).
// For normal a, b and a normal quotient; anything else (never a weight block's scale) takes
// the device's division.
float div_rn(float a, float b) {
    const uint ua = floatBitsToUint(a), ub = floatBitsToUint(b);
    const uint ea = (ua >> 23) & 0xFFu, eb = (ub >> 23) & 0xFFu;
    if (ea == 0u || eb == 0u || ea == 0xFFu || eb == 0xFFu) return a / b;
    uint ma = (ua & 0x7FFFFFu) | 0x800000u;
    const uint mb = (ub & 0x7FFFFFu) | 0x800000u;
    int e = int(ea) - int(eb) + 127;               // biased exponent of a quotient in [1, 2)
    if (ma < mb) { ma <<= 1; e -= 1; }             // mb <= ma < 2 mb
    uint q = 0u, rem = ma;
    for (uint i = 0u; i < 25u; i++) {              // 24 significand bits, then the guard bit
        q <<= 1;
        if (rem >= mb) { rem -= mb; q |= 1u; }
        rem <<= 1;
    }
    const bool guard = (q & 1u) != 0u, sticky = rem != 0u;
    q >>= 1;
    if (guard && (sticky || (q & 1u) != 0u)) q++;
    if (q == 0x1000000u) { q >>= 1; e += 1; }
    if (e <= 0 || e >= 255) return a / b;
    return uintBitsToFloat(((ua ^ ub) & 0x80000000u) | (uint(e) << 23) | (q & 0x7FFFFFu));
}

// round half away from zero, as gguf-py's np_roundf (exact steps only)
float round_away(float v) {
    const float a = abs(v);
    const float fl = floor(a);
    return sign(v) * (fl + floor(2.0 * (a - fl)));
}

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * WG + gl_LocalInvocationID.x;
#if defined(OUT_F16)
    if (i >= pc.n) return;
    dst[pc.dst_off + i] = uint16_t(f16_bits(source(i)));
#else
    if (i * 32u >= pc.n) return;
    float v[32];
    [[unroll]] for (uint k = 0u; k < 32u; k++) v[k] = source(32u * i + k);
#if defined(OUT_Q8_0)
    float amax = 0.0;
    [[unroll]] for (uint k = 0u; k < 32u; k++) amax = max(amax, abs(v[k]));
    const float d = div_rn(amax, 127.0);
    const float id = d == 0.0 ? 0.0 : div_rn(1.0, d);
    const uint base = pc.dst_off + 17u * i;
    dst[base] = uint16_t(f16_bits(d));
    for (uint k = 0u; k < 16u; k++) {
        precise float a = v[2u * k] * id;
        precise float b = v[2u * k + 1u] * id;
        const uint lo = uint(int(round_away(a))) & 0xFFu, hi = uint(int(round_away(b))) & 0xFFu;
        dst[base + 1u + k] = uint16_t(lo | (hi << 8));
    }
#elif defined(OUT_Q4_0)
    float amax = abs(v[0]), m = v[0];                 // the first of equal |v|, as argmax takes
    [[unroll]] for (uint k = 1u; k < 32u; k++) {
        if (abs(v[k]) > amax) { amax = abs(v[k]); m = v[k]; }
    }
    const float d = m * -0.125;                        // m / -8, exact
    const float id = d == 0.0 ? 0.0 : div_rn(1.0, d);
    uint q[32];
    for (uint k = 0u; k < 32u; k++) {
        precise float t = v[k] * id;
        precise float u = t + 8.5;
        q[k] = min(uint(trunc(u)), 15u);
    }
    const uint base = pc.dst_off + 9u * i;
    dst[base] = uint16_t(f16_bits(d));
    [[unroll]] for (uint k = 0u; k < 8u; k++) {
        const uint b0 = q[2u * k] | (q[2u * k + 16u] << 4), b1 = q[2u * k + 1u] | (q[2u * k + 17u] << 4);
        dst[base + 1u + k] = uint16_t(b0 | (b1 << 8));
    }
#elif defined(OUT_Q4_1) || defined(OUT_Q5_1)
#if defined(OUT_Q4_1)
    const float levels = 15.0;
    const uint qmax = 15u;
#else
    const float levels = 31.0;
    const uint qmax = 31u;
#endif
    // indices, not values, are selected: a compiler may turn `v < mn ? v : mn` into fmin, whose
    // choice between +0 and -0 is the device's
    uint imn = 0u, imx = 0u;
    for (uint k = 1u; k < 32u; k++) {
        if (v[k] < v[imn]) imn = k;
        if (v[k] > v[imx]) imx = k;
    }
    const float mn = v[imn];
    precise float range = v[imx] - mn;
    const float d = div_rn(range, levels);
    const float id = d == 0.0 ? 0.0 : div_rn(1.0, d);
    uint q[32];
    for (uint k = 0u; k < 32u; k++) {
        precise float t = v[k] - mn;
        precise float s = t * id;
        precise float u = s + 0.5;
        q[k] = u >= 0.0 ? min(uint(trunc(u)), qmax) : 0u;   // NaN (inf range: inf * 0) -> 0, as numpy's cast
    }
#if defined(OUT_Q4_1)
    const uint base = pc.dst_off + 10u * i;
    const uint qs_at = base + 2u;
#else
    const uint base = pc.dst_off + 12u * i;
    const uint qs_at = base + 4u;
    uint qh = 0u;
    [[unroll]] for (uint k = 0u; k < 32u; k++) qh |= (q[k] >> 4) << k;
    dst[base + 2u] = uint16_t(qh & 0xFFFFu);
    dst[base + 3u] = uint16_t(qh >> 16);
#endif
    dst[base] = uint16_t(f16_bits(d));
    dst[base + 1u] = uint16_t(f16_bits(mn));
    [[unroll]] for (uint k = 0u; k < 8u; k++) {
        const uint b0 = (q[2u * k] & 15u) | ((q[2u * k + 16u] & 15u) << 4);
        const uint b1 = (q[2u * k + 1u] & 15u) | ((q[2u * k + 17u] & 15u) << 4);
        dst[qs_at + k] = uint16_t(b0 | (b1 << 8));
    }
#endif
#endif
}
