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
// ATTN_REDUCE (attention_reduce_f32): combines the used splits of one query head (WG >= head_dim).
//   Bindings: 0 step, 1 partial, 2 out (f32 [n_heads][D]).   Dispatch: (n_heads, 1, 1).
//
// The query sits at position p = step.pos; it sees positions [lo, p] with lo = p - window + 1
// on sliding-window layers (window > 0), else 0; position j lives in slot j % cache_slots.
// The split count is fixed at record time; each split takes max(ceil(n / n_splits), MIN_CHUNK = 16)
// positions of the n visible at run time, so a short context uses few splits (the unused ones
// write m = -1e30, l = 0 and the reduce pass skips them).
// scores = (q . k) * scale, scale = 1/sqrt(query_pre_attn_scalar); f32 softmax and accumulation.
// head_dim (HD) and the GQA group size G = n_heads / n_kv_heads are specialization constants, so
// every inner loop has a constant trip count; loads are batched 4 at a time (with a run-time
// head_dim the K-row loads were issued one latency at a time: 3-10x slower on an H100).
// Limits: HD a multiple of 64, HD <= 2 * WG, WG / (HD / 2) a divisor of WG / 4, G <= 8,
// n_splits <= 256.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint HD = 256;     // head_dim
layout(constant_id = 2) const uint G = 1;        // query heads per kv head
PUSH_CONSTANTS

#define MIN_CHUNK 16u   // balances the split pass (serial over its chunk) against the reduce (serial over splits)

// positions [lo, pos] visible from the query at step.pos, split in chunks of `chunk`
void visible(uint pos, out uint lo, out uint n, out uint chunk) {
    lo = (pc.window > 0 && pos + 1 > pc.window) ? pos + 1 - pc.window : 0;
    n = pos + 1 - lo;
    chunk = max((n + pc.n_splits - 1) / pc.n_splits, MIN_CHUNK);
}


#ifdef ATTN_SPLIT
#include "include/step.glsl"
STEP_BUFFER(0)
#include "include/wg_reduce.glsl"

layout(std430, binding = 1) readonly buffer Q { float q[]; };
layout(std430, binding = 2) readonly buffer KC { uvec4 kc[]; };
layout(std430, binding = 3) readonly buffer VC { uint vc[]; };
layout(std430, binding = 4) writeonly buffer P { float part[]; };

shared vec4 qs[G * HD / 4];
shared float sc[G * WG];
shared float red[G * WG_REDUCE_MAX_SUBGROUPS];

// max (is_max) or sum over the workgroup of v[g] for every g < G at once: 2 barriers total
void wg_reduce_g(inout float v[G], bool is_max) {
    [[unroll]] for (uint g = 0; g < G; g++) {
        float r = is_max ? subgroupMax(v[g]) : subgroupAdd(v[g]);
        if (subgroupElect()) red[g * WG_REDUCE_MAX_SUBGROUPS + gl_SubgroupID] = r;
    }
    barrier();
    [[unroll]] for (uint g = 0; g < G; g++) {
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
    const uint s = gl_WorkGroupID.x, kh = gl_WorkGroupID.y;
    const uint tid = gl_LocalInvocationID.x;
    const uint pos = step.pos;
    uint lo, n, chunk;
    visible(pos, lo, n, chunk);
    const uint begin = min(lo + s * chunk, pos + 1);
    const uint end = min(begin + chunk, pos + 1);
    const uint slots = pc.cache_slots;

    for (uint i = tid; i < G * HD / 4; i += WG) {
        const uint b = pc.q_offset + kh * G * HD + 4 * i;
        qs[i] = vec4(q[b], q[b + 1], q[b + 2], q[b + 3]) * pc.scale;
    }
    barrier();

    // P.V mapping: a thread owns one column pair c (one uint of halves) of a row group rg
    const uint NCOL = HD / 2;
    const uint RG = WG / NCOL;
    const uint c = tid % NCOL, rg = tid / NCOL;
    vec2 acc[G];
    float m[G], l[G];
    [[unroll]] for (uint g = 0; g < G; g++) { acc[g] = vec2(0.0); m[g] = -1e30; l[g] = 0.0; }

    for (uint blk = begin; blk < end; blk += WG) {
        const uint nb = min(WG, end - blk);
        float sg[G];
        [[unroll]] for (uint g = 0; g < G; g++) sg[g] = -1e30;
        if (tid < nb) {
            const uint row = (kh * slots + (blk + tid) % slots) * (HD / 8);
            [[unroll]] for (uint g = 0; g < G; g++) sg[g] = 0.0;
            // 8 row loads in flight per step; not fully unrolled (lavapipe's LLVM compile time explodes)
            for (uint d8 = 0; d8 < HD / 8; d8 += 8) {
                uvec4 w[8];
                [[unroll]] for (uint u = 0; u < 8; u++) w[u] = kc[row + d8 + u];
                [[unroll]] for (uint u = 0; u < 8; u++) {
                    const vec4 ka = vec4(unpackHalf2x16(w[u].x), unpackHalf2x16(w[u].y));
                    const vec4 kb = vec4(unpackHalf2x16(w[u].z), unpackHalf2x16(w[u].w));
                    [[unroll]] for (uint g = 0; g < G; g++)
                        sg[g] += dot(qs[(g * HD) / 4 + 2 * (d8 + u)], ka) + dot(qs[(g * HD) / 4 + 2 * (d8 + u) + 1], kb);
                }
            }
        }
        float bm[G];
        [[unroll]] for (uint g = 0; g < G; g++) bm[g] = sg[g];
        wg_reduce_g(bm, true);
        float ps[G];
        [[unroll]] for (uint g = 0; g < G; g++) {
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
        [[unroll]] for (uint g = 0; g < G; g++) l[g] += ps[g];
        if (rg < RG) {
            const uint base = kh * slots;
            for (uint jj = 0; jj < WG / RG; jj += 4) {
                if (rg + jj * RG >= nb) break;
                vec2 vv[4];
                [[unroll]] for (uint u = 0; u < 4; u++) {
                    const uint j = rg + (jj + u) * RG;
                    vv[u] = j < nb ? unpackHalf2x16(vc[(base + (blk + j) % slots) * NCOL + c]) : vec2(0.0);
                }
                [[unroll]] for (uint u = 0; u < 4; u++) {
                    const uint j = rg + (jj + u) * RG;
                    [[unroll]] for (uint g = 0; g < G; g++) acc[g] += sc[g * WG + min(j, WG - 1)] * vv[u];
                }
            }
        }
        barrier();                       // sc is rewritten by the next block
    }

    // sum the row groups' partial outputs in shared memory (qs is free now), then write o, m, l
    for (uint r = 0; r < RG; r++) {
        if (rg == r) {
            [[unroll]] for (uint g = 0; g < G; g++) {
                const uint i = g * HD + 2 * c;
                vec2 prev = r == 0 ? vec2(0.0) : vec2(qs[i / 4][i % 4], qs[i / 4][i % 4 + 1]);
                qs[i / 4][i % 4] = prev.x + acc[g].x;
                qs[i / 4][i % 4 + 1] = prev.y + acc[g].y;
            }
        }
        barrier();
    }
    for (uint i = tid; i < G * HD; i += WG) {
        const uint g = i / HD, d = i % HD;
        part[((kh * G + g) * pc.n_splits + s) * (HD + 2) + d] = qs[i / 4][i % 4];
    }
    if (tid == 0) {
        [[unroll]] for (uint g = 0; g < G; g++) {
            const uint b = ((kh * G + g) * pc.n_splits + s) * (HD + 2) + HD;
            part[b] = m[g];
            part[b + 1] = l[g];
        }
    }
}
#endif

#ifdef ATTN_REDUCE
#define SMAX 256
#include "include/step.glsl"
STEP_BUFFER(0)
layout(std430, binding = 1) readonly buffer P { float part[]; };
layout(std430, binding = 2) writeonly buffer O { float outp[]; };
shared float w_sh[SMAX];
shared float red_sh[WG];

void main() {
    uint lo, n, chunk;
    visible(step.pos, lo, n, chunk);
    const uint S = (n + chunk - 1) / chunk;      // splits that hold positions
    const uint h = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    const uint base = h * pc.n_splits * (HD + 2);
    // stats of every split in parallel, then weights exp(m_s - M) / L in shared memory
    for (uint s = tid; s < S; s += WG) w_sh[s] = part[base + s * (HD + 2) + HD];
    barrier();
    float M = -1e30;
    for (uint s = 0; s < S; s++) M = max(M, w_sh[s]);
    barrier();
    for (uint s = tid; s < S; s += WG) w_sh[s] = exp(w_sh[s] - M);
    barrier();
    float L = 0.0;
    for (uint s = tid; s < S; s += WG) L += part[base + s * (HD + 2) + HD + 1] * w_sh[s];
    red_sh[tid] = L;
    barrier();
    L = 0.0;
    for (uint i = 0; i < WG; i++) L += red_sh[i];
    const float invL = 1.0 / L;
    barrier();                           // red_sh is reused below
    // threads: HD columns x (WG / HD) groups of splits; loads unrolled by 4 for memory parallelism
    const uint SG = WG / HD;             // WG >= HD (the wrapper checks)
    const uint sg = tid / HD, d = tid % HD;
    red_sh[tid] = 0.0;
    if (sg < SG) {
        float o0 = 0.0, o1 = 0.0, o2 = 0.0, o3 = 0.0;
        uint s = sg;
        for (; s + 3 * SG < S; s += 4 * SG) {
            const float a0 = part[base + s * (HD + 2) + d];
            const float a1 = part[base + (s + SG) * (HD + 2) + d];
            const float a2 = part[base + (s + 2 * SG) * (HD + 2) + d];
            const float a3 = part[base + (s + 3 * SG) * (HD + 2) + d];
            o0 += a0 * w_sh[s]; o1 += a1 * w_sh[s + SG]; o2 += a2 * w_sh[s + 2 * SG]; o3 += a3 * w_sh[s + 3 * SG];
        }
        for (; s < S; s += SG) o0 += part[base + s * (HD + 2) + d] * w_sh[s];
        red_sh[tid] = (o0 + o1) + (o2 + o3);
    }
    barrier();
    if (tid < HD) {
        float o = 0.0;
        for (uint k = 0; k < SG; k++) o += red_sh[k * HD + tid];
        outp[h * HD + tid] = o * invL;
    }
}
#endif
