#version 450
// Per-head QK RMSNorm + NEOX RoPE (rotate-half, as HF Gemma), fused with the f16 KV-cache write.
//
// One workgroup per (head, token): heads [0, n_heads) are query heads, normalized and rotated
// in place (f32); heads [n_heads, n_heads + n_kv_heads) are KV heads: K is normalized, rotated
// and stored as f16 in the K cache, V is copied as f16 into the V cache.
// Token t of this step sits at position p = step.pos + t; tokens t >= step.n_tokens do nothing,
// so a prefill recorded for C tokens can be replayed with fewer.
//
// Cache layout (both K and V): [n_kv_heads][cache_slots][head_dim] f16, two halves per uint.
// Position p goes to slot p % cache_slots: global layers use cache_slots >= context length;
// local (sliding-window) layers use a ring of cache_slots >= window + prefill chunk, so a
// chunk never overwrites keys its own earlier tokens still need.
//
// RoPE: inv_freq_i = theta^(-2i/D) * pos_scale (pos_scale = 1 / linear factor), angle computed
// in f32 as HF does; x[i], x[i+D/2] rotate by angle_i. head_dim must be a multiple of 4.
// Bindings: 0 step, 1 q (f32, read-write), 2 k (f32), 3 v (f32), 4 q_norm w, 5 k_norm w,
//           6 k cache, 7 v cache.
// Dispatch: (n_heads + n_kv_heads, tokens recorded, 1).
#extension GL_GOOGLE_include_directive : require
#include "include/step.glsl"
STEP_BUFFER(0)
#include "include/wg_reduce.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

PUSH_CONSTANTS

layout(std430, binding = 1) buffer Q { float q[]; };
layout(std430, binding = 2) readonly buffer K { float k[]; };
layout(std430, binding = 3) readonly buffer V { float v[]; };
layout(std430, binding = 4) readonly buffer QW { float qw[]; };
layout(std430, binding = 5) readonly buffer KW { float kw[]; };
layout(std430, binding = 6) writeonly buffer KC { uint kc[]; };
layout(std430, binding = 7) writeonly buffer VC { uint vc[]; };

const float TWO_PI_HI = 6.28125;                 // 8 significant bits: k * HI is exact
const float TWO_PI_LO = 1.9353071795864769e-3;   // 2*pi - TWO_PI_HI

// sin/cos are only specified on [-pi, pi]: reduce first (Cody-Waite, two constants).
vec2 cos_sin(float a) {
    float kk = round(a * 0.15915494309189535);
    float r = (a - kk * TWO_PI_HI) - kk * TWO_PI_LO;
    return vec2(cos(r), sin(r));
}

void main() {
    const uint t = gl_WorkGroupID.y;
    if (t >= step.n_tokens) return;               // uniform over the workgroup
    const uint D = pc.head_dim, half_d = D / 2, quarter = D / 4;
    const uint h = gl_WorkGroupID.x;
    const uint tid = gl_LocalInvocationID.x;
    const uint pos = step.pos + t;
    const bool is_q = h < pc.n_heads;
    const uint kh = h - pc.n_heads;
    const uint src = is_q ? pc.q_offset + t * pc.q_stride + h * D
                          : pc.k_offset + t * pc.kv_stride + kh * D;

    float ss = 0.0;
    for (uint j = tid; j < quarter; j += WG) {
        vec2 a = is_q ? vec2(q[src + 2*j], q[src + 2*j + 1]) : vec2(k[src + 2*j], k[src + 2*j + 1]);
        vec2 b = is_q ? vec2(q[src + half_d + 2*j], q[src + half_d + 2*j + 1])
                      : vec2(k[src + half_d + 2*j], k[src + half_d + 2*j + 1]);
        ss += dot(a, a) + dot(b, b);
    }
    const float inv = inversesqrt(wg_sum(ss) / float(D) + pc.eps);
    const uint cache_row = (kh * pc.cache_slots + pos % pc.cache_slots) * D;   // in halves

    for (uint j = tid; j < quarter; j += WG) {
        const uint i0 = 2*j, i1 = 2*j + 1;
        vec2 a, b, wa, wb;
        if (is_q) {
            a = vec2(q[src + i0], q[src + i1]);
            b = vec2(q[src + half_d + i0], q[src + half_d + i1]);
            wa = vec2(qw[i0], qw[i1]);
            wb = vec2(qw[half_d + i0], qw[half_d + i1]);
        } else {
            a = vec2(k[src + i0], k[src + i1]);
            b = vec2(k[src + half_d + i0], k[src + half_d + i1]);
            wa = vec2(kw[i0], kw[i1]);
            wb = vec2(kw[half_d + i0], kw[half_d + i1]);
        }
        a *= inv * wa;
        b *= inv * wb;
        // inv_freq in f32 like HF: 1 / theta^(2i/D), then the linear scaling, then * pos
        vec2 f = vec2(1.0 / pow(pc.theta, float(2*i0) / float(D)),
                      1.0 / pow(pc.theta, float(2*i1) / float(D))) * pc.pos_scale;
        vec2 cs0 = cos_sin(float(pos) * f.x), cs1 = cos_sin(float(pos) * f.y);
        vec2 c = vec2(cs0.x, cs1.x), s = vec2(cs0.y, cs1.y);
        vec2 ra = a * c - b * s;
        vec2 rb = b * c + a * s;
        if (is_q) {
            q[src + i0] = ra.x; q[src + i1] = ra.y;
            q[src + half_d + i0] = rb.x; q[src + half_d + i1] = rb.y;
        } else {
            kc[(cache_row + i0) / 2] = packHalf2x16(ra);
            kc[(cache_row + half_d + i0) / 2] = packHalf2x16(rb);
            const uint vs = pc.v_offset + t * pc.kv_stride + kh * D;
            vc[(cache_row + i0) / 2] = packHalf2x16(vec2(v[vs + i0], v[vs + i1]));
            vc[(cache_row + half_d + i0) / 2] = packHalf2x16(vec2(v[vs + half_d + i0], v[vs + half_d + i1]));
        }
    }
}
