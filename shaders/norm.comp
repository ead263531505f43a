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

void main() {
    const uint n = pc.n;
    const uint base = gl_WorkGroupID.x * n;
    const uint tid = gl_LocalInvocationID.x;

    float ss = 0.0;
    for (uint i = tid; i < n; i += WG) { float v = x[base + i]; ss += v * v; }
    float inv = inversesqrt(wg_sum(ss) / float(n) + pc.eps);
#ifdef NORM_ADD
    float ss2 = 0.0;
    for (uint i = tid; i < n; i += WG) {
        float r = res[base + i] + x[base + i] * inv * w0[i];
        res[base + i] = r;
        ss2 += r * r;
    }
    float inv2 = inversesqrt(wg_sum(ss2) / float(n) + pc.eps);
    // each invocation re-reads only what it wrote itself: no barrier needed
    for (uint i = tid; i < n; i += WG) outp[base + i] = res[base + i] * inv2 * w1[i];
#else
    for (uint i = tid; i < n; i += WG) outp[base + i] = x[base + i] * inv * w0[i];
#endif
}
