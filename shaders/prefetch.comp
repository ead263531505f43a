#version 450
// L2 prefetch for decode: reads a weight range (16-byte vectors, grid-stride, 4 loads in flight
// per invocation) and discards it, so a matvec recorded after the next barrier finds its first
// bytes in the cache. Recorded without a barrier beside a latency-bound kernel (RoPE, attention,
// a norm), whose interval otherwise leaves DRAM idle; a few workgroups, so that kernel keeps the
// rest of the GPU. Only worth it where the cache holds megabytes (the autotuner decides).
// The loads feed an XOR that is written only if it equals pc.magic, so no compiler may drop them.
#include "include/common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

PUSH_CONSTANTS

layout(binding = 0) readonly buffer W { uvec4 w[]; };
layout(binding = 1) writeonly buffer S { uint sink[]; };

void main() {
    const uint stride = gl_NumWorkGroups.x * WG;
    const uint n4 = pc.n / (4u * stride) * (4u * stride);
    uvec4 acc = uvec4(0u);
    uint i = gl_GlobalInvocationID.x;
    for (; i < n4; i += 4u * stride)
        acc ^= w[i] ^ w[i + stride] ^ w[i + 2u * stride] ^ w[i + 3u * stride];
    for (; i < pc.n; i += stride) acc ^= w[i];
    const uint h = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (h == pc.magic) sink[gl_GlobalInvocationID.x & 63u] = h;
}
