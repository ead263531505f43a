#version 450
// The SigLIP vision tower's small kernels (engine/backends/vulkan/ops_vision.py), one family,
// the op picked by a define; f32 throughout (no subgroup operations: workgroup reductions in
// shared memory, so no result depends on the subgroup size).
//   VISION_LAYERNORM  y[r] = (x[r] - mean) / sqrt(var + eps) * w + b; one workgroup per row
//                     bindings 0 x, 1 w, 2 b, 3 y (rows of n floats); dispatch (rows, 1, 1)
//   VISION_BIAS       v = y[r][c] + b[c]; mode 0: y = v, 1: y = gelu_tanh(v), 2: aux += v,
//                     3: y = v + aux (the position embedding); bindings 0 y, 1 b, 2 aux
//                     dispatch (ceil(n / WG), rows, 1)
//   VISION_POOL       y[t] = mean of the k x k block of patch rows of token t (a side x side
//                     grid, row-major); bindings 0 x, 1 y; dispatch (ceil(n / WG), tokens, 1)
//   VISION_OVERLAY    x[t] = rows[t] where flags[t] != 0 (a picture's soft tokens replace the
//                     placeholders' embeddings); bindings 0 flags, 1 rows, 2 x
//                     dispatch (ceil(n / WG), tokens, 1)
#extension GL_GOOGLE_include_directive : require
#include "include/common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

PUSH_CONSTANTS

#if defined(VISION_LAYERNORM)
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer B { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
shared float red[WG];

float wg_sum(float v) {
    const uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    const float r = red[0];
    barrier();
    return r;
}

void main() {
    const uint n = pc.n, base = gl_WorkGroupID.x * n, tid = gl_LocalInvocationID.x;
    float s = 0.0;
    for (uint c = tid; c < n; c += WG) s += x[base + c];
    const float mean = wg_sum(s) / float(n);
    float v = 0.0;
    for (uint c = tid; c < n; c += WG) {
        const float d = x[base + c] - mean;
        v += d * d;
    }
    const float inv = 1.0 / sqrt(wg_sum(v) / float(n) + pc.eps);
    for (uint c = tid; c < n; c += WG) y[base + c] = (x[base + c] - mean) * inv * w[c] + bias[c];
}

#elif defined(VISION_BIAS)
layout(std430, binding = 0) buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer B { float bias[]; };
layout(std430, binding = 2) buffer A { float aux[]; };

void main() {
    const uint c = gl_GlobalInvocationID.x, r = gl_WorkGroupID.y;
    if (c >= pc.n) return;
    const uint i = r * pc.n + c;
    const float v = y[i] + bias[c];
    if (pc.mode == 0) y[i] = v;
    else if (pc.mode == 1) y[i] = gelu_tanh(v);
    else if (pc.mode == 2) aux[i] = aux[i] + v;
    else y[i] = v + aux[i];
}

#elif defined(VISION_POOL)
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };

void main() {
    const uint c = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
    if (c >= pc.n) return;
    const uint k = pc.k, ts = pc.side / k, ty = t / ts, tx = t % ts;
    float s = 0.0;
    for (uint dy = 0; dy < k; dy++)
        for (uint dx = 0; dx < k; dx++) s += x[((ty * k + dy) * pc.side + tx * k + dx) * pc.n + c];
    y[t * pc.n + c] = s / float(k * k);
}

#elif defined(VISION_OVERLAY)
layout(std430, binding = 0) readonly buffer F { uint flags[]; };
layout(std430, binding = 1) readonly buffer R { float rows[]; };
layout(std430, binding = 2) buffer X { float x[]; };

void main() {
    const uint c = gl_GlobalInvocationID.x, t = gl_WorkGroupID.y;
    if (c >= pc.n || flags[t] == 0u) return;
    x[t * pc.n + c] = rows[t * pc.n + c];
}
#endif
