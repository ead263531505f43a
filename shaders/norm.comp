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
//   NORM_Q8_1 (with either; *_q8_1): also writes the q8_1 blocks of `out` (ceil(n/32) per row,
//             bit-identical to quantize_q8_1.comp of the row), so an int8 matvec consuming `out`
//             needs no quantize dispatch of its own.
// Bindings (norm_f32):      0 x, 1 w, 2 out                              [, 3 q  (q8_1)]
// Bindings (norm_add_f32):  0 x, 1 w_post, 2 residual (read-write), 3 w_next, 4 out [, 5 q]
// Push: n (row length), eps.   Dispatch: (rows, 1, 1).
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
#ifdef NORM_ADD
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
#ifdef NORM_Q8_1
#define NORM_ROW_Q8_1
#endif
#include "include/norm_row.glsl"

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
