#version 450
// The last real token's row moved to row 0, in place: a prefill recorded for more tokens than it
// runs (its chunk rounded up to a bucket, VulkanBackend._prefill) hands the LM head that row
// where the recording put the head's input, whatever step.n_tokens the replay brings.
// 32-bit words, so f32 rows (h) and rows of q8_1 blocks (hq) alike; only row 0 is written.
// Bindings: 0 step, 1 rows (u32).  Push: row_words.  Dispatch: (ceil(row_words / WG), 1, 1).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;

PUSH_CONSTANTS

#extension GL_GOOGLE_include_directive : require
#include "include/common.glsl"
#include "include/step.glsl"
STEP_BUFFER(0)
layout(std430, binding = 1) buffer R { uint rows[]; };

void main() {
    const uint i = gl_GlobalInvocationID.x;
    const uint last = step.n_tokens - 1u;   // a prefill has n_tokens >= 1
    if (i >= pc.row_words || last == 0u) return;   // one token: its row is row 0 already
    rows[i] = rows[last * pc.row_words + i];       // rows 0 and last never overlap
}
