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
// ATTN_SPANS (a prompt with pictures): binding 5 `vis` (uint [tokens]) holds the last position
// each query sees: its own for text, its picture's last for a picture's tokens (they attend to
// each other both ways; the chunk holds the whole picture, so those keys are in the cache).
// The mask is then (kp <= vis[t]) AND the window's lower bound, as transformers composes it.
// Dispatch: (ceil(tokens recorded / BQ), n_heads, 1).
// head_dim is the specialization constant HD (constant trip counts, loads batched 4 at a time).
// Limits: HD a multiple of 2 * WG / BQ (32 with the defaults) and of 8, HD <= 256, BC % 4 == 0.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
#include "include/step.glsl"
STEP_BUFFER(0)

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint BQ = 8;     // query rows per workgroup
layout(constant_id = 2) const uint BC = 32;    // key positions per tile
layout(constant_id = 3) const uint HD = 256;   // head_dim

#define DMAX 256
#define PMAX 8          // column pairs per thread: DMAX / 32 with 16 threads per row

PUSH_CONSTANTS

layout(std430, binding = 1) readonly buffer Q { float q[]; };
layout(std430, binding = 2) readonly buffer KC { uint kc[]; };
layout(std430, binding = 3) readonly buffer VC { uint vc[]; };
layout(std430, binding = 4) writeonly buffer O { float outp[]; };
#ifdef ATTN_SPANS
layout(std430, binding = 5) readonly buffer VIS { uint vis[]; };
#endif

shared vec4 qs[BQ * HD / 4];
shared uvec4 kv[BC * HD / 8];
shared float sc[BQ * BC];
shared float alpha_sh[BQ];

void main() {
    const uint D = HD, D2 = HD / 2, D8 = HD / 8;
    const uint h = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint n_tokens = step.n_tokens;
    const uint t0 = gl_WorkGroupID.x * BQ;
    if (t0 >= n_tokens) return;                       // uniform over the workgroup
    const uint nq = min(BQ, n_tokens - t0);
    const uint pos0 = step.pos + t0;                  // position of query row 0
    const uint kh = h / (pc.n_heads / pc.n_kv_heads);
    const uint slots = pc.cache_slots;
    const uint kvh = step.slot * pc.n_kv_heads + kh;   // this sequence's kv head kh among every slot's
    const uint W = pc.window;

    for (uint i = tid; i < BQ * D / 4; i += WG) {
        const uint r = i / (D / 4), b = pc.q_offset + (t0 + r) * pc.q_stride + h * D + 4 * (i % (D / 4));
        qs[i] = r < nq ? vec4(q[b], q[b + 1], q[b + 2], q[b + 3]) * pc.scale : vec4(0.0);
    }

    const uint TPR = WG / BQ;                         // threads per query row
    const uint row = tid / TPR, lane = tid % TPR;
    const uint npairs = D2 / TPR;                     // column pairs this thread owns
    vec2 acc[PMAX];
    for (uint j = 0; j < PMAX; j++) acc[j] = vec2(0.0);
    float m = -1e30, l = 0.0;                         // running stats of `row` (used by lane 0)

    const uint lo = (W > 0 && pos0 + 1 > W) ? pos0 + 1 - W : 0;
#ifdef ATTN_SPANS
    uint hi = 0;                                      // last key any row of the block sees
    for (uint r = 0; r < nq; r++) hi = max(hi, vis[t0 + r]);
#else
    const uint hi = pos0 + nq - 1;                    // last key any row of the block sees
#endif
    for (uint kb = lo; kb <= hi; kb += BC) {
        const uint nk = min(BC, hi + 1 - kb);
        barrier();                                    // previous tile's V reads are done
        for (uint i = tid; i < BC * D8; i += WG) {
            const uint j = i / D8, c = i % D8, r = (kvh * slots + (kb + j) % slots) * D2 + 4 * c;
            kv[i] = j < nk ? uvec4(kc[r], kc[r + 1], kc[r + 2], kc[r + 3]) : uvec4(0u);
        }
        barrier();
        for (uint i = tid; i < BQ * BC; i += WG) {
            const uint r = i / BC, j = i % BC;
            const uint qp = pos0 + r, kp = kb + j;
            float s = -1e30;
#ifdef ATTN_SPANS
            if (r < nq && j < nk && kp <= vis[t0 + r] && (W == 0 || kp + W > qp)) {
#else
            if (r < nq && j < nk && kp <= qp && (W == 0 || qp - kp < W)) {
#endif
                s = 0.0;
                for (uint c = 0; c < D8; c += 4) {
                    [[unroll]] for (uint u = 0; u < 4; u++) {
                        const uvec4 w = kv[j * D8 + c + u];
                        s += dot(qs[r * (D / 4) + 2 * (c + u)], vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y)))
                           + dot(qs[r * (D / 4) + 2 * (c + u) + 1], vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w)));
                    }
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
        for (uint i = tid; i < BC * D8; i += WG) {
            const uint j = i / D8, c = i % D8, r = (kvh * slots + (kb + j) % slots) * D2 + 4 * c;
            kv[i] = j < nk ? uvec4(vc[r], vc[r + 1], vc[r + 2], vc[r + 3]) : uvec4(0u);
        }
        barrier();
        const float a = alpha_sh[row];
        for (uint pp = 0; pp < PMAX; pp++) {
            if (pp < npairs) {
                const uint c = lane + pp * TPR;
                vec2 o = acc[pp] * a;
                for (uint j = 0; j < nk; j += 4) {
                    [[unroll]] for (uint u = 0; u < 4; u++) {   // p = 0 for j >= nk; kv is zero there
                        const uint jj = j + u, w = kv[jj * D8 + c / 4][c % 4];
                        o += sc[row * BC + jj] * unpackHalf2x16(w);
                    }
                }
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
