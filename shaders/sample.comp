#version 450
// Token sampling on the GPU over the logits of one position. The id goes to the token buffer
// (step.glsl's token flow): tokens[step.pos + step.n_tokens + d] for draw d < n_draws
// (n_draws = 1 when decoding; tests draw many at once). With advance = 1 the sampler then
// sets step.pos += step.n_tokens and step.n_tokens = 1 (the next step decodes the sampled id),
// so a replayed decode step needs nothing from the host.
// Each sampler is one dispatch: workgroup b reduces the block of BLOCK logits [b * BLOCK, ...)
// to candidates in `cand`, counts itself in the arrival counter (include/last_arrival.glsl),
// and the last block to arrive does the final pass over every block's candidates.
//
// Greedy (exact argmax, ties -> lowest id, as numpy.argmax):
//   SAMPLE_ARGMAX (sample_argmax_f32): a block keeps its best (ordered key, id); the final pass
//     takes the best of those.
// Temperature / top-k / top-p / min-p:
//   SAMPLE_TOPK (sample_topk_f32): a block (4 logits an invocation: ops_sample.topk_shape) keeps its
//     best KC logits, sorted by value desc then id asc: its KC-th key narrowed by radix rounds, the
//     few entries above the range's floor each placed by its rank among them (block_top; ties at
//     the KC-th key resolved by the same rounds over block indices). The final pass gathers
//     every list entry >= the largest of the blocks' K-th keys (a lower bound of the global K-th
//     key) and ranks them the same way (up to RANK_CAP; a bitonic sort up to CAP); when more than
//     CAP are, finds the K-th largest key by radix select
//     (8 bits a round, shared histogram) and gathers exactly K candidates. Either way: the top K
//     by (value desc, id asc), sorted, then: p_i = exp((l_i - l_max) / T); top-p keeps the
//     shortest prefix whose mass >= top_p (over the K, renormalized); min-p drops
//     p_i < min_p * p_max; draws u with Philox2x32-10 on counter (position of the drawn token + d, 0)
//     keyed by step.seed.
//     K = top_k clamped to [1, KC] (temperature <= 0 -> 1, i.e. greedy); the host runs it for
//     1 <= top_k <= KC only (ops_sample.sampler_for), SAMPLE_FULL otherwise.
//   SAMPLE_FULL (sample_full_f32): every top_k (0 = off: the whole vocabulary). A block sorts its
//     BLOCK logits as SAMPLE_TOPK does and keeps all of them, sorted, with the running sums of
//     their weights exp((l - l_block_max) / T) (cand's second half, two floats per entry pair).
//     The final pass finds each cut as a threshold on the ordered key by bisection over the key
//     bits (32 rounds; a round counts or weighs, per block, the entries >= the probe key by a
//     binary search in the block's sorted list): top-k's K-th largest key (ties at it taken by
//     lowest id, exactly K), top-p's largest key whose mass from the top reaches top_p of the
//     top-k set's (a tie at that key is kept whole), min-p's p >= min_p * p_max; the top token
//     is always kept. The draw (same Philox counter as SAMPLE_TOPK) picks a block by the kept
//     blocks' masses, then the entry by binary search in that block's running sums.
//     cand: n_blocks * BLOCK * 12 bytes (ops_sample.scratch_bytes).
//   All three: bindings 0 step, 1 logits, 2 cand (uvec2 entries: ordered key, id; 1 (argmax), KC
//     (top-k) or BLOCK (full) per block), 3 tokens, 4 arrival counter (uint[1], 0 before and
//     after). Dispatch: (n_blocks, 1, 1).
//   STEP_ROWS (sample_*_f32_rows): a batched step's rows in one dispatch per sampler
//     (n_blocks, rows, 1), each row drawing in the sampler its Step selects (row_skips); row y's
//     Step, logits, candidates and counter are y * (the Step stride, LROW floats, CROW entries,
//     AROW counters) from the bindings' starts.
//   SAMPLE_PENALTY (sample_penalty_f32): llama.cpp repetition penalty, in place on the logits,
//     over the unique ids of tokens[max(0, q - rep_window) .. q), q = step.pos + step.n_tokens:
//     l > 0 ? l / rep_penalty : l * rep_penalty. No-op when rep_penalty == 1. Run it (and a
//     barrier) before either sampler.  Bindings: 0 step, 1 logits, 2 tokens.   Dispatch: (1, 1, 1).
// Push (all variants): vocab, n_blocks = ceil(vocab / BLOCK), n_draws, advance (advance_step:
// a pad row stays put).
// NaN logits count as the lowest possible value.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint BLOCK = 1024;   // logits per block workgroup (power of 2)
layout(constant_id = 2) const uint KC = 64;        // candidates kept per block (power of 2)

#define MAX_SG 256         // subgroups of a workgroup: the top-k sampler's 1,024 invocations at 4 lanes
#define WG_REDUCE_MAX_SUBGROUPS MAX_SG
PUSH_CONSTANTS

// float -> uint with the same order (NaN -> 0, below -inf)
uint ordered_key(float v) {
    if (isnan(v)) return 0u;
    uint b = floatBitsToUint(v);
    return (b & 0x80000000u) != 0u ? ~b : b | 0x80000000u;
}
float key_value(uint k) {
    return uintBitsToFloat((k & 0x80000000u) != 0u ? k & 0x7FFFFFFFu : ~k);
}

#if defined(SAMPLE_ARGMAX) || defined(SAMPLE_TOPK) || defined(SAMPLE_FULL)
#ifdef STEP_ROWS
// a batched decode step's rows of one sampler (engine/backends/vulkan/batch.py), in one dispatch
// (n_blocks, rows, 1): workgroup row y draws for Step y from its own logits, candidates and arrival
// counter, LROW floats, CROW entries and AROW counters after row y - 1's
#define STEP_ROW gl_WorkGroupID.y
layout(constant_id = 3) const uint LROW = 0;
layout(constant_id = 4) const uint CROW = 0;
layout(constant_id = 5) const uint AROW = 0;
#define LOFF (gl_WorkGroupID.y * LROW)
#define COFF (gl_WorkGroupID.y * CROW)
#define AOFF (gl_WorkGroupID.y * AROW)
#else
#define LOFF 0u
#define COFF 0u
#define AOFF 0u
#endif
#include "include/step.glsl"
STEP_BUFFER(0)
layout(std430, binding = 1) readonly buffer Logits { float logits[]; };
// coherent: the last block reads the other blocks' candidates in the same dispatch
layout(std430, binding = 2) coherent buffer Cand { uvec2 cand[]; };
layout(std430, binding = 3) buffer Tok { uint tokens[]; };
#define ARRIVAL_BINDING 4
#include "include/last_arrival.glsl"

// the decode step's hand-over (advance = 1): the next step feeds the id drawn at q. A Step with
// n_tokens 0 (a batched step's pad row) stays where it is, so a batched step replayed with no
// host write between (VulkanBackend.decode_batch_tokens) moves its sequences and nothing else.
#ifdef STEP_ROWS
// (a batched step's rows decode one token each: n_tokens stays 1, so only pos is written, and the
// other samplers' workgroups of the same step can read the row's Step without a race)
void advance_step(uint q) {
    if (pc.advance != 0u && step.n_tokens != 0u) step.pos = q;
}
// A batched step records each sampler its rows need once over all of its rows (batch.py): a row
// runs the one its settings select, as ops_sample.sampler_for does on the host (0 argmax:
// temperature <= 0; 1 top-k: 1 <= top_k <= KC; 2 full: every other top_k), and a pad row
// (n_tokens 0) none, so a bucket's recording serves every split of its rows between samplers.
bool row_skips(uint kind) {
    const uint k = step.temperature <= 0.0 ? 0u : (step.top_k >= 1u && step.top_k <= KC ? 1u : 2u);
    return step.n_tokens == 0u || k != kind;
}
#define SKIP_OTHER_ROWS(kind) if (row_skips(kind)) return;
#else
void advance_step(uint q) {
    if (pc.advance != 0u && step.n_tokens != 0u) { step.pos = q; step.n_tokens = 1u; }
}
#define SKIP_OTHER_ROWS(kind)
#endif
#endif

#ifdef SAMPLE_ARGMAX
shared uint sg_key[MAX_SG];
shared uint sg_id[MAX_SG];

// workgroup argmax over (key, id) pairs: largest key, then smallest id
uvec2 wg_argmax(uint key, uint id) {
    uint mk = subgroupMax(key);
    uint mi = subgroupMin(key == mk ? id : 0xFFFFFFFFu);
    if (subgroupElect()) { sg_key[gl_SubgroupID] = mk; sg_id[gl_SubgroupID] = mi; }
    barrier();
    uvec2 best = uvec2(sg_key[0], sg_id[0]);
    for (uint i = 1; i < gl_NumSubgroups; i++) {
        uvec2 o = uvec2(sg_key[i], sg_id[i]);
        if (o.x > best.x || (o.x == best.x && o.y < best.y)) best = o;
    }
    barrier();   // sg_key / sg_id are reused by the next call
    return best;
}

void main() {
    SKIP_OTHER_ROWS(0u)
    const uint b = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    uint bk = 0u, bi = 0xFFFFFFFFu;
    const uint end = min((b + 1) * BLOCK, pc.vocab);
    uint e = b * BLOCK + tid;
    for (; e + 3 * WG < end; e += 4 * WG) {      // 4 loads in flight
        const vec4 v = vec4(logits[LOFF + e], logits[LOFF + e + WG], logits[LOFF + e + 2 * WG], logits[LOFF + e + 3 * WG]);
        for (uint u = 0; u < 4; u++) {
            const uint k = ordered_key(v[u]);
            if (k > bk || bi == 0xFFFFFFFFu) { bk = k; bi = e + u * WG; }   // ascending ids: first max wins
        }
    }
    for (; e < end; e += WG) {
        const uint k = ordered_key(logits[LOFF + e]);
        if (k > bk || bi == 0xFFFFFFFFu) { bk = k; bi = e; }
    }
    const uvec2 blk = wg_argmax(bk, bi);
    if (tid == 0) cand[COFF + b] = blk;

    if (!arrive_last(AOFF, pc.n_blocks)) return;

    // the last block: argmax over the blocks' candidates
    bk = 0u; bi = 0xFFFFFFFFu;
    for (uint c = tid; c < pc.n_blocks; c += WG) {
        const uvec2 x = cand[COFF + c];
        if (x.x > bk || (x.x == bk && x.y < bi)) { bk = x.x; bi = x.y; }
    }
    const uvec2 best = wg_argmax(bk, bi);
    if (tid == 0) {
        const uint q = step.pos + step.n_tokens;
        for (uint d = 0; d < pc.n_draws; d++) tokens[step.tok_base + q + d] = best.y;
        advance_step(q);
    }
}
#endif

// (key desc, id asc) order: true when a sorts before b
bool before(uvec2 a, uvec2 b) { return a.x > b.x || (a.x == b.x && a.y < b.y); }

#if defined(SAMPLE_TOPK) || defined(SAMPLE_FULL)
#include "include/wg_reduce.glsl"
#define CAP 1024          // >= BLOCK of the bitonic block sort (SAMPLE_FULL, a top-k shape block_top cannot rank)
shared uvec2 big[CAP];

uvec2 philox2x32_10(uvec2 ctr, uint key) {
    for (int r = 0; r < 10; r++) {
        uint hi, lo;
        umulExtended(0xD256D193u, ctr.x, hi, lo);
        ctr = uvec2(hi ^ key ^ ctr.y, lo);
        key += 0x9E3779B9u;
    }
    return ctr;
}

// block b: its BLOCK logits sorted in big (bitonic, by key desc then id asc; past the vocabulary:
// key 0, id 0xFFFFFFFF, so they sort last)
void sort_block(uint b, uint tid) {
    for (uint i = tid; i < BLOCK; i += WG) {
        const uint e = b * BLOCK + i;
        big[i] = e < pc.vocab ? uvec2(ordered_key(logits[LOFF + e]), e) : uvec2(0u, 0xFFFFFFFFu);
    }
    barrier();
    for (uint k = 2; k <= BLOCK; k <<= 1) {
        for (uint j = k >> 1; j > 0; j >>= 1) {
            for (uint p = tid; p < BLOCK / 2; p += WG) {
                const uint i = 2 * j * (p / j) + p % j, ixj = i + j;
                const uvec2 x = big[i], y = big[ixj];
                const bool first_half = (i & k) == 0;
                if (first_half ? before(y, x) : before(x, y)) { big[i] = y; big[ixj] = x; }
            }
            barrier();
        }
    }
}
#endif

#ifdef SAMPLE_TOPK
#define NBMAX 1024
shared uint gt_off[NBMAX];
shared uint eq_take[NBMAX];
shared uint eq_off[NBMAX];
shared uvec2 sel[KC];
shared float prob[KC];
shared uint n_keep_sh;
shared uint n_big_sh;
shared uint hist[256];
shared uvec2 radix_sh;
shared float kept_sum_sh;

// entries of block b (sorted by key desc) with key >= x
uint count_ge(uint b, uint x) {
    uint lo = 0, hi = KC;
    while (lo < hi) {
        const uint mid = (lo + hi) / 2;
        if (cand[COFF + b * KC + mid].x >= x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// The block's top KC without sorting the block: its KC-th key is narrowed to a range of keys
// [lo, hi], then the entries >= lo (KC and a few) are gathered in shared memory and each placed by
// its rank among them. The range starts at [min over KC disjoint groups of their max (each group
// holds a key >= it, so KC keys are), the block's max] and shrinks by radix rounds (`narrow`: a
// histogram of the keys in the range over 256 bins of their next 8 differing bits, the bin
// holding the KC-th key the next range) until that bin holds at most BIN_SMALL keys. Where more
// keys tie at the KC-th one than the ranking takes (flat logits), the same rounds over the tied
// entries' block indices find the lowest ones to keep: exact for any block size, no sort. Ranks
// go by (key desc, block index asc): the padding past the vocabulary (key 0, written with id
// 0xFFFFFFFF) sorts after every real entry, as the bitonic sort kept it. The bitonic sort of the
// whole block stays only for shapes the groups do not fit (BLOCK <= CAP there: ops_sample checks).
// Why: a block of 1,024 sorted by a 55-stage bitonic network cost ~22 us of an H100's throughput a
// row (32 rows: 787 us of a 4B step); ranking ~70 entries in blocks of 4,096 costs ~6.
#define RMAX 4            // keys an invocation holds (BLOCK <= RMAX * WG)
#define RANK_CAP 512      // entries the ranking takes
#define BIN_SMALL 32u     // a bin this small ends the radix rounds
shared uint bt_tm[1024];
shared uint bt_mn[MAX_SG];
shared uint bt_mx[MAX_SG];
shared uint bt_csum[16];
shared uvec4 bt_res;      // a round's result: new lo, new hi, entries above hi, entries in [lo, hi]
shared uint bt_n;

// the groups fit this shape (a function, not a spec-constant expression: glslc's optimizer
// fails on that one)
bool rankable(uint wg, uint kc, uint block) {
    return wg >= kc && wg % kc == 0u && block >= wg && block <= RMAX * wg && wg <= 1024u;
}

// the value entry r of this invocation is ranked by: its key, or (by_index, among the entries
// whose key is t) BLOCK - 1 - its block index, so that the largest values are the lowest indices
uint value_of(uint key[RMAX], uint r, uint tid, bool by_index, uint t) {
    return by_index ? (key[r] == t ? BLOCK - 1u - (tid + r * WG) : 0xFFFFFFFFu) : key[r];
}

// Radix rounds over the block's values in [lo, hi] (by_index: the entries keyed t; 0xFFFFFFFF marks
// the others, outside every range since hi < BLOCK then): the range holding the need-th largest
// value shrinks until its bin holds at most `small` values or one value. Returns (lo, hi, entries
// above hi, entries in [lo, hi]; `n` where the rounds never ran). hist is 0 before and after.
// Uniform control flow (barriers).
uvec4 narrow(uint key[RMAX], uint tid, bool by_index, uint t, uint lo, uint hi, uint above, uint need, uint small, uint n) {
    for (uint round = 0u; round < 4u && lo != hi; round++) {
        const uint top = uint(findMSB(lo ^ hi));
        const uint width = min(8u, top + 1u), shift = top + 1u - width, base = lo >> shift;
        [[unroll]] for (uint r = 0u; r < RMAX; r++) {
            const uint v = value_of(key, r, tid, by_index, t);
            if (tid + r * WG < BLOCK && v >= lo && v <= hi) atomicAdd(hist[(v >> shift) - base], 1u);
        }
        barrier();
        if (tid < 16u) {
            uint c = 0u;
            for (uint i = 0u; i < 16u; i++) c += hist[16u * tid + i];
            bt_csum[tid] = c;
        }
        barrier();
        if (tid < 16u) {   // the bin where the count from the top reaches need; every bin back to 0
            uint acc = above;
            for (uint u = 15u; u > tid; u--) acc += bt_csum[u];
            const bool mine = acc < need && acc + bt_csum[tid] >= need;
            for (uint i = 16u; i-- > 0u;) {
                const uint bin = 16u * tid + i, c = hist[bin];
                if (mine && acc < need && acc + c >= need) {
                    const uint vlo = (base + bin) << shift;
                    bt_res = uvec4(vlo, vlo + ((1u << shift) - 1u), acc, c);
                }
                acc += c;
                hist[bin] = 0u;
            }
        }
        barrier();
        const uvec4 res = bt_res;
        lo = res.x;
        hi = res.y;
        above = res.z;
        n = res.w;
        if (n <= small) break;
    }
    return uvec4(lo, hi, above, n);
}

// block b: its best KC, sorted (key desc, id asc), in cand
void block_top(uint b, uint tid) {
    if (rankable(WG, KC, BLOCK)) {
        uint key[RMAX];
        uint tm = 0u;
        [[unroll]] for (uint r = 0u; r < RMAX; r++) {
            const uint j = tid + r * WG, e = b * BLOCK + j;
            key[r] = (j < BLOCK && e < pc.vocab) ? ordered_key(logits[LOFF + e]) : 0u;
            if (j < BLOCK) tm = max(tm, key[r]);
        }
        bt_tm[tid] = tm;
        for (uint i = tid; i < 256u; i += WG) hist[i] = 0u;
        if (tid == 0u) bt_n = 0u;
        barrier();
        const uint GS = WG / KC;   // invocations per group
        uint gm = 0xFFFFFFFFu;
        if (tid < KC) {
            gm = 0u;
            for (uint u = 0u; u < GS; u++) gm = max(gm, bt_tm[tid * GS + u]);
        }
        gm = subgroupMin(gm);
        tm = subgroupMax(tm);
        if (subgroupElect()) { bt_mn[gl_SubgroupID] = gm; bt_mx[gl_SubgroupID] = tm; }
        barrier();
        uint lo = bt_mn[0], hi = bt_mx[0];
        for (uint i = 1u; i < gl_NumSubgroups; i++) { lo = min(lo, bt_mn[i]); hi = max(hi, bt_mx[i]); }
        // the KC-th key's range; n: the entries in it (BLOCK: not counted, where lo == hi at once)
        const uvec4 k = narrow(key, tid, false, 0u, lo, hi, 0u, KC, BIN_SMALL, BLOCK);
        // where too many tie at the KC-th key T (then k.x == k.y == T), the need lowest indices of
        // the tied entries: J, the largest index kept
        uint J = BLOCK;
        if (k.z + k.w > RANK_CAP) {
            const uvec4 ix = narrow(key, tid, true, k.x, 0u, BLOCK - 1u, 0u, KC - k.z, 0u, BLOCK);
            J = BLOCK - 1u - ix.x;
        }
        [[unroll]] for (uint r = 0u; r < RMAX; r++) {
            const uint j = tid + r * WG;
            if (j < BLOCK && (J == BLOCK ? key[r] >= k.x : (key[r] > k.x || (key[r] == k.x && j <= J)))) {
                const uint slot = atomicAdd(bt_n, 1u);
                if (slot < RANK_CAP) big[slot] = uvec2(key[r], b * BLOCK + j);
            }
        }
        barrier();
        const uint C = min(bt_n, RANK_CAP);   // (never more: the tie path leaves exactly KC)
        for (uint i = tid; i < C; i += WG) {
            const uvec2 c = big[i];
            uint rank = 0u;
            // (not rank_in_big: (key, block index) are distinct here, so no tie check in the loop)
            for (uint u = 0u; u < C; u++) rank += before(big[u], c) ? 1u : 0u;
            if (rank < KC) cand[COFF + b * KC + rank] = uvec2(c.x, c.y < pc.vocab ? c.y : 0xFFFFFFFFu);
        }
        return;
    }
    sort_block(b, tid);
    for (uint r = tid; r < KC; r += WG) cand[COFF + b * KC + r] = big[r];
}

// rank of entry i among big[0..n) (key desc, id asc), equal entries (the padding) by slot
uint rank_in_big(uint i, uint n) {
    const uvec2 c = big[i];
    uint r = 0u;
    for (uint j = 0u; j < n; j++) {
        const uvec2 x = big[j];
        r += (before(x, c) || (x == c && j < i)) ? 1u : 0u;
    }
    return r;
}

void main() {
    SKIP_OTHER_ROWS(1u)
    const uint tid = gl_LocalInvocationID.x, NB = pc.n_blocks;
    block_top(gl_WorkGroupID.x, tid);
    if (!arrive_last(AOFF, NB)) return;

    // the last block: the final pass over every block's list
    // one read of the step buffer (it may live in host memory: every access can cross PCIe)
    const Step st = step;
    const bool greedy = st.temperature <= 0.0;
    const uint q = st.pos + st.n_tokens;
    uint K = (st.top_k == 0u || st.top_k > KC) ? KC : st.top_k;
    if (greedy) K = 1u;

    // Fast path: the K-th largest key is at least L = max over blocks of the block's K-th key
    // (that block alone holds K keys >= L), and every global top-K entry is in its block's list.
    // Usually few entries are >= L: gather them all and sort them in shared memory.
    // Gathered in any order (slots by a shared counter): the sort below orders them.
    uint lb = 0u;
    if (tid == 0) n_big_sh = 0u;
    for (uint b = tid; b < NB; b += WG) lb = max(lb, cand[COFF + b * KC + K - 1u].x);
    const uint L = wg_max_u(lb);
    for (uint b = tid; b < NB; b += WG) {
        const uint n = count_ge(b, L);
        const uint base = atomicAdd(n_big_sh, n);
        for (uint r = 0; r < n && base + r < CAP; r++) big[base + r] = cand[COFF + b * KC + r];
    }
    barrier();
    const uint C = n_big_sh;
    if (C <= RANK_CAP) {   // each entry placed by its rank (one barrier, no sorting network)
        for (uint i = tid; i < KC; i += WG) if (i >= K) sel[i] = uvec2(0u, 0xFFFFFFFFu);
        for (uint i = tid; i < C; i += WG) {
            const uint r = rank_in_big(i, C);
            if (r < K) sel[r] = big[i];
        }
        barrier();
    } else if (C <= CAP) {
        uint P = 2u;
        while (P < C) P <<= 1;
        for (uint i = C + tid; i < P; i += WG) big[i] = uvec2(0u, 0xFFFFFFFFu);
        barrier();
        for (uint k = 2; k <= P; k <<= 1) {
            for (uint j = k >> 1; j > 0; j >>= 1) {
                for (uint p = tid; p < P / 2; p += WG) {
                    const uint i = 2 * j * (p / j) + p % j, ixj = i + j;
                    const uvec2 x = big[i], y = big[ixj];
                    if ((i & k) == 0 ? before(y, x) : before(x, y)) { big[i] = y; big[ixj] = x; }
                }
                barrier();
            }
        }
        for (uint i = tid; i < KC; i += WG) sel[i] = i < K ? big[i] : uvec2(0u, 0xFFFFFFFFu);
        barrier();
    } else {
    // Fallback (more than CAP entries >= L, e.g. flat logits): radix select of the K-th largest
    // key T. Only entries >= L matter, and T lies in [L, U] (U = the largest key), so the rounds
    // start below the bits L and U share; 8 bits a round, a shared histogram of the entries
    // >= L (spread over the buckets: few atomics collide), the candidate list streamed once a round.
    uint ub = 0u;
    for (uint b = tid; b < NB; b += WG) ub = max(ub, cand[COFF + b * KC].x);
    const uint U = wg_max_u(ub);
    int top = int(findMSB(L ^ U));                 // highest bit where L and U differ (-1: equal)
    uint prefix = L;                              // bits above `top` (all of L when L == U)
    if (top == 31) prefix = 0u;
    else if (top >= 0) prefix = L & ~((2u << uint(top)) - 1u);
    uint need = K;
    while (top >= 0) {
        const uint width = uint(min(8, top + 1));
        const uint shift = uint(top + 1) - width;
        uint above = 0u;
        if (top < 31) above = ~((2u << uint(top)) - 1u);
        for (uint i = tid; i < 256u; i += WG) hist[i] = 0u;
        barrier();
        for (uint e = tid; e < NB * KC; e += WG) {
            const uint key = cand[COFF + e].x;
            if (key >= L && (key & above) == prefix) atomicAdd(hist[(key >> shift) & ((1u << width) - 1u)], 1u);
        }
        barrier();
        if (tid == 0) {
            uint acc = 0u;
            for (int bk = int((1u << width) - 1u); bk >= 0; bk--) {
                if (acc + hist[bk] >= need) { prefix |= uint(bk) << shift; need -= acc; break; }
                acc += hist[bk];
            }
            radix_sh = uvec2(prefix, need);
        }
        barrier();
        prefix = radix_sh.x;
        need = radix_sh.y;
        top -= int(width);
    }
    const uint T = prefix;
    for (uint b = tid; b < NB; b += WG) {
        const uint ge = count_ge(b, T);
        const uint gt = T == 0xFFFFFFFFu ? 0u : count_ge(b, T + 1u);
        gt_off[b] = gt;
        eq_off[b] = ge - gt;
    }
    barrier();
    if (tid == 0) {   // serial scans over <= NBMAX blocks: cheap next to the bisection
        uint total_gt = 0u;
        for (uint b = 0; b < NB; b++) { uint g = gt_off[b]; gt_off[b] = total_gt; total_gt += g; }
        uint need = K - total_gt, acc = 0u;
        for (uint b = 0; b < NB; b++) {
            const uint e = eq_off[b];
            eq_take[b] = min(e, need - min(need, acc));
            eq_off[b] = total_gt + acc;
            acc += e;
        }
    }
    for (uint i = tid; i < KC; i += WG) sel[i] = uvec2(0u, 0xFFFFFFFFu);
    barrier();
    for (uint b = tid; b < NB; b += WG) {
        const uint g0 = gt_off[b];
        const uint n_gt = T == 0xFFFFFFFFu ? 0u : count_ge(b, T + 1u);
        for (uint r = 0; r < n_gt; r++) sel[g0 + r] = cand[COFF + b * KC + r];
        for (uint r = 0; r < eq_take[b]; r++) sel[eq_off[b] + r] = cand[COFF + b * KC + n_gt + r];
    }
    barrier();
    // sort the K (padded to KC) candidates, descending
    for (uint k = 2; k <= KC; k <<= 1) {
        for (uint j = k >> 1; j > 0; j >>= 1) {
            for (uint p = tid; p < KC / 2; p += WG) {
                const uint i = 2 * j * (p / j) + p % j, ixj = i + j;
                const uvec2 x = sel[i], y = sel[ixj];
                if ((i & k) == 0 ? before(y, x) : before(x, y)) { sel[i] = y; sel[ixj] = x; }
            }
            barrier();
        }
    }
    }   // fallback
    if (tid == 0) {
        const float top = key_value(sel[0].x);
        const float inv_t = greedy ? 1.0 : 1.0 / st.temperature;
        float total = 0.0;
        for (uint i = 0; i < K; i++) {
            const float p = greedy ? (i == 0 ? 1.0 : 0.0) : exp((key_value(sel[i].x) - top) * inv_t);
            prob[i] = p;
            total += p;
        }
        uint n_keep = K;
        if (st.top_p < 1.0) {
            float c = 0.0;
            for (uint i = 0; i < K; i++) {
                c += prob[i];
                if (c >= st.top_p * total) { n_keep = i + 1; break; }
            }
        }
        if (st.min_p > 0.0) {
            for (uint i = 1; i < n_keep; i++) if (prob[i] < st.min_p * prob[0]) { n_keep = i; break; }
        }
        float kept = 0.0;
        for (uint i = 0; i < n_keep; i++) kept += prob[i];
        n_keep_sh = n_keep;
        kept_sum_sh = kept;
    }
    barrier();
    const uint n_keep = n_keep_sh;
    for (uint d = tid; d < pc.n_draws; d += WG) {
        const uvec2 r = philox2x32_10(uvec2(q + d, 0u), st.seed);
        const float u = float(r.x >> 8) * (1.0 / 16777216.0) * kept_sum_sh;
        uint chosen = n_keep - 1u;
        float c = 0.0;
        for (uint i = 0; i < n_keep; i++) {
            c += prob[i];
            if (u < c) { chosen = i; break; }
        }
        tokens[step.tok_base + q + d] = sel[chosen].y;
    }
    barrier();   // every invocation has read step before it may change
    if (tid == 0) advance_step(q);
}
#endif

#ifdef SAMPLE_FULL
#define NBMAX 512         // blocks (vocab <= NBMAX * BLOCK; ops_sample checks)
shared float tsum[WG];
shared float scale_sh[NBMAX];   // exp((block max - global max) / T): a block's sums -> the global scale
shared uint nk_sh[NBMAX];       // entries of each block's sorted list in the top-k set
shared uint keep_sh[NBMAX];     // ... kept after top-p and min-p
shared uint a_sh[NBMAX];
shared uint b_sh[NBMAX];
shared float cb_sh[NBMAX];      // a block's kept mass, on the global scale
shared float incl_sh[NBMAX];    // running sum of cb_sh over blocks 0..b
shared float total_sh;

// entries of block b's sorted list (cand[COFF + b * BLOCK ...]) with key >= x
uint count_ge_block(uint b, uint x) {
    uint lo = 0, hi = BLOCK;
    while (lo < hi) {
        const uint mid = (lo + hi) / 2;
        if (cand[COFF + b * BLOCK + mid].x >= x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// the sum of the weights of the first j entries of block b's sorted list (relative to its max)
float mass_before(uint b, uint j) {
    if (j == 0u) return 0.0;
    const uint e = b * BLOCK + j - 1u;
    return uintBitsToFloat(cand[COFF + pc.n_blocks * BLOCK + e / 2u][e % 2u]);
}

float weight(uint key, float top, float inv_t) {
    return key == 0u ? 0.0 : exp((key_value(key) - top) * inv_t);   // NaN logits weigh nothing
}

void main() {
    SKIP_OTHER_ROWS(2u)
    const uint tid = gl_LocalInvocationID.x, NB = pc.n_blocks, blk = gl_WorkGroupID.x;
    sort_block(blk, tid);
    {   // the block's list and the running sums of its weights (each invocation: E entries)
        const float temp = step.temperature;
        const float inv_t = temp > 0.0 ? 1.0 / temp : 0.0;
        const float top = key_value(big[0].x);
        const uint E = BLOCK / WG, first = tid * E;
        float s = 0.0;
        for (uint j = 0; j < E; j++) s += weight(big[first + j].x, top, inv_t);
        tsum[tid] = s;
        barrier();
        for (uint d = 1; d < WG; d <<= 1) {   // inclusive scan of the invocations' sums
            const float v = tsum[tid] + (tid >= d ? tsum[tid - d] : 0.0);
            barrier();
            tsum[tid] = v;
            barrier();
        }
        float run = tid > 0u ? tsum[tid - 1u] : 0.0;
        for (uint j = 0; j < E; j += 2u) {
            const float r0 = run + weight(big[first + j].x, top, inv_t);
            run = r0 + weight(big[first + j + 1u].x, top, inv_t);
            cand[COFF + NB * BLOCK + (blk * BLOCK + first + j) / 2u] = uvec2(floatBitsToUint(r0), floatBitsToUint(run));
        }
        for (uint i = tid; i < BLOCK; i += WG) cand[COFF + blk * BLOCK + i] = big[i];
    }
    if (!arrive_last(AOFF, NB)) return;

    // the last block: the cuts, then the draw
    const Step st = step;
    const uint q = st.pos + st.n_tokens;
    uint mk = 0u;
    for (uint b = tid; b < NB; b += WG) mk = max(mk, cand[COFF + b * BLOCK].x);
    const uint M = wg_max_u(mk);
    uint nb = 0u;   // the first block holding the largest key: its first entry is the top token
    for (uint b = tid; b < NB; b += WG) if (cand[COFF + b * BLOCK].x == M) nb = max(nb, ~b);
    const uint btop = ~wg_max_u(nb);
    if (st.temperature <= 0.0) {   // greedy: the argmax (ties -> lowest id)
        if (tid == 0) for (uint d = 0; d < pc.n_draws; d++) tokens[step.tok_base + q + d] = cand[COFF + btop * BLOCK].y;
        barrier();
        if (tid == 0) advance_step(q);
        return;
    }
    const float inv_t = 1.0 / st.temperature, top = key_value(M);
    for (uint b = tid; b < NB; b += WG) scale_sh[b] = weight(cand[COFF + b * BLOCK].x, top, inv_t);

    // top-k: T = the K-th largest key; every entry above it, then ties at it by lowest id
    const uint K = (st.top_k == 0u || st.top_k >= pc.vocab) ? pc.vocab : st.top_k;
    if (K >= pc.vocab) {
        for (uint b = tid; b < NB; b += WG) nk_sh[b] = BLOCK;   // past the vocabulary: weight 0
    } else {
        uint T = 0u;
        for (int bit = 31; bit >= 0; bit--) {
            const uint probe = T | (1u << uint(bit));
            uint n = 0u;
            for (uint b = tid; b < NB; b += WG) n += count_ge_block(b, probe);
            if (wg_sum_u(n) >= K) T = probe;
        }
        for (uint b = tid; b < NB; b += WG) {
            const uint gt = T == 0xFFFFFFFFu ? 0u : count_ge_block(b, T + 1u);
            a_sh[b] = gt;
            b_sh[b] = count_ge_block(b, T) - gt;
        }
        barrier();
        if (tid == 0) {
            uint above = 0u;
            for (uint b = 0; b < NB; b++) above += a_sh[b];
            const uint need = K - above;
            uint taken = 0u;
            for (uint b = 0; b < NB; b++) {
                const uint take = min(b_sh[b], need - taken);
                taken += take;
                nk_sh[b] = a_sh[b] + take;
            }
        }
    }
    barrier();
    for (uint b = tid; b < NB; b += WG) keep_sh[b] = nk_sh[b];
    barrier();

    // top-p: the largest key whose mass from the top reaches top_p of the top-k set's
    if (st.top_p < 1.0) {
        float z = 0.0;
        for (uint b = tid; b < NB; b += WG) z += scale_sh[b] * mass_before(b, nk_sh[b]);
        const float target = st.top_p * wg_sum(z);
        uint T = 0u;
        for (int bit = 31; bit >= 0; bit--) {
            const uint probe = T | (1u << uint(bit));
            float m = 0.0;
            for (uint b = tid; b < NB; b += WG) m += scale_sh[b] * mass_before(b, min(nk_sh[b], count_ge_block(b, probe)));
            if (wg_sum(m) >= target) T = probe;
        }
        for (uint b = tid; b < NB; b += WG) keep_sh[b] = min(nk_sh[b], count_ge_block(b, T));
        barrier();
    }
    // min-p: p >= min_p * p_max, a prefix of every sorted list
    if (st.min_p > 0.0) {
        for (uint b = tid; b < NB; b += WG) {
            uint lo = 0u, hi = keep_sh[b];
            while (lo < hi) {
                const uint mid = (lo + hi) / 2;
                if (weight(cand[COFF + b * BLOCK + mid].x, top, inv_t) >= st.min_p) lo = mid + 1; else hi = mid;
            }
            keep_sh[b] = lo;
        }
        barrier();
    }
    if (tid == 0) keep_sh[btop] = max(keep_sh[btop], 1u);   // the top token always stays
    barrier();
    for (uint b = tid; b < NB; b += WG) cb_sh[b] = scale_sh[b] * mass_before(b, keep_sh[b]);
    barrier();
    if (tid == 0) {
        float run = 0.0;
        for (uint b = 0; b < NB; b++) { run += cb_sh[b]; incl_sh[b] = run; }
        total_sh = run;
    }
    barrier();
    for (uint d = tid; d < pc.n_draws; d += WG) {
        const uvec2 r = philox2x32_10(uvec2(q + d, 0u), st.seed);
        const float u = float(r.x >> 8) * (1.0 / 16777216.0) * total_sh;
        uint lo = 0u, hi = NB;   // the first block whose running sum passes u
        while (lo < hi) {
            const uint mid = (lo + hi) / 2;
            if (incl_sh[mid] > u) hi = mid; else lo = mid + 1;
        }
        uint b = lo, j;
        if (b == NB) {   // rounding put u at the very end: the last kept entry
            b = NB - 1u;
            while (b > 0u && cb_sh[b] == 0.0) b--;
            j = max(keep_sh[b], 1u) - 1u;
        } else {
            const float v = u - (incl_sh[b] - cb_sh[b]);
            uint l2 = 0u, h2 = keep_sh[b] - 1u;   // the first entry whose running sum passes v
            while (l2 < h2) {
                const uint mid = (l2 + h2) / 2;
                if (scale_sh[b] * mass_before(b, mid + 1u) > v) h2 = mid; else l2 = mid + 1;
            }
            j = l2;
        }
        tokens[step.tok_base + q + d] = cand[COFF + b * BLOCK + j].y;
    }
    barrier();   // every invocation has read step before it may change
    if (tid == 0) advance_step(q);
}
#endif

#ifdef SAMPLE_PENALTY
#include "include/step.glsl"
STEP_BUFFER(0)
layout(std430, binding = 1) buffer L { float logits[]; };
layout(std430, binding = 2) readonly buffer Tok { uint tokens[]; };
void main() {
    const Step st = step;
    if (st.rep_penalty == 1.0) return;
    const uint q = st.pos + st.n_tokens;
    const uint lo = q > st.rep_window ? q - st.rep_window : 0u;
    for (uint i = lo + gl_LocalInvocationID.x; i < q; i += WG) {
        const uint id = tokens[st.tok_base + i];
        bool first = id < pc.vocab;
        for (uint j = lo; j < i && first; j++) first = tokens[st.tok_base + j] != id;   // penalize each id once
        if (first) {
            const float l = logits[id];
            logits[id] = l > 0.0 ? l / st.rep_penalty : l * st.rep_penalty;
        }
    }
}
#endif
