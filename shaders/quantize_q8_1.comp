#version 450
// f32 vector -> q8_1 blocks for the int8 dot-product matvec: per 32 values,
// 8 words of packed int8 (q = round(x / d), d = max|x| / 127), then f32 d and f32 d * sum(q).
#include "include/common.glsl"

layout(local_size_x_id = 0) in;       // WG must be 32: one thread per value of a block
layout(constant_id = 0) const uint WG = 32;

PUSH_CONSTANTS

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Q { uint q[]; };

shared float amax_s[32];
shared int qv[32];

void main() {
    uint blk = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint t = gl_LocalInvocationID.x;
    if (blk * 32u >= pc.n) return;
    uint i = blk * 32u + t;
    float v = i < pc.n ? x[pc.x_off + i] : 0.0;
    amax_s[t] = abs(v);
    barrier();
    [[unroll]] for (uint s = 16u; s > 0u; s >>= 1) {
        if (t < s) amax_s[t] = max(amax_s[t], amax_s[t + s]);
        barrier();
    }
    float amax = amax_s[0];
    float d = amax / 127.0;
    int qi = d > 0.0 ? int(round(v / d)) : 0;
    qv[t] = qi;
    barrier();
    if (t < 8u) {
        uint w = (uint(qv[4u * t]) & 0xFFu) | ((uint(qv[4u * t + 1u]) & 0xFFu) << 8)
               | ((uint(qv[4u * t + 2u]) & 0xFFu) << 16) | ((uint(qv[4u * t + 3u]) & 0xFFu) << 24);
        q[blk * 10u + t] = w;
    } else if (t == 8u) {
        int s = 0;
        for (uint k = 0u; k < 32u; k++) s += qv[k];
        q[blk * 10u + 8u] = floatBitsToUint(d);
        q[blk * 10u + 9u] = floatBitsToUint(d * float(s));
    }
}
