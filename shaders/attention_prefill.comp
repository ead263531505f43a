#version 450
// Causal attention for a chunk of prompt tokens (flash-attention style) against the f16 KV
// cache, which already holds the chunk's own keys (rope.comp ran first).
// Workgroup (query block qb, head h): queries t in [qb*BQ, qb*BQ + BQ) with t < step.n_tokens,
// at positions step.pos + t, attend to positions max(0, p - window + 1) .. p (window 0: from 0).
// Key tiles of BC positions are staged in shared memory (f16 pairs), scores and the online
// softmax in f32. Local layers need cache_slots >= window + chunk tokens, so writing the chunk
// never overwrites a key that one of its queries still sees.
// Thread layout: WG / BQ threads per query row; each owns head_dim / (2 * WG / BQ) column pairs.
// Bindings: 0 step, 1 q (f32 [tokens][q_stride], head h at q_offset + h * D), 2 K cache,
//           3 V cache ([n_kv_heads][cache_slots][D] f16), 4 out (f32 [tokens][n_heads * D]).
// Dispatch: (ceil(tokens recorded / BQ), n_heads, 1).
// Limits: head_dim a multiple of 2 * WG / BQ (32 with the defaults), <= 256.
#extension GL_GOOGLE_include_directive : require
#include "include/step.glsl"
STEP_BUFFER(0)

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint BQ = 8;     // query rows per workgroup
layout(constant_id = 2) const uint BC = 32;    // key positions per tile

#define DMAX 256
#define PMAX 8          // column pairs per thread: DMAX / 32 with 16 threads per row

PUSH_CONSTANTS

layout(std430, binding = 1) readonly buffer Q { float q[]; };
layout(std430, binding = 2) readonly buffer KC { uint kc[]; };
layout(std430, binding = 3) readonly buffer VC { uint vc[]; };
layout(std430, binding = 4) writeonly buffer O { float outp[]; };

shared float qs[BQ * DMAX];
shared uint kv[BC * (DMAX / 2)];
shared float sc[BQ * BC];
shared float alpha_sh[BQ];

void main() {
    const uint D = pc.head_dim, D2 = D / 2;
    const uint h = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint n_tokens = step.n_tokens;
    const uint t0 = gl_WorkGroupID.x * BQ;
    if (t0 >= n_tokens) return;                       // uniform over the workgroup
    const uint nq = min(BQ, n_tokens - t0);
    const uint pos0 = step.pos + t0;                  // position of query row 0
    const uint kh = h / (pc.n_heads / pc.n_kv_heads);
    const uint slots = pc.cache_slots;
    const uint W = pc.window;

    for (uint i = tid; i < BQ * D; i += WG) {
        const uint r = i / D, d = i % D;
        qs[r * DMAX + d] = r < nq ? q[pc.q_offset + (t0 + r) * pc.q_stride + h * D + d] * pc.scale : 0.0;
    }

    const uint TPR = WG / BQ;                         // threads per query row
    const uint row = tid / TPR, lane = tid % TPR;
    const uint npairs = D2 / TPR;                     // column pairs this thread owns
    vec2 acc[PMAX];
    for (uint j = 0; j < PMAX; j++) acc[j] = vec2(0.0);
    float m = -1e30, l = 0.0;                         // running stats of `row` (used by lane 0)

    const uint lo = (W > 0 && pos0 + 1 > W) ? pos0 + 1 - W : 0;
    const uint hi = pos0 + nq - 1;                    // last key any row of the block sees
    for (uint kb = lo; kb <= hi; kb += BC) {
        const uint nk = min(BC, hi + 1 - kb);
        barrier();                                    // previous tile's V reads are done
        for (uint i = tid; i < BC * D2; i += WG) {
            const uint j = i / D2, c = i % D2;
            kv[j * (DMAX / 2) + c] = j < nk ? kc[(kh * slots + (kb + j) % slots) * D2 + c] : 0u;
        }
        barrier();
        for (uint i = tid; i < BQ * BC; i += WG) {
            const uint r = i / BC, j = i % BC;
            const uint qp = pos0 + r, kp = kb + j;
            float s = -1e30;
            if (r < nq && j < nk && kp <= qp && (W == 0 || qp - kp < W)) {
                s = 0.0;
                for (uint c = 0; c < D2; c++) {
                    const vec2 kk = unpackHalf2x16(kv[j * (DMAX / 2) + c]);
                    s += qs[r * DMAX + 2 * c] * kk.x + qs[r * DMAX + 2 * c + 1] * kk.y;
                }
            }
            sc[r * BC + j] = s;
        }
        barrier();
        // online softmax (one thread per row) while everyone stages the V tile
        if (lane == 0) {
            float mx = m;
            for (uint j = 0; j < nk; j++) mx = max(mx, sc[row * BC + j]);
            float sum = 0.0;
            for (uint j = 0; j < BC; j++) {
                const float s = sc[row * BC + j];
                const float p = (j < nk && s > -1e29) ? exp(s - mx) : 0.0;
                sc[row * BC + j] = p;
                sum += p;
            }
            const float a = exp(m - mx);
            alpha_sh[row] = a;
            l = l * a + sum;
            m = mx;
        }
        for (uint i = tid; i < BC * D2; i += WG) {
            const uint j = i / D2, c = i % D2;
            kv[j * (DMAX / 2) + c] = j < nk ? vc[(kh * slots + (kb + j) % slots) * D2 + c] : 0u;
        }
        barrier();
        const float a = alpha_sh[row];
        for (uint pp = 0; pp < PMAX; pp++) {
            if (pp < npairs) {
                const uint c = lane + pp * TPR;
                vec2 o = acc[pp] * a;
                for (uint j = 0; j < nk; j++) o += sc[row * BC + j] * unpackHalf2x16(kv[j * (DMAX / 2) + c]);
                acc[pp] = o;
            }
        }
    }
    // lane 0 of each row holds l: share it
    barrier();
    if (lane == 0) alpha_sh[row] = l;
    barrier();
    if (row < nq) {
        const float inv = 1.0 / alpha_sh[row];
        const uint ob = (t0 + row) * pc.n_heads * D + h * D;
        for (uint pp = 0; pp < PMAX; pp++) {
            if (pp < npairs) {
                const uint c = lane + pp * TPR;
                outp[ob + 2 * c] = acc[pp].x * inv;
                outp[ob + 2 * c + 1] = acc[pp].y * inv;
            }
        }
    }
}
