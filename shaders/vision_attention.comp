#version 450
// Bidirectional multi-head attention of the SigLIP vision tower: every patch attends to every
// patch of its picture (no mask, no KV cache), f32 throughout (scores, online softmax, sums).
// One invocation per query row: q and the output accumulator live in registers (HD / 4 vec4
// each); key/value tiles of BC rows are staged in shared memory, every invocation reading the
// same key at a time (a broadcast). Keys go 4 at a time: one max, one rescale per 4 keys.
// Bindings: 0 qkv (f32 [n_tokens][stride]: head h's q at h * HD, k at k_off + h * HD,
//           v at v_off + h * HD), 1 out (f32 [n_tokens][n_heads * HD]).
// Dispatch: (ceil(n_tokens / WG), n_heads, 1). Limits: HD % 4 == 0, stride, k_off, v_off % 4 == 0.
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;   // query rows per workgroup
layout(constant_id = 1) const uint BC = 64;    // key rows per shared tile (a multiple of 4)
layout(constant_id = 2) const uint HD = 72;    // head_dim

PUSH_CONSTANTS

layout(std430, binding = 0) readonly buffer QKV { vec4 qkv[]; };
layout(std430, binding = 1) writeonly buffer O { vec4 outp[]; };

shared vec4 ks[BC * (HD / 4)];
shared vec4 vs[BC * (HD / 4)];

void main() {
    const uint D4 = HD / 4, h = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    const uint N = pc.n_tokens, S4 = pc.stride / 4;
    const uint t = gl_WorkGroupID.x * WG + tid;
    const uint tq = min(t, N - 1);                    // rows past the end compute, never write
    vec4 q[HD / 4], acc[HD / 4];
    [[unroll]] for (uint c = 0; c < D4; c++) {
        q[c] = qkv[tq * S4 + h * D4 + c] * pc.scale;
        acc[c] = vec4(0.0);
    }
    float m = -1e30, l = 0.0;
    const uint ko = pc.k_off / 4 + h * D4, vo = pc.v_off / 4 + h * D4;
    for (uint kb = 0; kb < N; kb += BC) {
        const uint nk = min(BC, N - kb);
        barrier();                                    // the previous tile is read
        for (uint i = tid; i < BC * D4; i += WG) {
            const uint j = i / D4, c = i % D4, r = (kb + j) * S4;
            ks[i] = j < nk ? qkv[r + ko + c] : vec4(0.0);
            vs[i] = j < nk ? qkv[r + vo + c] : vec4(0.0);
        }
        barrier();
        for (uint j = 0; j < nk; j += 4) {
            vec4 s = vec4(0.0);
            [[unroll]] for (uint c = 0; c < D4; c++) {
                s.x += dot(q[c], ks[j * D4 + c]);
                s.y += dot(q[c], ks[(j + 1) * D4 + c]);
                s.z += dot(q[c], ks[(j + 2) * D4 + c]);
                s.w += dot(q[c], ks[(j + 3) * D4 + c]);
            }
            if (j + 1 >= nk) s.y = -1e30;             // past the last key (zero rows): no weight
            if (j + 2 >= nk) s.z = -1e30;
            if (j + 3 >= nk) s.w = -1e30;
            const float mx = max(max(s.x, s.y), max(s.z, s.w));
            if (mx > m) {
                const float a = exp(m - mx);
                l *= a;
                [[unroll]] for (uint c = 0; c < D4; c++) acc[c] *= a;
                m = mx;
            }
            const vec4 p = exp(s - vec4(m));
            l += p.x + p.y + p.z + p.w;
            [[unroll]] for (uint c = 0; c < D4; c++)
                acc[c] += p.x * vs[j * D4 + c] + p.y * vs[(j + 1) * D4 + c] + p.z * vs[(j + 2) * D4 + c]
                        + p.w * vs[(j + 3) * D4 + c];
        }
    }
    if (t < N) {
        const float inv = 1.0 / l;
        [[unroll]] for (uint c = 0; c < D4; c++) outp[t * pc.n_heads * D4 + h * D4 + c] = acc[c] * inv;
    }
}
