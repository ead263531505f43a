#version 450
// f32 vector -> q8_1 blocks for the int8 dot-product matvec (format: include/q8_1_block.glsl).
// One invocation per block of 32 values (vec4 loads); the last block is zero-padded.
#include "include/common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 32;

PUSH_CONSTANTS

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Q { uint q[]; };
#define Q8_1_OUT q
#include "include/q8_1_block.glsl"

void main() {
    const uint blk = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * WG + gl_LocalInvocationID.x;
    if (blk * 32u >= pc.n) return;
    float v[32];
    [[unroll]] for (uint k = 0u; k < 32u; k++) {
        const uint i = blk * 32u + k;
        v[k] = i < pc.n ? x[pc.x_off + i] : 0.0;
    }
    q8_1_store(v, blk);
}
