// Gemma RMSNorm of one row by one workgroup, shared by norm.comp and matvec.comp's norm tail
// (EPI_NORM), so both compute the same thing the same way. f32 throughout (Gemma 3 overflows f16).
//
// The includer declares the spec constant WG (invocations) and these arrays, by macro name:
//   NORM_IN   f32, read:            the row to normalize
//   NORM_W0   f32, read:            w (norm_row) / w_post (norm_add_row)
//   NORM_RES  f32, read-write:      the residual stream (norm_add_row)
//   NORM_W1   f32, read:            w_next (norm_add_row)
//   NORM_OUT  f32, written (declared coherent where quantize_row_q8_1 reads it back)
//   NORM_Q    uint, written:        q8_1 blocks (quantize_row_q8_1)
// Call from uniform control flow only (barriers inside).
#ifndef NORM_ROW_GLSL
#define NORM_ROW_GLSL
#include "wg_reduce.glsl"

#ifndef NORM_MAXE       // register path: elements per invocation; a -D from the pipeline table
#error "NORM_MAXE comes from engine/backends/vulkan/ops_norm.py (the pipeline's defines)"
#endif

// Every output is `precise` (no FMA contraction or reassociation): the variants that also write
// q8_1 blocks must give the same f32 bits as the plain ones, and lavapipe on an AVX-512 host
// contracted them differently (1 ulp on a third of the elements) without it.

// Loops touch 4 elements per step so 4 loads are in flight (a plain strided loop waits one
// memory latency per element: 2x slower for n = 5376 on an H100).

float norm_sumsq_in(uint in_base, uint n) {
    const uint tid = gl_LocalInvocationID.x;
    const uint n4 = n / (4 * WG) * (4 * WG);
    float ss = 0.0;
    for (uint i = tid; i < n4; i += 4 * WG) {
        const vec4 v = vec4(NORM_IN[in_base + i], NORM_IN[in_base + i + WG], NORM_IN[in_base + i + 2 * WG],
                            NORM_IN[in_base + i + 3 * WG]);
        ss += dot(v, v);
    }
    for (uint i = n4 + tid; i < n; i += WG) { const float v = NORM_IN[in_base + i]; ss += v * v; }
    return wg_sum(ss);
}

#ifdef NORM_ROW_PLAIN
// NORM_OUT[base + i] = rmsnorm(NORM_IN[in_base + i]) * NORM_W0[i]
void norm_row(uint in_base, uint base, uint n, float eps) {
    const uint tid = gl_LocalInvocationID.x;
    const uint n4 = n / (4 * WG) * (4 * WG);
    const float inv = inversesqrt(norm_sumsq_in(in_base, n) / float(n) + eps);
    for (uint i = tid; i < n4; i += 4 * WG) {
        const uvec4 k = uvec4(i, i + WG, i + 2 * WG, i + 3 * WG);
        precise const vec4 r = vec4(NORM_IN[in_base + k.x], NORM_IN[in_base + k.y], NORM_IN[in_base + k.z],
                            NORM_IN[in_base + k.w]) * inv
                     * vec4(NORM_W0[k.x], NORM_W0[k.y], NORM_W0[k.z], NORM_W0[k.w]);
        NORM_OUT[base + k.x] = r.x; NORM_OUT[base + k.y] = r.y; NORM_OUT[base + k.z] = r.z; NORM_OUT[base + k.w] = r.w;
    }
    for (uint i = n4 + tid; i < n; i += WG) { precise const float r = NORM_IN[in_base + i] * inv * NORM_W0[i]; NORM_OUT[base + i] = r; }
}
#endif

#ifdef NORM_ROW_ADD
// NORM_RES[base + i] += rmsnorm(NORM_IN[in_base + ..]) * NORM_W0;  NORM_OUT[base + i] = rmsnorm(NORM_RES) * NORM_W1
// (Gemma's sandwich norm, the residual add and the next pre-norm).
void norm_add_row(uint in_base, uint base, uint n, float eps) {
    const uint tid = gl_LocalInvocationID.x;
    const uint n4 = n / (4 * WG) * (4 * WG);
    const float inv = inversesqrt(norm_sumsq_in(in_base, n) / float(n) + eps);
    float ss2 = 0.0;
    for (uint i = tid; i < n4; i += 4 * WG) {
        const uvec4 k = uvec4(i, i + WG, i + 2 * WG, i + 3 * WG);
        precise const vec4 r = vec4(NORM_RES[base + k.x], NORM_RES[base + k.y], NORM_RES[base + k.z], NORM_RES[base + k.w])
                     + vec4(NORM_IN[in_base + k.x], NORM_IN[in_base + k.y], NORM_IN[in_base + k.z],
                            NORM_IN[in_base + k.w]) * inv
                     * vec4(NORM_W0[k.x], NORM_W0[k.y], NORM_W0[k.z], NORM_W0[k.w]);
        NORM_RES[base + k.x] = r.x; NORM_RES[base + k.y] = r.y; NORM_RES[base + k.z] = r.z; NORM_RES[base + k.w] = r.w;
        ss2 += dot(r, r);
    }
    for (uint i = n4 + tid; i < n; i += WG) {
        precise const float r = NORM_RES[base + i] + NORM_IN[in_base + i] * inv * NORM_W0[i];
        NORM_RES[base + i] = r;
        ss2 += r * r;
    }
    const float inv2 = inversesqrt(wg_sum(ss2) / float(n) + eps);
    // each invocation re-reads only what it wrote itself: no barrier needed
    for (uint i = tid; i < n4; i += 4 * WG) {
        const uvec4 k = uvec4(i, i + WG, i + 2 * WG, i + 3 * WG);
        precise const vec4 r = vec4(NORM_RES[base + k.x], NORM_RES[base + k.y], NORM_RES[base + k.z], NORM_RES[base + k.w])
                     * inv2 * vec4(NORM_W1[k.x], NORM_W1[k.y], NORM_W1[k.z], NORM_W1[k.w]);
        NORM_OUT[base + k.x] = r.x; NORM_OUT[base + k.y] = r.y; NORM_OUT[base + k.z] = r.z; NORM_OUT[base + k.w] = r.w;
    }
    for (uint i = n4 + tid; i < n; i += WG) { precise const float o = NORM_RES[base + i] * inv2 * NORM_W1[i]; NORM_OUT[base + i] = o; }
}
#endif

#ifdef NORM_ROW_ADD
// The same, with the row held in registers (NORM_MAXE elements per invocation: n <= NORM_MAXE * WG,
// and WG a multiple of 32 for the q8_1 step below): every load (x, residual, both weights) is
// issued up front, so the row costs one memory latency instead of one per pass, and the q8_1
// blocks come from registers (quantize_regs_q8_1) instead of a read-back of NORM_OUT. On an H100,
// norm_add + q8_1 over 5376 floats took ~16 us as three global passes and a strided read-back.
// Returns false (nothing done) when the row does not fit; the caller then takes norm_add_row.
bool norm_add_row_regs(uint in_base, uint base, uint n, float eps, out precise float ov[NORM_MAXE]) {
    [[unroll]] for (uint j = 0u; j < NORM_MAXE; j++) ov[j] = 0.0;
    if (n > NORM_MAXE * WG || WG % 32u != 0u) return false;
    const uint tid = gl_LocalInvocationID.x;
    float xv[NORM_MAXE], a[NORM_MAXE], b[NORM_MAXE];
    precise float rv[NORM_MAXE];
    [[unroll]] for (uint j = 0u; j < NORM_MAXE; j++) {
        const uint i = tid + j * WG;
        const bool ok = i < n;
        xv[j] = ok ? NORM_IN[in_base + i] : 0.0;
        rv[j] = ok ? NORM_RES[base + i] : 0.0;
        a[j] = ok ? NORM_W0[i] : 0.0;
        b[j] = ok ? NORM_W1[i] : 0.0;
    }
    float ss = 0.0;
    [[unroll]] for (uint j = 0u; j < NORM_MAXE; j++) ss += xv[j] * xv[j];
    const float inv = inversesqrt(wg_sum(ss) / float(n) + eps);
    float ss2 = 0.0;
    [[unroll]] for (uint j = 0u; j < NORM_MAXE; j++) {
        rv[j] += xv[j] * inv * a[j];
        ss2 += rv[j] * rv[j];
        const uint i = tid + j * WG;
        if (i < n) NORM_RES[base + i] = rv[j];
    }
    const float inv2 = inversesqrt(wg_sum(ss2) / float(n) + eps);
    [[unroll]] for (uint j = 0u; j < NORM_MAXE; j++) {
        const uint i = tid + j * WG;
        ov[j] = rv[j] * inv2 * b[j];          // 0 beyond n (b is 0 there)
        if (i < n) NORM_OUT[base + i] = ov[j];
    }
    return true;
}
#endif

#ifdef NORM_ROW_Q8_1
#define Q8_1_OUT NORM_Q
#include "q8_1_block.glsl"

// q8_1 blocks of a row held as norm_add_row_regs leaves it (element tid + j * WG in ov[j]):
// slice j (WG elements) goes through shared memory, padded one float per 32 so each of the
// WG / 32 quantizing invocations reads its block without bank conflicts.
shared float nq_sh[WG + WG / 32u];
void quantize_regs_q8_1(float ov[NORM_MAXE], uint n, uint q_block) {
    const uint tid = gl_LocalInvocationID.x;
    const uint nb = (n + 31u) / 32u;
    [[unroll]] for (uint j = 0u; j < NORM_MAXE; j++) {
        if (j * WG >= n) break;
        barrier();                          // the previous slice has been read
        nq_sh[tid + tid / 32u] = ov[j];
        barrier();
        const uint b = j * (WG / 32u) + tid;
        if (tid < WG / 32u && b < nb) {
            float v[32];
            [[unroll]] for (uint k = 0u; k < 32u; k++) v[k] = nq_sh[33u * tid + k];
            q8_1_store(v, q_block + b);
        }
    }
}

// NORM_Q[q_block ...] <- q8_1 blocks of NORM_OUT[base : base + n], the last block zero-padded:
// exactly what quantize_q8_1.comp writes for the row (both encode through q8_1_block.glsl).
// Reads back what the other invocations wrote: NORM_OUT must be declared coherent.
void quantize_row_q8_1(uint base, uint n, uint q_block) {
    memoryBarrierBuffer();
    barrier();
    const uint nb = (n + 31u) / 32u;
    for (uint b = gl_LocalInvocationID.x; b < nb; b += WG) {
        float v[32];
        [[unroll]] for (uint k = 0u; k < 32u; k++) {
            const uint i = b * 32u + k;
            v[k] = i < n ? NORM_OUT[base + i] : 0.0;
        }
        q8_1_store(v, q_block + b);
    }
}
#endif
#endif
