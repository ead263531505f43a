#version 450
// Decode attention for one query position, split-K over the KV cache (flash-decoding), in one
// dispatch (attention_decode_f16_f32).
//
// Workgroup (s, kv head) scores its share of the positions against the G = n_heads / n_kv_heads
// query heads of that kv head (GQA: each K/V row is read once for all G heads), with an online
// softmax, and writes per query head and split the unnormalized output o[D] and its running max
// m and sum l. Then it counts itself in the kv head's arrival counter (include/last_arrival.glsl);
// the last of the n_splits workgroups of that kv head combines the used splits of its G query
// heads (weights exp(m_s - M) / L) and writes the output rows. No second dispatch, no barrier.
//   Bindings: 0 step, 1 q (f32, [n_heads][D] at q_offset, already normed/rotated),
//             2 K cache, 3 V cache ([n_kv_heads][cache_slots][D] f16),
//             4 partial (f32 scratch, n_heads * n_splits records of D + 4 floats: o[D], m, l, -, -),
//             5 arrival counters (uint[n_kv_heads], 0 before and after the dispatch),
//             6 out (f32 [n_heads][D]),
//             7 (ATTN_Q8_1 only: attention_decode_f16_f32_q8_1) out's q8_1 blocks (n_heads * D / 32
//               blocks of 8 packed int8 words, d, d * sum(q)).
//   Dispatch: (n_splits, n_kv_heads, 1).
// STEP_ROWS (attention_decode_f16_f32_rows, a batched decode step): dispatch (n_splits,
// n_kv_heads, rows); row r is one sequence at its own position and slot (step = the row's
// Step), its q at q_offset + r * QROW, its partials, arrival counters and output rows after
// those of rows 0..r-1 (as if its heads were heads r * n_heads.. of one wider query).
// ATTN_Q8_1: the combining workgroup also quantizes the G output rows it wrote (whole blocks:
// D is a multiple of 64) from shared memory, through quantize_q8_1.comp's encoder, so the
// blocks are bit-identical to a quantize dispatch on `out` and an int8 o-proj matvec needs none.
//
// The query sits at position p = step.pos; it sees positions [lo, p] with lo = p - window + 1
// on sliding-window layers (window > 0), else 0; position j lives in slot j % cache_slots.
// The split count is fixed at record time; each split takes max(ceil(n / n_splits), MIN_CHUNK = 16)
// positions of the n visible at run time, so a short context uses few splits (the unused ones
// write m = -1e30, l = 0, still count as arrived, and the reduce skips them).
// scores = (q . k) * scale, scale = 1/sqrt(query_pre_attn_scalar); f32 softmax and accumulation.
// head_dim (HD) and the GQA group size G = n_heads / n_kv_heads are specialization constants, so
// every inner loop has a constant trip count (with a run-time head_dim the K-row loads were
// issued one latency at a time: 3-10x slower on an H100).
// A split is short (16 positions at a 648-position cache), so the kernel is latency-bound: every
// phase is laid out to need one round of memory loads per thread, not one per position. Scores:
// TPP = HD / 32 threads share a K row (4 uvec4 loads each, adjacent lanes on adjacent 16 bytes)
// and add their partial dots through shared memory; P.V: a thread owns 8 columns (one uvec4 of
// halves) of one of RG = WG / (HD / 8) row groups, which meet in shared memory at the end.
// Limits: HD a multiple of 64, HD <= 2 * WG, G <= 8, n_splits <= 256.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint HD = 256;     // head_dim
layout(constant_id = 2) const uint G = 1;        // query heads per kv head
PUSH_CONSTANTS

#define MIN_CHUNK 16u   // balances the split work (serial over its chunk) against the reduce (serial over splits)
#define SMAX 256u       // most splits
#ifndef COMBINE_LOADS
#define COMBINE_LOADS 16u  // partial loads in flight a thread in the combine (a multiple of 4)
#endif

// positions [lo, pos] visible from the query at step.pos, split in chunks of `chunk`
void visible(uint pos, out uint lo, out uint n, out uint chunk) {
    lo = (pc.window > 0 && pos + 1 > pc.window) ? pos + 1 - pc.window : 0;
    n = pos + 1 - lo;
    chunk = max((n + pc.n_splits - 1) / pc.n_splits, MIN_CHUNK);
}

#ifdef STEP_ROWS
#define STEP_ROW gl_WorkGroupID.z
layout(constant_id = 3) const uint QROW = 0;    // floats from one row's q to the next
#define ROW_Q (gl_WorkGroupID.z * QROW)
#define ROW_KV (gl_WorkGroupID.z * pc.n_kv_heads)
#else
#define ROW_Q 0u
#define ROW_KV 0u
#endif
#include "include/step.glsl"
STEP_BUFFER(0)
#include "include/wg_reduce.glsl"

layout(std430, binding = 1) readonly buffer Q { float q[]; };
layout(std430, binding = 2) readonly buffer KC { uvec4 kc[]; };
layout(std430, binding = 3) readonly buffer VC { uvec4 vc[]; };
// coherent: the last workgroup reads the other workgroups' partials in the same dispatch
layout(std430, binding = 4) coherent buffer P { vec4 part[]; };
#define ARRIVAL_BINDING 5
#include "include/last_arrival.glsl"
layout(std430, binding = 6) writeonly buffer O { vec4 outp[]; };
#ifdef ATTN_Q8_1
layout(std430, binding = 7) writeonly buffer OQ { uint oq[]; };
#define Q8_1_OUT oq
#include "include/q8_1_block.glsl"
#endif

const uint REC = HD / 4 + 1;   // vec4s per (query head, split) record: o[HD], then (m, l, 0, 0)

shared vec4 qs[G * HD / 4];
shared float sc[G * WG];       // per block: scores, then softmax weights, by position
shared float lanes[G * WG];    // lanes' partial dots of one scoring pass
shared float red[G * WG_REDUCE_MAX_SUBGROUPS];
shared float wsh[G * SMAX];    // reduce: weight exp(m_s - M) of every used split
shared vec4 osum[WG];          // reduce: partial output sums of the split groups

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
    const uint kx = ROW_KV + kh;   // this row's kv head among every row's: partials, counter, output
    const uint tid = gl_LocalInvocationID.x;
    const uint pos = step.pos;
    uint lo, n, chunk;
    visible(pos, lo, n, chunk);
    const uint begin = min(lo + s * chunk, pos + 1);
    const uint end = min(begin + chunk, pos + 1);
    const uint slots = pc.cache_slots;
    const uint kvh = step.slot * pc.n_kv_heads + kh;   // this sequence's kv head kh among every slot's

    for (uint i = tid; i < G * HD / 4; i += WG) {
        const uint b = pc.q_offset + ROW_Q + kh * G * HD + 4 * i;
        qs[i] = vec4(q[b], q[b + 1], q[b + 2], q[b + 3]) * pc.scale;
    }
    barrier();

    // scoring: TPP threads per K row, PPP rows per pass
    const uint TPP = HD / 32, PPP = WG / TPP;
    const uint lane = tid % TPP, pr = tid / TPP;
    // P.V: a thread owns 8 columns (uvec4 c8 of a V row) of row group rg
    const uint NC8 = HD / 8;
    const uint RG = WG / NC8;
    const uint c8 = tid % NC8, rg = tid / NC8;
    vec4 acc[G][2];
    float m[G], l[G];
    [[unroll]] for (uint g = 0; g < G; g++) { acc[g][0] = vec4(0.0); acc[g][1] = vec4(0.0); m[g] = -1e30; l[g] = 0.0; }

    for (uint blk = begin; blk < end; blk += WG) {
        const uint nb = min(WG, end - blk);
        for (uint p0 = 0; p0 < nb; p0 += PPP) {
            float d[G];
            [[unroll]] for (uint g = 0; g < G; g++) d[g] = 0.0;
            if (pr < PPP && p0 + pr < nb) {
                const uint row = (kvh * slots + (blk + p0 + pr) % slots) * (HD / 8);
                uvec4 w[4];
                [[unroll]] for (uint u = 0; u < 4; u++) w[u] = kc[row + lane + u * TPP];
                [[unroll]] for (uint u = 0; u < 4; u++) {
                    const uint i8 = lane + u * TPP;     // this uvec4 holds dims 8 * i8 .. 8 * i8 + 7
                    const vec4 ka = vec4(unpackHalf2x16(w[u].x), unpackHalf2x16(w[u].y));
                    const vec4 kb = vec4(unpackHalf2x16(w[u].z), unpackHalf2x16(w[u].w));
                    [[unroll]] for (uint g = 0; g < G; g++)
                        d[g] += dot(qs[(g * HD) / 4 + 2 * i8], ka) + dot(qs[(g * HD) / 4 + 2 * i8 + 1], kb);
                }
            }
            [[unroll]] for (uint g = 0; g < G; g++) lanes[g * WG + tid] = d[g];
            barrier();
            if (tid < PPP && p0 + tid < nb) {
                [[unroll]] for (uint g = 0; g < G; g++) {
                    float t = 0.0;
                    [[unroll]] for (uint k = 0; k < TPP; k++) t += lanes[g * WG + tid * TPP + k];
                    sc[g * WG + p0 + tid] = t;
                }
            }
            barrier();                   // lanes is rewritten by the next pass; sc is complete
        }
        float sg[G];
        [[unroll]] for (uint g = 0; g < G; g++) sg[g] = tid < nb ? sc[g * WG + tid] : -1e30;
        float bm[G];
        [[unroll]] for (uint g = 0; g < G; g++) bm[g] = sg[g];
        wg_reduce_g(bm, true);
        float ps[G];
        [[unroll]] for (uint g = 0; g < G; g++) {
            const float mn = max(m[g], bm[g]);
            const float alpha = exp(m[g] - mn);
            m[g] = mn;
            l[g] *= alpha;
            acc[g][0] *= alpha;
            acc[g][1] *= alpha;
            const float p = tid < nb ? exp(sg[g] - mn) : 0.0;
            sc[g * WG + tid] = p;
            ps[g] = p;
        }
        wg_reduce_g(ps, false);          // its barriers also publish sc
        [[unroll]] for (uint g = 0; g < G; g++) l[g] += ps[g];
        if (rg < RG) {
            const uint base = kvh * slots;
            for (uint j0 = rg; j0 < nb; j0 += 4 * RG) {
                uvec4 vv[4];
                [[unroll]] for (uint u = 0; u < 4; u++) {
                    const uint j = j0 + u * RG;
                    vv[u] = j < nb ? vc[(base + (blk + j) % slots) * NC8 + c8] : uvec4(0);
                }
                [[unroll]] for (uint u = 0; u < 4; u++) {
                    const vec4 va = vec4(unpackHalf2x16(vv[u].x), unpackHalf2x16(vv[u].y));
                    const vec4 vb = vec4(unpackHalf2x16(vv[u].z), unpackHalf2x16(vv[u].w));
                    const uint j = min(j0 + u * RG, WG - 1);   // past nb: sc holds p = 0 there
                    [[unroll]] for (uint g = 0; g < G; g++) {
                        const float p = sc[g * WG + j];
                        acc[g][0] += p * va;
                        acc[g][1] += p * vb;
                    }
                }
            }
        }
        barrier();                       // sc is rewritten by the next block
    }

    // sum the row groups' partial outputs in shared memory (qs is free now), then write o, m, l
    for (uint r = 0; r < RG; r++) {
        if (rg == r) {
            [[unroll]] for (uint g = 0; g < G; g++) {
                const uint i = (g * HD) / 4 + 2 * c8;
                qs[i] = r == 0 ? acc[g][0] : qs[i] + acc[g][0];
                qs[i + 1] = r == 0 ? acc[g][1] : qs[i + 1] + acc[g][1];
            }
        }
        barrier();
    }
    for (uint i = tid; i < G * HD / 4; i += WG) {
        const uint g = i / (HD / 4), d4 = i % (HD / 4);
        part[((kx * G + g) * pc.n_splits + s) * REC + d4] = qs[i];
    }
    if (tid == 0) {
        [[unroll]] for (uint g = 0; g < G; g++)
            part[((kx * G + g) * pc.n_splits + s) * REC + HD / 4] = vec4(m[g], l[g], 0.0, 0.0);
    }

    if (!arrive_last(kx, pc.n_splits)) return;

    // ---- the last workgroup of kv head kh: combine the used splits of its G query heads ----
    const uint S = (n + chunk - 1) / chunk;      // splits that hold positions (>= 1)
    // (m, l) of split tid is kept in registers between the two passes (S <= WG: one L2 read)
    float M[G];
    vec2 mine[G];
    [[unroll]] for (uint g = 0; g < G; g++) { M[g] = -1e30; mine[g] = vec2(-1e30, 0.0); }
    for (uint sp = tid; sp < S; sp += WG)
        [[unroll]] for (uint g = 0; g < G; g++) {
            const vec2 ml = part[((kx * G + g) * pc.n_splits + sp) * REC + HD / 4].xy;
            if (sp == tid) mine[g] = ml;
            M[g] = max(M[g], ml.x);
        }
    wg_reduce_g(M, true);
    float L[G];
    [[unroll]] for (uint g = 0; g < G; g++) L[g] = 0.0;
    for (uint sp = tid; sp < S; sp += WG) {
        [[unroll]] for (uint g = 0; g < G; g++) {
            vec2 ml = mine[g];
            if (sp != tid) ml = part[((kx * G + g) * pc.n_splits + sp) * REC + HD / 4].xy;
            const float w = exp(ml.x - M[g]);
            wsh[g * SMAX + sp] = w;
            L[g] += ml.y * w;
        }
    }
    wg_reduce_g(L, false);               // its barriers also publish wsh
    // threads: NC4 vec4 columns (G rows of HD) x SG groups of splits; when the columns are fewer
    // than the threads, the split groups' sums meet in shared memory. One workgroup reads every
    // partial of its kv head here (latency-bound): COMBINE_LOADS loads in flight a thread, the
    // last batch predicated rather than walked one load at a time.
    const uint NC4 = G * HD / 4;
    const uint SG = NC4 >= WG ? 1 : WG / NC4;
    for (uint i = tid; i < NC4 * SG; i += WG) {
        const uint c4 = i % NC4, sg = i / NC4;
        const uint g = c4 / (HD / 4);
        const uint base = (kx * G + g) * pc.n_splits * REC + c4 % (HD / 4);
        vec4 acc4[4] = vec4[4](vec4(0.0), vec4(0.0), vec4(0.0), vec4(0.0));
        for (uint sp = sg; sp < S; sp += COMBINE_LOADS * SG) {
            vec4 a[COMBINE_LOADS];
            [[unroll]] for (uint u = 0; u < COMBINE_LOADS; u++) {
                const uint t = sp + u * SG;
                const vec4 v = part[base + min(t, S - 1) * REC];   // in bounds, whatever the compiler hoists
                a[u] = t < S ? v : vec4(0.0);
            }
            [[unroll]] for (uint u = 0; u < COMBINE_LOADS; u++) {
                const uint t = sp + u * SG;
                const float w = wsh[g * SMAX + min(t, S - 1)];   // in bounds; 0 past the used splits
                acc4[u % 4] += a[u] * (t < S ? w : 0.0);
            }
        }
        const vec4 o0 = acc4[0], o1 = acc4[1], o2 = acc4[2], o3 = acc4[3];
        const vec4 o = (o0 + o1) + (o2 + o3);
        if (SG == 1) {
            float inv_l = 0.0;
            [[unroll]] for (uint gg = 0; gg < G; gg++) if (gg == g) inv_l = 1.0 / L[gg];
            outp[kx * NC4 + c4] = o * inv_l;
#ifdef ATTN_Q8_1
            qs[c4] = o * inv_l;          // qs is free again: the output rows, for the q8_1 step
#endif
        } else {
            osum[i] = o;
        }
    }
    if (SG > 1) {
        barrier();
        for (uint c4 = tid; c4 < NC4; c4 += WG) {
            vec4 o = vec4(0.0);
            for (uint k = 0; k < SG; k++) o += osum[k * NC4 + c4];
            const uint g = c4 / (HD / 4);
            float inv_l = 0.0;
            [[unroll]] for (uint gg = 0; gg < G; gg++) if (gg == g) inv_l = 1.0 / L[gg];
            outp[kx * NC4 + c4] = o * inv_l;
#ifdef ATTN_Q8_1
            qs[c4] = o * inv_l;
#endif
        }
    }
#ifdef ATTN_Q8_1
    // q8_1 blocks of the G output rows (G * HD / 32 blocks, one per invocation), from the values
    // just written, through quantize_q8_1.comp's encoder: the int8 matvec reads bit-identical input.
    barrier();
    for (uint b = tid; b < NC4 / 8; b += WG) {
        float v[32];
        [[unroll]] for (uint k4 = 0; k4 < 8; k4++) {
            const vec4 t = qs[8 * b + k4];
            v[4 * k4] = t.x; v[4 * k4 + 1] = t.y; v[4 * k4 + 2] = t.z; v[4 * k4 + 3] = t.w;
        }
        q8_1_store(v, kh * (NC4 / 8) + b);
    }
#endif
}
