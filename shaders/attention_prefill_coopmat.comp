#version 450
// attention_prefill.comp's contract on matrix cores (VK_KHR_cooperative_matrix, 16x16x16
// f16 x f16 -> f32): causal chunk attention of step.n_tokens queries (positions step.pos + t)
// against the f16 KV cache, which already holds the chunk's own keys; local layers see
// positions max(0, p - window + 1) .. p, read from the ring at slot = position % cache_slots.
//
// Workgroup (query block x, head group y): BR = 64 rows = 64 / GW tokens x GW query heads of
// one kv head (GW divides n_heads / n_kv_heads), row r = token (r / GW), head y * GW + r % GW,
// so each K/V tile is staged once for GW heads. Per key tile of BC positions:
//   stage K (f16) -> S = Q K^T (Q held as f16 A matrices, f32 accumulators) -> S to shared ->
//   online softmax in f32 (TPR threads per row, exp2 with the scale folded, row max / sum f32)
//   -> P to shared as f16, V staged over K -> O = O * alpha + P V (f32 accumulators).
// 8 subgroups: subgroup sg owns rows 16 (sg / 2) .. +16; of S the key tiles of half sg % 2,
// of O the column tiles of half sg % 2. Key tiles outside [first key the block's first row
// sees, last key its last row sees] are never visited.
// Rows of O are rescaled through `rowm`, an accumulator whose element e holds its own row
// (loaded once from a 16 x 16 table): elements of two matrices of one type share a layout.
// Numerics: Q (clamped to the f16 range) and P are f16 operands; scores, softmax, O and l f32.
// The scale is applied to S in f32 (Gemma 3: 1/sqrt(query_pre_attn_scalar), no soft-capping).
// ATTN_SPANS: attention_prefill.comp's picture mask (binding 5 vis: the last position each
// query sees), ANDed with the window's lower bound.
// NSPLIT > 1 (split keys, for a chunk whose blocks alone would leave most of the GPU idle: the
// 4B's 512-token chunk is 64 workgroups): workgroup z takes the z-th of NSPLIT equal runs of the
// block's key tiles and writes, instead of out, a partial record per (token, head) of D + 4
// floats at ((t * n_heads + h) * NSPLIT + z) * (D + 4): O unnormalized, then m (log2 units) and
// l; attention_prefill_combine.comp merges them into out. An empty run writes m = NEG, l = 0.
// Defines: CM_HD head_dim (64, 128, 256), CM_BC keys per tile (32 or 64).
// Spec: WG = 8 x subgroup size (ops_attention sets it), GW, NSPLIT.  Push: ATTN_PREFILL_PUSH.
// Bindings: 0 step, 1 q, 2 K cache, 3 V cache, 4 out or the partial records (+ 5 vis): as
// attention_prefill.comp.  Dispatch: (ceil(max_tokens / (64 / GW)), n_heads / GW, NSPLIT).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "include/common.glsl"
#include "include/step.glsl"
STEP_BUFFER(0)

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint GW = 1;     // query heads per workgroup (of one kv head)
layout(constant_id = 2) const uint NSPLIT = 1; // runs of key tiles, one workgroup each

#define D CM_HD
#define BC CM_BC
#define C16 16
#define BR 64
#define NEG (-1e30)
#define SD4 ((D + 8) / 4)       // K/V/Q row stride in f16vec4s (16-byte multiple, fewer bank conflicts)
#define SP4 ((BC + 8) / 4)      // P row stride in f16vec4s
#define SC (BC + 4)             // S row stride in floats
#define QROWS (BC < BR ? BC : BR)   // Q rows staged per pass through the K/V buffer

PUSH_CONSTANTS

layout(std430, binding = 1) readonly buffer Q { float q[]; };
layout(std430, binding = 2) readonly buffer KC { uint kc[]; };
layout(std430, binding = 3) readonly buffer VC { uint vc[]; };
layout(std430, binding = 4) writeonly buffer O { float outp[]; };
#ifdef ATTN_SPANS
layout(std430, binding = 5) readonly buffer VIS { uint vis[]; };
#endif

shared f16vec4 kvs[BC * SD4];          // the K tile, then the V tile (Q at the start)
shared float ss[BR * SC];              // S (f32); the row table and the output tiles
shared f16vec4 ps[BR * SP4];           // P (f16)
shared float rsh[BR];                  // per row: alpha of this tile, then 1 / l

#define ACC coopmat<float, gl_ScopeSubgroup, C16, C16, gl_MatrixUseAccumulator>
#define MA coopmat<float16_t, gl_ScopeSubgroup, C16, C16, gl_MatrixUseA>
#define MB coopmat<float16_t, gl_ScopeSubgroup, C16, C16, gl_MatrixUseB>

// keys kb .. kb + nk - 1 of cache `c` (K or V, one binding each) into kvs; rows >= nk zero
#define STAGE_KV(c)                                                                            \
    for (uint i = tid; i < BC * (D / 8); i += WG) {                                            \
        const uint j = i / (D / 8), c8 = i % (D / 8);                                          \
        f16vec4 a = f16vec4(0.0), b = f16vec4(0.0);                                            \
        if (j < nk) {                                                                          \
            const uint r = (kvh * slots + (kb + j) % slots) * (D / 2) + 4 * c8;                \
            a = f16vec4(unpackFloat2x16(c[r]), unpackFloat2x16(c[r + 1]));                     \
            b = f16vec4(unpackFloat2x16(c[r + 2]), unpackFloat2x16(c[r + 3]));                 \
        }                                                                                      \
        kvs[j * SD4 + 2 * c8] = a;                                                             \
        kvs[j * SD4 + 2 * c8 + 1] = b;                                                         \
    }

// does query row (position qp, last visible key `last`) see key position kp? (in_tile: the key
// is one of the tile's nk staged ones)
bool visible(uint kp, bool in_tile, bool row_ok, uint qp, uint last, uint W) {
#ifdef ATTN_SPANS
    return row_ok && in_tile && kp <= last && (W == 0 || kp + W > qp);
#else
    return row_ok && in_tile && kp <= last && (W == 0 || qp - kp < W);
#endif
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint sg = gl_SubgroupID, strip = sg >> 1, half_ = sg & 1u;
    const uint BT = BR / GW;                          // tokens per workgroup
    const uint n_tokens = step.n_tokens;
    const uint t0 = gl_WorkGroupID.x * BT;
    if (t0 >= n_tokens) return;                       // uniform over the workgroup
    const uint nq = min(BT, n_tokens - t0);
    const uint pos0 = step.pos + t0;                  // position of the block's first token
    const uint h0 = gl_WorkGroupID.y * GW;
    const uint kh = h0 / (pc.n_heads / pc.n_kv_heads);
    const uint slots = pc.cache_slots, W = pc.window;
    const uint kvh = step.slot * pc.n_kv_heads + kh;  // this sequence's kv head among every slot's
    const float sl2 = pc.scale * 1.4426950408889634;  // scores in log2 units: exp2 below

    // the row table: element e of rowm holds its row
    for (uint i = tid; i < C16 * C16; i += WG) ss[i] = float(i / C16);
    barrier();
    ACC rowm;
    coopMatLoad(rowm, ss, 0, C16, gl_CooperativeMatrixLayoutRowMajor);

    // Q (f16, unscaled) as A matrices: staged through kvs, QROWS rows a pass
    MA qa[D / C16];
    for (uint p0 = 0; p0 < BR; p0 += QROWS) {
        barrier();                                    // the previous pass's loads (and rowm) are done
        for (uint i = tid; i < QROWS * (D / 4); i += WG) {
            const uint r = p0 + i / (D / 4), c4 = i % (D / 4), tt = r / GW;
            vec4 v = vec4(0.0);
            if (tt < nq) {
                const uint b = pc.q_offset + (t0 + tt) * pc.q_stride + (h0 + r % GW) * D + 4 * c4;
                v = vec4(q[b], q[b + 1], q[b + 2], q[b + 3]);
            }
            kvs[(i / (D / 4)) * SD4 + c4] = f16vec4(clamp(v, vec4(-65504.0), vec4(65504.0)));
        }
        barrier();
        if (sg < 8u && strip * C16 >= p0 && strip * C16 < p0 + QROWS) {
            [[unroll]] for (uint d = 0; d < D / C16; d++)
                coopMatLoad(qa[d], kvs, (strip * C16 - p0) * SD4 + 4 * d, SD4, gl_CooperativeMatrixLayoutRowMajor);
        }
    }

    ACC o[D / 32];
    [[unroll]] for (uint j = 0; j < D / 32; j++) o[j] = ACC(0.0);

    // softmax threads: TPR consecutive invocations of one subgroup per row
    const uint gidx = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
    const uint TPR = WG / BR;
    const uint row = gidx / TPR, part = gidx % TPR;
    const uint rt = row / GW;                         // the row's token in the block
    const bool row_ok = rt < nq;
    const uint qp = pos0 + rt;
#ifdef ATTN_SPANS
    const uint last = row_ok ? vis[t0 + rt] : 0u;     // the last key this row sees
#else
    const uint last = qp;
#endif
    float m = NEG, l = 0.0;                           // the row's running max (log2 units) and sum

    const uint lo = (W > 0 && pos0 + 1 > W) ? pos0 + 1 - W : 0;
#ifdef ATTN_SPANS
    uint hi = 0;                                      // last key any row of the block sees
    for (uint r = 0; r < nq; r++) hi = max(hi, vis[t0 + r]);
#else
    const uint hi = pos0 + nq - 1;
#endif
    // this workgroup's run of key tiles: all of [lo, hi], or the z-th of NSPLIT equal runs
    uint kb0 = lo, kend = hi + 1;
    if (NSPLIT > 1u) {
        const uint per = ((hi + 1 - lo + BC - 1) / BC + NSPLIT - 1) / NSPLIT;   // tiles per run
        kb0 = min(hi + 1, lo + gl_WorkGroupID.z * per * BC);
        kend = min(hi + 1, kb0 + per * BC);
    }
    for (uint kb = kb0; kb < kend; kb += BC) {
        const uint nk = min(BC, kend - kb);
        barrier();                                    // the previous tile's P and V reads are done
        STAGE_KV(kc)
        barrier();
        if (sg < 8u) {
            [[unroll]] for (uint i = 0; i < BC / 32; i++) {
                const uint kt = half_ * (BC / 32) + i;   // 16-key tile
                ACC s = ACC(0.0);
                [[unroll]] for (uint d = 0; d < D / C16; d++) {
                    MB b;
                    coopMatLoad(b, kvs, kt * C16 * SD4 + 4 * d, SD4, gl_CooperativeMatrixLayoutColumnMajor);
                    s = coopMatMulAdd(qa[d], b, s);
                }
                coopMatStore(s, ss, strip * C16 * SC + kt * C16, SC, gl_CooperativeMatrixLayoutRowMajor);
            }
        }
        barrier();
        // online softmax of the tile: row `row`, column groups of 4 part, part + TPR, ...
        {
            float mx = m;
            for (uint g = part; g < BC / 4; g += TPR) {
                [[unroll]] for (uint u = 0; u < 4; u++) {
                    const uint c = 4 * g + u;
                    if (visible(kb + c, c < nk, row_ok, qp, last, W)) mx = max(mx, ss[row * SC + c] * sl2);
                }
            }
            for (uint sh = 1; sh < TPR; sh <<= 1) mx = max(mx, subgroupShuffleXor(mx, sh));
            float sum = 0.0;
            for (uint g = part; g < BC / 4; g += TPR) {
                f16vec4 p4;
                [[unroll]] for (uint u = 0; u < 4; u++) {
                    const uint c = 4 * g + u;
                    const bool ok = visible(kb + c, c < nk, row_ok, qp, last, W);
                    p4[u] = float16_t(ok ? exp2(ss[row * SC + c] * sl2 - mx) : 0.0);
                    sum += float(p4[u]);              // the sum of the f16 values P V multiplies
                }
                ps[row * SP4 + g] = p4;
            }
            for (uint sh = 1; sh < TPR; sh <<= 1) sum += subgroupShuffleXor(sum, sh);
            const float a = exp2(m - mx);
            l = l * a + sum;
            m = mx;
            if (part == 0) rsh[row] = a;
        }
        STAGE_KV(vc)                                  // over K: the S reads are behind the last barrier
        barrier();
        if (sg < 8u) {
            ACC am;
            for (int e = 0; e < am.length(); e++) am[e] = rsh[strip * C16 + uint(rowm[e])];
            MA pa[BC / C16];
            [[unroll]] for (uint kt = 0; kt < BC / C16; kt++)
                coopMatLoad(pa[kt], ps, strip * C16 * SP4 + 4 * kt, SP4, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint j = 0; j < D / 32; j++) {
                const uint ct = half_ * (D / 32) + j;    // 16-column tile of O
                ACC acc = o[j];
                for (int e = 0; e < acc.length(); e++) acc[e] *= am[e];
                [[unroll]] for (uint kt = 0; kt < BC / C16; kt++) {
                    MB b;
                    coopMatLoad(b, kvs, kt * C16 * SD4 + 4 * ct, SD4, gl_CooperativeMatrixLayoutRowMajor);
                    acc = coopMatMulAdd(pa[kt], b, acc);
                }
                o[j] = acc;
            }
        }
    }

    // O / l (a split: O as is, m and l beside it) through a 16 x 16 staging tile per subgroup
    // (in ss), stores bounded by n_tokens
    const uint REC = D + 4;                            // a split's partial record, in floats
    barrier();
    if (part == 0) {
        rsh[row] = NSPLIT > 1u ? 1.0 : (l > 0.0 ? 1.0 / l : 0.0);
        if (NSPLIT > 1u && row_ok) {
            const uint r = (((t0 + rt) * pc.n_heads + h0 + row % GW) * NSPLIT + gl_WorkGroupID.z) * REC + D;
            outp[r] = m;
            outp[r + 1] = l;
        }
    }
    barrier();
    if (sg >= 8u) return;
    ACC inv;
    for (int e = 0; e < inv.length(); e++) inv[e] = rsh[strip * C16 + uint(rowm[e])];
    const uint lane = gl_SubgroupInvocationID, sgs = gl_SubgroupSize;
    [[unroll]] for (uint j = 0; j < D / 32; j++) {
        const uint ct = half_ * (D / 32) + j;
        ACC r = o[j];
        for (int e = 0; e < r.length(); e++) r[e] *= inv[e];
        coopMatStore(r, ss, sg * C16 * C16, C16, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        for (uint e = lane; e < C16 * C16; e += sgs) {
            const uint rr = strip * C16 + e / C16, tt = rr / GW;
            if (tt < nq) {
                const uint h = h0 + rr % GW;
                const uint at = NSPLIT > 1u ? (((t0 + tt) * pc.n_heads + h) * NSPLIT + gl_WorkGroupID.z) * REC
                                            : (t0 + tt) * pc.n_heads * D + h * D;
                outp[at + ct * C16 + e % C16] = ss[sg * C16 * C16 + e];
            }
        }
        subgroupBarrier();
    }
}
