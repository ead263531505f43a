#version 450
// Probe for `python -m bench.dispatch_cost --handoff`: can a weight stream start while the small
// kernel it depends on still runs, if it waits on a flag in memory instead of behind a pipeline
// barrier? ROLE 0 ("producer", a norm-sized job): v[m + i] = f(v[i]); each workgroup then counts
// itself in flag[0]. ROLE 1 ("consumer", a matvec-sized stream of uvec4 weights): issues its first
// PRE weight loads, then (WAIT 1) one invocation spins until flag[0] == pc.producers, and the
// workgroup reads v and streams the rest; the last consumer workgroup puts both flags back to 0.
// The spin assumes every producer workgroup is issued before any consumer one, which Vulkan does
// not promise (the engine version of this gave wrong results on an H100: docs/PERFORMANCE.md):
// this is a timing probe, not an engine kernel.
#include "../../shaders/include/common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint ROLE = 0;
layout(constant_id = 2) const uint WAIT = 0;
const uint PRE = 4;

PUSH_CONSTANTS

layout(binding = 0) readonly buffer W { uvec4 w[]; };
layout(binding = 1) coherent buffer V { float v[]; };
layout(binding = 2) volatile coherent buffer F { uint flag[]; };
layout(binding = 3) writeonly buffer O { float o[]; };

void produce() {
    for (uint i = gl_GlobalInvocationID.x; i < pc.m; i += gl_NumWorkGroups.x * WG) {
        float x = v[i];
        for (uint r = 0; r < pc.reps; ++r) x = x * 0.999 + 0.001;   // a dependent chain: latency
        v[pc.m + i] = x;
    }
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0) atomicAdd(flag[0], 1u);
}

void consume() {
    const uint stride = gl_NumWorkGroups.x * WG;
    const uint i0 = gl_GlobalInvocationID.x;
    uvec4 first[PRE];
    [[unroll]] for (uint k = 0; k < PRE; ++k) {
        const uint j = i0 + k * stride;
        first[k] = j < pc.n ? w[j] : uvec4(0);
    }
    if (WAIT != 0) {
        if (gl_LocalInvocationIndex == 0) {
            while (flag[0] < pc.producers) {}
        }
        barrier();
        memoryBarrierBuffer();
    }
    const float x = v[pc.m + gl_LocalInvocationIndex % pc.m];
    float acc = 0.0;
    [[unroll]] for (uint k = 0; k < PRE; ++k) acc += dot(vec4(first[k] & 15u), vec4(x));
    for (uint j = i0 + PRE * stride; j < pc.n; j += stride) acc += dot(vec4(w[j] & 15u), vec4(x));
    o[i0] = acc;
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0) {
        const bool last = atomicAdd(flag[1], 1u) == gl_NumWorkGroups.x - 1u;
        if (last) {
            flag[1] = 0u;
            flag[0] = 0u;
        }
    }
}

void main() {
    if (ROLE == 0) produce();
    else consume();
}
