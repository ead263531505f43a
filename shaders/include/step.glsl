// The per-step values of the token step. The host writes them through a mapped pointer;
// kernels read them here, never from push constants (a recorded command buffer freezes those).
//
// Token flow: `tokens` (uint[n_slots * context_length]) holds the ids of every position of every
// KV slot; a sequence's ids start at step.tok_base (indices below are relative to it). Prefill: the host
// writes tokens[pos .. pos+n_tokens). Decode: the embedding reads tokens[step.pos], the sampler
// writes tokens[step.pos + 1], and the step's last kernel increments step.pos, so a replayed
// command buffer needs nothing from the host. The host reads the new id from `tokens`.
struct Step {
    uint pos;            // position of the first token of this submission
    uint n_tokens;       // tokens in this submission (1 for decode)
    uint seed;           // RNG seed; the sampler hashes (seed, pos)
    uint top_k;          // 0 = off
    float temperature;   // <= 0: greedy
    float top_p;         // 1 = off
    float min_p;         // 0 = off
    float rep_penalty;   // 1 = off
    uint rep_window;     // how many earlier tokens the penalty looks at
    uint flags;
    uint slot;           // KV slot: caches hold [slot][n_kv_heads][cache_slots][head_dim]
    uint tok_base;       // where this sequence's ids start in tokens (slot * context_length)
};
#define STEP_ROW_PAD 52

#ifdef STEP_ROWS
// A batched decode step (engine/backends/vulkan/batch.py): one Step per row, STEP_ROW_BYTES apart;
// `step` is the Step of row STEP_ROW (the kernel defines it, e.g. as a workgroup index).
struct StepRow { Step s; uint pad[STEP_ROW_PAD]; };
#define STEP_BUFFER(b) layout(binding = b) buffer StepBuf { StepRow step_rows[]; };
#define step step_rows[STEP_ROW].s
#else
#define STEP_BUFFER(b) layout(binding = b) buffer StepBuf { Step step; };
#endif
