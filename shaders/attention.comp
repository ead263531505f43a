#version 450
// Decode attention for one query position, split-K over the KV cache (flash-decoding).
//
// ATTN_SPLIT  (attention_split_f16_f32): workgroup (s, kv head) scores its share of the
//   positions against the G = n_heads / n_kv_heads query heads of that kv head (GQA: each K/V
//   row is read once for all G heads), with an online softmax, and writes per query head and
//   split the unnormalized output o[D], its running max m and sum l.
//   Bindings: 0 step, 1 q (f32, [n_heads][D] at q_offset, already normed/rotated),
//             2 K cache, 3 V cache ([n_kv_heads][cache_slots][D] f16), 4 partial (f32 scratch,
//             n_heads * n_splits * (D + 2) floats).   Dispatch: (n_splits, n_kv_heads, 1).
// ATTN_REDUCE (attention_reduce_f32): combines the splits of one query head.
//   Bindings: 0 partial, 1 out (f32 [n_heads][D]).   Dispatch: (n_heads, 1, 1).
//
// The query sits at position p = step.pos; it sees positions [lo, p] with lo = p - window + 1
// on sliding-window layers (window > 0), else 0; position j lives in slot j % cache_slots.
// The split count is fixed at record time; each split takes ceil(n / n_splits) positions of the
// n visible at run time (empty splits write m = -1e30, l = 0).
// scores = (q . k) * scale, scale = 1/sqrt(query_pre_attn_scalar); f32 softmax and accumulation.
// Limits: head_dim a multiple of 8, head_dim <= 2 * WG, head_dim <= DMAX, G <= GMAX.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;

#define GMAX 8
#define DMAX 256

PUSH_CONSTANTS

#ifdef ATTN_SPLIT
#include "include/step.glsl"
STEP_BUFFER(0)
#include "include/wg_reduce.glsl"

layout(std430, binding = 1) readonly buffer Q { float q[]; };
layout(std430, binding = 2) readonly buffer KC { uvec4 kc[]; };
layout(std430, binding = 3) readonly buffer VC { uint vc[]; };
layout(std430, binding = 4) writeonly buffer P { float part[]; };

shared float qs[GMAX * DMAX];
shared float sc[GMAX * WG];
shared float red[GMAX * WG_REDUCE_MAX_SUBGROUPS];

// max (is_max) or sum over the workgroup of v[g] for every g < GMAX at once: 2 barriers total
void wg_reduce_g(inout float v[GMAX], bool is_max) {
    for (uint g = 0; g < GMAX; g++) {
        float r = is_max ? subgroupMax(v[g]) : subgroupAdd(v[g]);
        if (subgroupElect()) red[g * WG_REDUCE_MAX_SUBGROUPS + gl_SubgroupID] = r;
    }
    barrier();
    for (uint g = 0; g < GMAX; g++) {
        float r = red[g * WG_REDUCE_MAX_SUBGROUPS];
        for (uint i = 1; i < gl_NumSubgroups; i++) {
            float x = red[g * WG_REDUCE_MAX_SUBGROUPS + i];
            r = is_max ? max(r, x) : r + x;
        }
        v[g] = r;
    }
    barrier();
}

void main() {
    const uint D = pc.head_dim;
    const uint s = gl_WorkGroupID.x, kh = gl_WorkGroupID.y;
    const uint tid = gl_LocalInvocationID.x;
    const uint G = pc.n_heads / pc.n_kv_heads;
    const uint pos = step.pos;
    const uint lo = (pc.window > 0 && pos + 1 > pc.window) ? pos + 1 - pc.window : 0;
    const uint n = pos + 1 - lo;
    const uint chunk = (n + pc.n_splits - 1) / pc.n_splits;
    const uint begin = min(lo + s * chunk, pos + 1);
    const uint end = min(begin + chunk, pos + 1);
    const uint slots = pc.cache_slots;

    for (uint i = tid; i < G * D; i += WG)
        qs[(i / D) * DMAX + i % D] = q[pc.q_offset + kh * G * D + i] * pc.scale;
    barrier();

    // P.V mapping: a thread owns one column pair c (one uint of halves) of a row group rg
    const uint ncol = D / 2;
    const uint RG = WG / ncol;
    const uint c = tid % ncol, rg = tid / ncol;
    vec2 acc[GMAX];
    float m[GMAX], l[GMAX];
    for (uint g = 0; g < GMAX; g++) { acc[g] = vec2(0.0); m[g] = -1e30; l[g] = 0.0; }

    for (uint blk = begin; blk < end; blk += WG) {
        const uint nb = min(WG, end - blk);
        float sg[GMAX];
        for (uint g = 0; g < GMAX; g++) sg[g] = -1e30;
        if (tid < nb) {
            const uint row = (kh * slots + (blk + tid) % slots) * (D / 8);
            for (uint g = 0; g < GMAX; g++) sg[g] = 0.0;
            for (uint d8 = 0; d8 < D / 8; d8++) {
                uvec4 w = kc[row + d8];
                vec2 k0 = unpackHalf2x16(w.x), k1 = unpackHalf2x16(w.y);
                vec2 k2 = unpackHalf2x16(w.z), k3 = unpackHalf2x16(w.w);
                for (uint g = 0; g < GMAX; g++) {
                    if (g < G) {
                        const uint qb = g * DMAX + d8 * 8;
                        sg[g] += qs[qb] * k0.x + qs[qb + 1] * k0.y + qs[qb + 2] * k1.x + qs[qb + 3] * k1.y
                               + qs[qb + 4] * k2.x + qs[qb + 5] * k2.y + qs[qb + 6] * k3.x + qs[qb + 7] * k3.y;
                    }
                }
            }
        }
        float bm[GMAX];
        for (uint g = 0; g < GMAX; g++) bm[g] = sg[g];
        wg_reduce_g(bm, true);
        float ps[GMAX];
        for (uint g = 0; g < GMAX; g++) {
            const float mn = max(m[g], bm[g]);
            const float alpha = exp(m[g] - mn);
            m[g] = mn;
            l[g] *= alpha;
            acc[g] *= alpha;
            const float p = tid < nb ? exp(sg[g] - mn) : 0.0;
            sc[g * WG + tid] = p;
            ps[g] = p;
        }
        wg_reduce_g(ps, false);          // its barriers also publish sc
        for (uint g = 0; g < GMAX; g++) l[g] += ps[g];
        if (rg < RG) {
            for (uint j = rg; j < nb; j += RG) {
                const vec2 vv = unpackHalf2x16(vc[(kh * slots + (blk + j) % slots) * ncol + c]);
                for (uint g = 0; g < GMAX; g++) if (g < G) acc[g] += sc[g * WG + j] * vv;
            }
        }
        barrier();                       // sc is rewritten by the next block
    }

    // sum the row groups' partial outputs (reusing qs), then write o, m, l
    for (uint r = 0; r < RG; r++) {
        if (rg == r) {
            for (uint g = 0; g < GMAX; g++) {
                if (g < G) {
                    vec2 prev = r == 0 ? vec2(0.0) : vec2(qs[g * DMAX + 2 * c], qs[g * DMAX + 2 * c + 1]);
                    qs[g * DMAX + 2 * c] = prev.x + acc[g].x;
                    qs[g * DMAX + 2 * c + 1] = prev.y + acc[g].y;
                }
            }
        }
        barrier();
    }
    for (uint i = tid; i < G * D; i += WG) {
        const uint g = i / D, d = i % D;
        part[((kh * G + g) * pc.n_splits + s) * (D + 2) + d] = qs[g * DMAX + d];
    }
    if (tid < G) {
        for (uint g = 0; g < GMAX; g++) {
            if (g == tid) {
                const uint b = ((kh * G + g) * pc.n_splits + s) * (D + 2) + D;
                part[b] = m[g];
                part[b + 1] = l[g];
            }
        }
    }
}
#endif

#ifdef ATTN_REDUCE
layout(std430, binding = 0) readonly buffer P { float part[]; };
layout(std430, binding = 1) writeonly buffer O { float outp[]; };

void main() {
    const uint D = pc.head_dim, S = pc.n_splits;
    const uint h = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    const uint base = h * S * (D + 2);
    float M = -1e30;
    for (uint s = 0; s < S; s++) M = max(M, part[base + s * (D + 2) + D]);
    float L = 0.0;
    for (uint s = 0; s < S; s++) L += part[base + s * (D + 2) + D + 1] * exp(part[base + s * (D + 2) + D] - M);
    const float invL = 1.0 / L;
    for (uint d = tid; d < D; d += WG) {
        float o = 0.0;
        for (uint s = 0; s < S; s++) {
            const uint b = base + s * (D + 2);
            o += part[b + d] * exp(part[b + D] - M);
        }
        outp[h * D + d] = o * invL;
    }
}
#endif
