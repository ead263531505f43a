#version 450
// Which (K slot, row) each lane's element of a 16 x 16 f16 "B" fragment is, as the driver lays it
// out: a 16 x 16 matrix whose element (k, n) holds n * 16 + k is loaded column-major, and every
// lane writes its elements' values. ops_gemm.cf_direct_layout reads them once per device: the
// CF_DIRECT few-token tiles build such fragments in registers from the weights' bytes, so they
// run only where this layout is the one they are compiled for (the driver does not promise any).
// One subgroup of 32 lanes. Binding 0: 32 x 8 values, then the fragment's length per lane.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#include "include/common.glsl"

layout(local_size_x = 32) in;
layout(binding = 0) writeonly buffer O { float o[]; };

shared float16_t idx[256];

void main() {
    const uint lane = gl_LocalInvocationID.x;
    for (uint i = lane; i < 256u; i += 32u) idx[i] = float16_t(float(i));
    barrier();
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
    coopMatLoad(b, idx, 0, 16, gl_CooperativeMatrixLayoutColumnMajor);
    for (int e = 0; e < b.length() && e < 8; e++) o[lane * 8u + uint(e)] = float(b[e]);
    if (lane == 0u) o[256] = float(b.length());
}
