#version 450
// RMSNorm over rows of f32, Gemma style: y = x / sqrt(mean(x^2) + eps) * w, where w is already
// the (1 + weight) multiplier. One workgroup per row; everything in f32 (Gemma 3 overflows f16).
// The row maths lives in include/norm_row.glsl (shared with matvec.comp's norm tail).
//
// Variants (-D):
//   (none)    norm_f32:     out = rmsnorm(x) * w
//   NORM_ADD  norm_add_f32: residual += rmsnorm(x) * w_post;  out = rmsnorm(residual) * w_next
//             Fuses Gemma's sandwich norm (post-attention / post-feedforward norm), the residual
//             add and the next pre-norm (pre-feedforward / next input_layernorm / final norm)
//             into one dispatch.
//   NORM_ADD_SPLIT  norm_add_split_f32: the same sums as NORM_ADD for one row (decode), spread
//             over ceil(n / WG) workgroups, each writing WG elements. The two norms depend on
//             each other (rmsnorm of the sum needs the whole sum), so a one-row norm_add was
//             one workgroup doing two dependent reductions over the row: ~10 us on an H100 for
//             n = 5376. Here every workgroup reads the whole row once (from L2) for four sums,
//             S(x^2), S(res^2), S(res*x*w_post), S((x*w_post)^2), from which
//             S((res + x*inv*w_post)^2) = S(res^2) + 2 inv S(res*x*w_post) + inv^2 S((x*w_post)^2),
//             and then writes its own slice. The residual is read from one buffer and written
//             to another (others' reads of it would race with the writes).
//   NORM_Q8_1 (with any; *_q8_1): also writes the q8_1 blocks of `out` (ceil(n/32) per row,
//             bit-identical to quantize_q8_1.comp of the row), so an int8 matvec consuming `out`
//             needs no quantize dispatch of its own.
// Bindings (norm_f32):      0 x, 1 w, 2 out                              [, 3 q  (q8_1)]
// Bindings (norm_add_f32):  0 x, 1 w_post, 2 residual (read-write), 3 w_next, 4 out [, 5 q]
// Bindings (norm_add_split_f32): 0 x, 1 w_post, 2 residual in, 3 w_next, 4 out, 5 residual out [, 6 q]
// Push: n (row length), eps.   Dispatch: (rows, 1, 1); split: (ceil(n / WG), 1, 1), WG % 32 == 0.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

PUSH_CONSTANTS

#ifdef NORM_Q8_1
#define OUT_ACCESS coherent      // read back by the quantization step
#else
#define OUT_ACCESS writeonly
#endif

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W0 { float w0[]; };
#ifdef NORM_ADD_SPLIT
layout(std430, binding = 2) readonly buffer R { float res[]; };
layout(std430, binding = 3) readonly buffer W1 { float w1[]; };
layout(std430, binding = 4) writeonly buffer O { float outp[]; };
layout(std430, binding = 5) writeonly buffer RO { float res_out[]; };
#ifdef NORM_Q8_1
layout(std430, binding = 6) writeonly buffer Q { uint q[]; };
#define Q8_1_OUT q
#include "include/q8_1_block.glsl"
#endif
#elif defined(NORM_ADD)
layout(std430, binding = 2) buffer R { float res[]; };
layout(std430, binding = 3) readonly buffer W1 { float w1[]; };
layout(std430, binding = 4) OUT_ACCESS buffer O { float outp[]; };
#ifdef NORM_Q8_1
layout(std430, binding = 5) writeonly buffer Q { uint q[]; };
#endif
#define NORM_ROW_ADD
#else
layout(std430, binding = 2) OUT_ACCESS buffer O { float outp[]; };
#ifdef NORM_Q8_1
layout(std430, binding = 3) writeonly buffer Q { uint q[]; };
#endif
#define NORM_ROW_PLAIN
#endif

#define NORM_IN x
#define NORM_W0 w0
#define NORM_RES res
#define NORM_W1 w1
#define NORM_OUT outp
#define NORM_Q q
#if defined(NORM_Q8_1) && !defined(NORM_ADD_SPLIT)
#define NORM_ROW_Q8_1
#endif
#include "include/norm_row.glsl"

#ifdef NORM_ADD_SPLIT
shared vec4 split_red[WG_REDUCE_MAX_SUBGROUPS];
shared float split_out[WG + WG / 32u];     // this workgroup's slice of out, padded per 32 for the q8_1 step

// the four sums over the whole row, same order in every workgroup (so all agree on inv, inv2)
vec4 split_sums(uint n) {
    const uint tid = gl_LocalInvocationID.x;
    vec4 s = vec4(0.0);
    // NORM_MAXE elements per invocation per pass, every load issued before any is used (one
    // memory latency per pass; ops_norm.add_workgroup sizes WG so a row takes one pass)
    for (uint i0 = tid; i0 < n; i0 += NORM_MAXE * WG) {
        float xv[NORM_MAXE], rv[NORM_MAXE], wv[NORM_MAXE];
        [[unroll]] for (uint j = 0u; j < NORM_MAXE; j++) {
            const uint i = i0 + j * WG;
            const bool ok = i < n;
            xv[j] = ok ? x[i] : 0.0;
            rv[j] = ok ? res[i] : 0.0;
            wv[j] = ok ? w0[i] : 0.0;
        }
        [[unroll]] for (uint j = 0u; j < NORM_MAXE; j++) {
            const float a = xv[j] * wv[j];
            s += vec4(xv[j] * xv[j], rv[j] * rv[j], rv[j] * a, a * a);
        }
    }
    s = subgroupAdd(s);
    if (subgroupElect()) split_red[gl_SubgroupID] = s;
    barrier();
    vec4 t = vec4(0.0);
    for (uint k = 0u; k < gl_NumSubgroups; k++) t += split_red[k];
    return t;
}

void norm_add_split(uint n, float eps) {
    const uint tid = gl_LocalInvocationID.x;
    // this invocation's element, loaded before the sums so w_next's memory latency overlaps them
    const uint i = gl_WorkGroupID.x * WG + tid;
    const bool own = i < n;
    const float xi = own ? x[i] : 0.0, ri = own ? res[i] : 0.0, ai = own ? w0[i] : 0.0, bi = own ? w1[i] : 0.0;
    const vec4 s = split_sums(n);
    const float inv = inversesqrt(s.x / float(n) + eps);
    const float ss2 = max(0.0, s.y + 2.0 * inv * s.z + inv * inv * s.w);
    const float inv2 = inversesqrt(ss2 / float(n) + eps);
    float o = 0.0;
    if (own) {
        const float r = ri + xi * inv * ai;
        res_out[i] = r;
        o = r * inv2 * bi;
        outp[i] = o;
    }
#ifdef NORM_Q8_1
    split_out[tid + tid / 32u] = o;          // 0 past n: the last block zero-padded
    barrier();
    const uint b = gl_WorkGroupID.x * (WG / 32u) + tid;
    if (tid < WG / 32u && b * 32u < n) {
        float v[32];
        [[unroll]] for (uint k = 0u; k < 32u; k++) v[k] = split_out[33u * tid + k];
        q8_1_store(v, b);
    }
#endif
}
#endif

#ifdef NORM_ADD_SPLIT
void main() { norm_add_split(pc.n, pc.eps); }
#else
void main() {
    const uint row = gl_WorkGroupID.x;
    const uint base = row * pc.n;
#ifdef NORM_ADD
    float ov[NORM_MAXE];
    if (norm_add_row_regs(base, base, pc.n, pc.eps, ov)) {     // uniform: the row fits in registers
#ifdef NORM_Q8_1
        quantize_regs_q8_1(ov, pc.n, row * ((pc.n + 31u) / 32u));
#endif
        return;
    }
    norm_add_row(base, base, pc.n, pc.eps);
#else
    norm_row(base, base, pc.n, pc.eps);
#endif
#ifdef NORM_Q8_1
    quantize_row_q8_1(base, pc.n, row * ((pc.n + 31u) / 32u));
#endif
}
#endif
