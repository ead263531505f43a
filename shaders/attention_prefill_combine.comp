#version 450
// The second half of a split prefill attention (attention_prefill_coopmat.comp with NSPLIT > 1):
// merges the NSPLIT partial records of each (token, head) — O unnormalized, m in log2 units, l —
// into out: with M = max m_z and w_z = 2^(m_z - M), out = sum w_z O_z / sum w_z l_z (0 where
// no key was visible), in split order, so every run gives the same bits.
// Bindings: 0 step (n_tokens), 1 partial records ((t * n_heads + h) * NSPLIT + z, D + 4 floats
// each), 2 out ([tokens][n_heads * head_dim] f32).   Spec: WG, NSPLIT.
// Push: ATTN_COMBINE_PUSH.   Dispatch: (max_tokens, n_heads, 1).
#extension GL_GOOGLE_include_directive : require
#include "include/common.glsl"
#include "include/step.glsl"
STEP_BUFFER(0)

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 1) const uint NSPLIT = 2;

PUSH_CONSTANTS

layout(std430, binding = 1) readonly buffer P { float part[]; };
layout(std430, binding = 2) writeonly buffer O { float outp[]; };

void main() {
    const uint t = gl_WorkGroupID.x, h = gl_WorkGroupID.y, D = pc.head_dim;
    if (t >= step.n_tokens) return;                   // uniform over the workgroup
    const uint rec = D + 4, base = (t * pc.n_heads + h) * NSPLIT * rec;
    float mx = -1e30;
    for (uint z = 0u; z < NSPLIT; z++) mx = max(mx, part[base + z * rec + D]);
    float w[8];                                       // NSPLIT <= 8 (ops_attention.MAX_PREFILL_SPLITS)
    float l = 0.0;
    for (uint z = 0u; z < NSPLIT; z++) {
        w[z] = exp2(part[base + z * rec + D] - mx);
        l += w[z] * part[base + z * rec + D + 1];
    }
    const float inv = l > 0.0 ? 1.0 / l : 0.0;
    for (uint d = gl_LocalInvocationID.x; d < D; d += WG) {
        float o = 0.0;
        for (uint z = 0u; z < NSPLIT; z++) o += w[z] * part[base + z * rec + d];
        outp[t * pc.n_heads * D + h * D + d] = o * inv;
    }
}
