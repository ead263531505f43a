#version 450
// Embedding lookup: out[t] = dequant(table[tokens[step.pos + t]]) * scale, f32, for
// t < step.n_tokens. The ids come from the token buffer (step.glsl): the previous step's sampled
// id when decoding, the prompt ids the host wrote when prefilling. Rows t >= step.n_tokens of
// the recorded count are zeroed (by the first range's dispatch): a prefill run in a bigger
// recording (a bucket) carries finite pad rows, the same on every run, through the layers.
// scale = sqrt(hidden), rounded through the model dtype by the host.
//
// A table larger than maxStorageBufferRange is bound in row ranges (memory.Tensor.ranges):
// record one dispatch per range; each writes only the tokens whose id falls in
// [row_start, row_start + rows), so the dispatches never conflict (no barrier between them).
// The range is read through 16-bit loads: GGUF blocks (34 B for Q8_0, 18 B for Q4_0) are only
// 2-byte aligned and a range's size need not be a multiple of 4 (a 32-bit view would lose its
// last bytes).
//
// -D: WTYPE_F32 / F16 / BF16 / Q8_0 / Q4_0 (below), every other block type (Q4_1, Q5_0, Q5_1,
// IQ4_NL, IQ4_XS, Q2_K .. Q6_K) through include/gemm_dequant.glsl (256-weight types need
// hidden % 256 == 0).
// Bindings: 0 step, 1 tokens (u32), 2 table range, 3 out (f32 [tokens][hidden]).
// Push: hidden, row_start, rows, row_bytes, scale.   Dispatch: (tokens recorded, 1, 1).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

PUSH_CONSTANTS

#extension GL_GOOGLE_include_directive : require
#include "include/common.glsl"
#include "include/step.glsl"
STEP_BUFFER(0)
layout(std430, binding = 1) readonly buffer Tok { uint tokens[]; };
layout(std430, binding = 2) readonly buffer T { uint16_t tw[]; };
layout(std430, binding = 3) writeonly buffer O { float outp[]; };

uint u16_at(uint b) { return uint(tw[b >> 1]); }   // b even
uint byte_at(uint b) { return (u16_at(b & ~1u) >> ((b & 1u) * 8u)) & 0xFFu; }
float f16_at(uint b) { return unpackHalf2x16(u16_at(b)).x; }
int i8_at(uint b) { return int(byte_at(b) << 24) >> 24; }

#if !defined(WTYPE_F32) && !defined(WTYPE_F16) && !defined(WTYPE_BF16) && !defined(WTYPE_Q8_0) && !defined(WTYPE_Q4_0)
#define W16 tw
#define FN(n) PASTE(n, _t)
#include "include/gemm_dequant.glsl"
#define EMBED_VIA_GEMM_DEQUANT
#endif

float element(uint rb, uint e) {
#if defined(EMBED_VIA_GEMM_DEQUANT)
    return w_at_t(rb / pc.row_bytes, e, pc.hidden);
#elif defined(WTYPE_F32)
    return uintBitsToFloat(u16_at(rb + 4u * e) | (u16_at(rb + 4u * e + 2u) << 16));
#elif defined(WTYPE_F16)
    return f16_at(rb + 2u * e);
#elif defined(WTYPE_BF16)
    return uintBitsToFloat(u16_at(rb + 2u * e) << 16);
#elif defined(WTYPE_Q8_0)
    const uint b = rb + (e / 32u) * 34u;
    return f16_at(b) * float(i8_at(b + 2u + e % 32u));
#elif defined(WTYPE_Q4_0)
    const uint b = rb + (e / 32u) * 18u, j = e % 32u;
    const uint qb = byte_at(b + 2u + (j & 15u));
    return f16_at(b) * float(int(j < 16u ? (qb & 15u) : (qb >> 4)) - 8);
#else
#error "embed.comp: define one WTYPE_*"
#endif
}

void main() {
    const uint t = gl_WorkGroupID.x;
    if (t >= step.n_tokens) {
        if (pc.row_start == 0u)
            for (uint e = gl_LocalInvocationID.x; e < pc.hidden; e += WG) outp[t * pc.hidden + e] = 0.0;
        return;
    }
    const uint id = tokens[step.tok_base + step.pos + t];
    if (id < pc.row_start || id - pc.row_start >= pc.rows) return;   // another range has it
    const uint rb = (id - pc.row_start) * pc.row_bytes;
    uint e = gl_LocalInvocationID.x;
    for (; e + 3 * WG < pc.hidden; e += 4 * WG) {   // 4 independent lookups in flight
        const vec4 v = vec4(element(rb, e), element(rb, e + WG), element(rb, e + 2 * WG), element(rb, e + 3 * WG));
        for (uint u = 0; u < 4; u++) outp[t * pc.hidden + e + u * WG] = v[u] * pc.scale;
    }
    for (; e < pc.hidden; e += WG) outp[t * pc.hidden + e] = element(rb, e) * pc.scale;
}
