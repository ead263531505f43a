#version 450
// RMSNorm over rows of f32, Gemma style: y = x / sqrt(mean(x^2) + eps) * w, where w is already
// the (1 + weight) multiplier. One workgroup per row; everything in f32 (Gemma 3 overflows f16).
//
// Variants (-D):
//   (none)    norm_f32:     out = rmsnorm(x) * w
//   NORM_ADD  norm_add_f32: residual += rmsnorm(x) * w_post;  out = rmsnorm(residual) * w_next
//             Fuses Gemma's sandwich norm (post-attention / post-feedforward norm), the residual
//             add and the next pre-norm (pre-feedforward / next input_layernorm / final norm)
//             into one dispatch.
// Bindings (norm_f32):      0 x, 1 w, 2 out
// Bindings (norm_add_f32):  0 x, 1 w_post, 2 residual (read-write), 3 w_next, 4 out
// Push: n (row length), eps.   Dispatch: (rows, 1, 1).
#extension GL_GOOGLE_include_directive : require
#include "include/wg_reduce.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

PUSH_CONSTANTS

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W0 { float w0[]; };
#ifdef NORM_ADD
layout(std430, binding = 2) buffer R { float res[]; };
layout(std430, binding = 3) readonly buffer W1 { float w1[]; };
layout(std430, binding = 4) writeonly buffer O { float outp[]; };
#else
layout(std430, binding = 2) writeonly buffer O { float outp[]; };
#endif

// Loops touch 4 elements per step so 4 loads are in flight (a plain strided loop waits one
// memory latency per element: 2x slower for n = 5376 on an H100).
void main() {
    const uint n = pc.n;
    const uint base = gl_WorkGroupID.x * n;
    const uint tid = gl_LocalInvocationID.x;
    const uint n4 = n / (4 * WG) * (4 * WG);

    float ss = 0.0;
    for (uint i = tid; i < n4; i += 4 * WG) {
        const vec4 v = vec4(x[base + i], x[base + i + WG], x[base + i + 2 * WG], x[base + i + 3 * WG]);
        ss += dot(v, v);
    }
    for (uint i = n4 + tid; i < n; i += WG) { const float v = x[base + i]; ss += v * v; }
    const float inv = inversesqrt(wg_sum(ss) / float(n) + pc.eps);
#ifdef NORM_ADD
    float ss2 = 0.0;
    for (uint i = tid; i < n4; i += 4 * WG) {
        const uvec4 k = uvec4(i, i + WG, i + 2 * WG, i + 3 * WG);
        const vec4 r = vec4(res[base + k.x], res[base + k.y], res[base + k.z], res[base + k.w])
                     + vec4(x[base + k.x], x[base + k.y], x[base + k.z], x[base + k.w]) * inv
                     * vec4(w0[k.x], w0[k.y], w0[k.z], w0[k.w]);
        res[base + k.x] = r.x; res[base + k.y] = r.y; res[base + k.z] = r.z; res[base + k.w] = r.w;
        ss2 += dot(r, r);
    }
    for (uint i = n4 + tid; i < n; i += WG) {
        const float r = res[base + i] + x[base + i] * inv * w0[i];
        res[base + i] = r;
        ss2 += r * r;
    }
    const float inv2 = inversesqrt(wg_sum(ss2) / float(n) + pc.eps);
    // each invocation re-reads only what it wrote itself: no barrier needed
    for (uint i = tid; i < n4; i += 4 * WG) {
        const uvec4 k = uvec4(i, i + WG, i + 2 * WG, i + 3 * WG);
        const vec4 r = vec4(res[base + k.x], res[base + k.y], res[base + k.z], res[base + k.w]) * inv2
                     * vec4(w1[k.x], w1[k.y], w1[k.z], w1[k.w]);
        outp[base + k.x] = r.x; outp[base + k.y] = r.y; outp[base + k.z] = r.z; outp[base + k.w] = r.w;
    }
    for (uint i = n4 + tid; i < n; i += WG) outp[base + i] = res[base + i] * inv2 * w1[i];
#else
    for (uint i = tid; i < n4; i += 4 * WG) {
        const uvec4 k = uvec4(i, i + WG, i + 2 * WG, i + 3 * WG);
        const vec4 r = vec4(x[base + k.x], x[base + k.y], x[base + k.z], x[base + k.w]) * inv
                     * vec4(w0[k.x], w0[k.y], w0[k.z], w0[k.w]);
        outp[base + k.x] = r.x; outp[base + k.y] = r.y; outp[base + k.z] = r.z; outp[base + k.w] = r.w;
    }
    for (uint i = n4 + tid; i < n; i += WG) outp[base + i] = x[base + i] * inv * w0[i];
#endif
}
