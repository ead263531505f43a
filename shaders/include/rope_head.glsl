// One attention head of QK-norm + NEOX RoPE (rotate-half, as HF Gemma) and the f16 KV-cache
// write, by one workgroup: shared by rope.comp (one workgroup per head) and matvec.comp's rope
// epilogue (the last workgroup to finish a head's rows of the fused QKV matvec runs it).
//
// The includer declares the spec constant WG, includes wg_reduce.glsl, and names by macro:
//   ROPE_Q  f32, read-write: query values (rotated in place)     ROPE_QW / ROPE_KW: norm weights
//   ROPE_K  f32, read: key values   ROPE_V  f32, read: values    ROPE_KC / ROPE_VC: uint caches
// and push constants head_dim, cache_slots, theta, pos_scale, eps.
// Cache layout (both K and V): [n_kv_heads][cache_slots][head_dim] f16, two halves per uint;
// position p goes to slot p % cache_slots.
// RoPE: inv_freq_i = theta^(-2i/D) * pos_scale (pos_scale = 1 / linear factor), angle computed
// in f32 as HF does; x[i], x[i+D/2] rotate by angle_i. head_dim must be a multiple of 4.
// Call from uniform control flow only (barriers inside).
#ifndef ROPE_HEAD_GLSL
#define ROPE_HEAD_GLSL

const float TWO_PI_HI = 6.28125;                 // 8 significant bits: k * HI is exact
const float TWO_PI_LO = 1.9353071795864769e-3;   // 2*pi - TWO_PI_HI

// sin/cos are only specified on [-pi, pi]: reduce first (Cody-Waite, two constants).
vec2 cos_sin(float a) {
    float kk = round(a * 0.15915494309189535);
    float r = (a - kk * TWO_PI_HI) - kk * TWO_PI_LO;
    return vec2(cos(r), sin(r));
}

// rotated (a, b) = the pair (x[i0..i1], x[half + i0..i1]) normalized by inv * w and rotated
void rope_pair(inout vec2 a, inout vec2 b, vec2 wa, vec2 wb, float inv, uint i0, uint pos) {
    const uint D = pc.head_dim;
    a *= inv * wa;
    b *= inv * wb;
    // inv_freq in f32 like HF: 1 / theta^(2i/D), then the linear scaling, then * pos
    vec2 f = vec2(1.0 / pow(pc.theta, float(2*i0) / float(D)),
                  1.0 / pow(pc.theta, float(2*(i0 + 1)) / float(D))) * pc.pos_scale;
    vec2 cs0 = cos_sin(float(pos) * f.x), cs1 = cos_sin(float(pos) * f.y);
    vec2 c = vec2(cs0.x, cs1.x), s = vec2(cs0.y, cs1.y);
    vec2 ra = a * c - b * s;
    vec2 rb = b * c + a * s;
    a = ra;
    b = rb;
}

// 1 / rms of the head at `src` in `arr`
#define ROPE_INV_RMS(arr, src, D)                                                          \
    {                                                                                      \
        float ss = 0.0;                                                                    \
        for (uint j = gl_LocalInvocationID.x; j < D / 4; j += WG) {                        \
            vec2 a = vec2(arr[src + 2*j], arr[src + 2*j + 1]);                             \
            vec2 b = vec2(arr[src + D/2 + 2*j], arr[src + D/2 + 2*j + 1]);                 \
            ss += dot(a, a) + dot(b, b);                                                   \
        }                                                                                  \
        inv = inversesqrt(wg_sum(ss) / float(D) + pc.eps);                                 \
    }

// query head at ROPE_Q[src ..]: normalized and rotated in place
void rope_q_head(uint src, uint pos) {
    const uint D = pc.head_dim, half_d = D / 2;
    float inv;
    ROPE_INV_RMS(ROPE_Q, src, D)
    for (uint j = gl_LocalInvocationID.x; j < D / 4; j += WG) {
        const uint i0 = 2*j, i1 = 2*j + 1;
        vec2 a = vec2(ROPE_Q[src + i0], ROPE_Q[src + i1]);
        vec2 b = vec2(ROPE_Q[src + half_d + i0], ROPE_Q[src + half_d + i1]);
        rope_pair(a, b, vec2(ROPE_QW[i0], ROPE_QW[i1]), vec2(ROPE_QW[half_d + i0], ROPE_QW[half_d + i1]),
                  inv, i0, pos);
        ROPE_Q[src + i0] = a.x; ROPE_Q[src + i1] = a.y;
        ROPE_Q[src + half_d + i0] = b.x; ROPE_Q[src + half_d + i1] = b.y;
    }
}

// key head kh at ROPE_K[src ..]: normalized, rotated, stored as f16 at its cache slot
void rope_k_head(uint src, uint kh, uint pos) {
    const uint D = pc.head_dim, half_d = D / 2;
    float inv;
    ROPE_INV_RMS(ROPE_K, src, D)
    const uint cache_row = ((step.slot * pc.n_kv_heads + kh) * pc.cache_slots + pos % pc.cache_slots) * D;   // in halves
    for (uint j = gl_LocalInvocationID.x; j < D / 4; j += WG) {
        const uint i0 = 2*j, i1 = 2*j + 1;
        vec2 a = vec2(ROPE_K[src + i0], ROPE_K[src + i1]);
        vec2 b = vec2(ROPE_K[src + half_d + i0], ROPE_K[src + half_d + i1]);
        rope_pair(a, b, vec2(ROPE_KW[i0], ROPE_KW[i1]), vec2(ROPE_KW[half_d + i0], ROPE_KW[half_d + i1]),
                  inv, i0, pos);
        ROPE_KC[(cache_row + i0) / 2] = packHalf2x16(a);
        ROPE_KC[(cache_row + half_d + i0) / 2] = packHalf2x16(b);
    }
}

// value head kh at ROPE_V[src ..]: stored as f16 at its cache slot
void copy_v_head(uint src, uint kh, uint pos) {
    const uint D = pc.head_dim;
    const uint cache_row = ((step.slot * pc.n_kv_heads + kh) * pc.cache_slots + pos % pc.cache_slots) * D;
    for (uint i = 2 * gl_LocalInvocationID.x; i < D; i += 2 * WG)
        ROPE_VC[(cache_row + i) / 2] = packHalf2x16(vec2(ROPE_V[src + i], ROPE_V[src + i + 1]));
}
#endif
