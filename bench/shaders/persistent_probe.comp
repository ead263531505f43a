#version 450
// Probe for `python -m bench.persistent_chain`: would one persistent dispatch per token (a
// "megakernel") reach the bandwidth a chain of dependent dispatches cannot? A layer is 8
// dependent phases, as in a 27B decode step: four weight streams (QKV, o, gate/up, down: uvec4
// weights dotted with an activation) each followed by a small norm-like phase (every workgroup
// reads the activation row, reduces it, writes its slice of the next one).
// PERSIST 0: one dispatch per phase (push `phase`), a pipeline barrier between (the engine's way);
//   with NORM_IN_STREAM each stream's workgroups compute the norm themselves from the whole row
//   (redundant, ~21 KB read each) and write the next row, and the host records no small phases.
// PERSIST 1: one dispatch runs every phase of `layers` layers; workgroups meet at a grid barrier
//   (an arrival counter in memory) between phases, and issue their next stream's first PRE weight
//   loads before waiting, since weights do not depend on the activation.
// PERSIST 2: as 1, with the norm in every workgroup: one grid barrier per stream instead of two.
// PERSIST 1 and 2 need every workgroup resident at once, which Vulkan does not promise: the host
// keeps the grid at a few workgroups per SM, and a spin limit ends a wait that would never end
// (the timing is then meaningless and the probe says so). A timing probe, not an engine kernel.
#include "../../shaders/include/common.glsl"
#include "../../shaders/include/wg_reduce.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 512;
layout(constant_id = 1) const uint PERSIST = 0;
layout(constant_id = 2) const uint PRE = 4;
layout(constant_id = 3) const uint NORM_IN_STREAM = 0;
const uint SPIN_LIMIT = 1u << 20;

PUSH_CONSTANTS

layout(binding = 0) readonly buffer W0 { uvec4 w_qkv[]; };
layout(binding = 1) readonly buffer W1 { uvec4 w_o[]; };
layout(binding = 2) readonly buffer W2 { uvec4 w_gu[]; };
layout(binding = 3) readonly buffer W3 { uvec4 w_down[]; };
layout(binding = 4) coherent buffer V { float v[]; };          // two activation rows of m, ping-pong
layout(binding = 5) volatile coherent buffer F { uint flag[]; };   // [0] arrivals, [1] timed-out waits
layout(binding = 6) writeonly buffer O { float o[]; };

uint stream_len(uint s) {
    return s == 0 ? pc.n_qkv : s == 1 ? pc.n_o : s == 2 ? pc.n_gu : pc.n_down;
}

float dot4(uvec4 q, float x) { return dot(vec4(q & 15u), vec4(x)); }

// Stream s of layer l, one function per weight buffer so the loop has no branch on s. PREFETCH
// issues this invocation's first PRE loads (early, in PERSIST 1); STREAM dots the rest.
#define STREAM_FNS(S, BUF)                                                                     \
void PASTE(prefetch, S)(uint l, out uvec4 first[PRE]) {                                       \
    const uint n = stream_len(S), base = l * n, stride = gl_NumWorkGroups.x * WG;            \
    [[unroll]] for (uint k = 0; k < PRE; ++k) {                                               \
        const uint j = gl_GlobalInvocationID.x + k * stride;                                  \
        first[k] = j < n ? BUF[base + j] : uvec4(0);                                          \
    }                                                                                         \
}                                                                                             \
float PASTE(stream, S)(uint l, float x, uvec4 first[PRE]) {                                   \
    const uint n = stream_len(S), base = l * n, stride = gl_NumWorkGroups.x * WG;            \
    float acc = 0.0;                                                                          \
    [[unroll]] for (uint k = 0; k < PRE; ++k) acc += dot4(first[k], x);                       \
    uint j = gl_GlobalInvocationID.x + PRE * stride;                                          \
    for (; j + 3 * stride < n; j += 4 * stride) {                                             \
        const uvec4 a = BUF[base + j], b = BUF[base + j + stride];                            \
        const uvec4 c = BUF[base + j + 2 * stride], d = BUF[base + j + 3 * stride];           \
        acc += dot4(a, x) + dot4(b, x) + dot4(c, x) + dot4(d, x);                             \
    }                                                                                         \
    for (; j < n; j += stride) acc += dot4(BUF[base + j], x);                                 \
    return acc;                                                                               \
}
STREAM_FNS(0, w_qkv)
STREAM_FNS(1, w_o)
STREAM_FNS(2, w_gu)
STREAM_FNS(3, w_down)

void prefetch(uint s, uint l, out uvec4 first[PRE]) {
    if (s == 0) prefetch0(l, first);
    else if (s == 1) prefetch1(l, first);
    else if (s == 2) prefetch2(l, first);
    else prefetch3(l, first);
}

float stream(uint s, uint l, float x, uvec4 first[PRE]) {
    if (s == 0) return stream0(l, x, first);
    if (s == 1) return stream1(l, x, first);
    if (s == 2) return stream2(l, x, first);
    return stream3(l, x, first);
}

float row_x(uint row) { return v[row * pc.m + gl_LocalInvocationIndex % pc.m]; }

// Norm-like: every workgroup reads row `src`, reduces it, writes its slice of the other row.
void small(uint src) {
    float ss = 0.0;
    for (uint i = gl_LocalInvocationIndex; i < pc.m; i += WG) {
        const float a = v[src * pc.m + i];
        ss += a * a;
    }
    const float scale = inversesqrt(wg_sum(ss) / float(pc.m) + 1e-6);
    for (uint i = gl_GlobalInvocationID.x; i < pc.m; i += gl_NumWorkGroups.x * WG)
        v[(src ^ 1u) * pc.m + i] = v[src * pc.m + i] * scale + 1e-3;
}

// The norm of row `src` that every workgroup computes for itself (PERSIST 2): its x, with no
// grid barrier between the norm and the stream that uses it.
float norm_x(uint src) {
    float ss = 0.0;
    for (uint i = gl_LocalInvocationIndex; i < pc.m; i += WG) {
        const float a = v[src * pc.m + i];
        ss += a * a;
    }
    return row_x(src) * inversesqrt(wg_sum(ss) / float(pc.m) + 1e-6) + 1e-3;
}

// Wait until every workgroup has arrived. After a wait that timed out (flag[1] != 0) the rest
// of the dispatch stops waiting, so a grid that cannot be resident at once ends in seconds.
void grid_sync(inout uint epoch) {
    epoch += gl_NumWorkGroups.x;
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0) {
        atomicAdd(flag[0], 1u);
        uint spins = 0;
        while (flag[0] < epoch && flag[1] == 0u && ++spins < SPIN_LIMIT) {}
        if (spins == SPIN_LIMIT) atomicAdd(flag[1], 1u);
    }
    barrier();
    memoryBarrierBuffer();
}

void main() {
    uvec4 first[PRE];
    if (PERSIST == 0) {             // one phase: 2k = stream k, 2k+1 = the small phase after it
        const uint l = pc.phase / 8, p = pc.phase % 8;
        const uint src = (p / 2) & 1u;
        if (p % 2 == 0) {
            prefetch(p / 2, l, first);
            const float acc = stream(p / 2, l, NORM_IN_STREAM != 0 ? norm_x(src) : row_x(src), first);
            o[gl_GlobalInvocationID.x] = acc;
            if (NORM_IN_STREAM != 0 && gl_GlobalInvocationID.x < pc.m)
                v[(src ^ 1u) * pc.m + gl_GlobalInvocationID.x] = acc;
        } else {
            small(src);
        }
        return;
    }
    uint epoch = 0;
    for (uint l = 0; l < pc.layers; ++l) {
        [[dont_unroll]] for (uint s = 0; s < 4; ++s) {
            const uint src = s & 1u;
            prefetch(s, l, first);
            if (l + s > 0) grid_sync(epoch);          // the previous phase's row is complete
            if (PERSIST == 1) {                       // stream, barrier, small phase
                o[gl_GlobalInvocationID.x] = stream(s, l, row_x(src), first);
                grid_sync(epoch);
                small(src);
            } else {                                  // norm in every workgroup, stream writes the next row
                const float acc = stream(s, l, norm_x(src), first);
                o[gl_GlobalInvocationID.x] = acc;
                if (gl_GlobalInvocationID.x < pc.m) v[(src ^ 1u) * pc.m + gl_GlobalInvocationID.x] = acc;
            }
        }
    }
}
