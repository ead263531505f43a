#version 450
// Per-head QK RMSNorm + NEOX RoPE (rotate-half, as HF Gemma), fused with the f16 KV-cache write.
//
// One workgroup per (head, token): heads [0, n_heads) are query heads, normalized and rotated
// in place (f32); heads [n_heads, n_heads + n_kv_heads) are KV heads: K is normalized, rotated
// and stored as f16 in the K cache, V is copied as f16 into the V cache.
// Token t of this step sits at position p = step.pos + t; tokens t >= step.n_tokens do nothing,
// so a prefill recorded for C tokens can be replayed with fewer.
//
// The head maths lives in include/rope_head.glsl (shared with matvec.comp's rope epilogue).
// Cache slots: global layers use cache_slots >= context length; local (sliding-window) layers
// use a ring of cache_slots >= window + prefill chunk, so a chunk never overwrites keys its
// own earlier tokens still need.
// Bindings: 0 step, 1 q (f32, read-write), 2 k (f32), 3 v (f32), 4 q_norm w, 5 k_norm w,
//           6 k cache, 7 v cache.
// Dispatch: (n_heads + n_kv_heads, tokens recorded, 1).
// STEP_ROWS (rope_f32_f16_rows, a batched decode step): workgroup (head, row): row r is one
// sequence's token at its own position and slot (step = the row's Step); q/k/v of row r at
// offset + r * stride; a row with n_tokens 0 (a pad row) does nothing.
#extension GL_GOOGLE_include_directive : require
#ifdef STEP_ROWS
#define STEP_ROW gl_WorkGroupID.y
#endif
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

#define ROPE_Q q
#define ROPE_K k
#define ROPE_V v
#define ROPE_QW qw
#define ROPE_KW kw
#define ROPE_KC kc
#define ROPE_VC vc
#include "include/rope_head.glsl"

void main() {
    const uint t = gl_WorkGroupID.y;
#ifdef STEP_ROWS
    if (step.n_tokens == 0u) return;              // a pad row
    const uint pos = step.pos;
#else
    if (t >= step.n_tokens) return;               // uniform over the workgroup
    const uint pos = step.pos + t;
#endif
    const uint D = pc.head_dim;
    const uint h = gl_WorkGroupID.x;
    if (h < pc.n_heads) {
        rope_q_head(pc.q_offset + t * pc.q_stride + h * D, pos);
    } else {
        const uint kh = h - pc.n_heads;
        rope_k_head(pc.k_offset + t * pc.kv_stride + kh * D, kh, pos);
        copy_v_head(pc.v_offset + t * pc.kv_stride + kh * D, kh, pos);
    }
}
