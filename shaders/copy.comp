#version 450
// Bandwidth probe for the benchmark: dst = src in 16-byte vectors, grid-stride loop.
// (vkCmdCopyBuffer may run on a copy engine slower than the shader cores: not a roofline.)
#include "include/common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

PUSH_CONSTANTS

layout(binding = 0) readonly buffer S { uvec4 src[]; };
layout(binding = 1) writeonly buffer D { uvec4 dst[]; };

void main() {
    uint stride = gl_NumWorkGroups.x * WG;
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) dst[i] = src[i];
}
