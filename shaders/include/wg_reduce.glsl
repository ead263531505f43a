// Workgroup reductions for the norm/rope/attention/sample kernels: subgroup ops first, then one
// shared slot per subgroup. Works for any subgroup size (8 on lavapipe, 32 NVIDIA, 32/64 AMD);
// the summation order is fixed, so results are deterministic run to run.
// Call from uniform control flow only (contains barriers).
#ifndef WG_REDUCE_GLSL
#define WG_REDUCE_GLSL
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

#ifndef WG_REDUCE_MAX_SUBGROUPS   // an includer with bigger workgroups may raise it
#define WG_REDUCE_MAX_SUBGROUPS 128
#endif
shared float wg_red_f[WG_REDUCE_MAX_SUBGROUPS];
shared uint wg_red_u[WG_REDUCE_MAX_SUBGROUPS];

float wg_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) wg_red_f[gl_SubgroupID] = v;
    barrier();
    float s = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) s += wg_red_f[i];
    barrier();
    return s;
}

float wg_max(float v) {
    v = subgroupMax(v);
    if (subgroupElect()) wg_red_f[gl_SubgroupID] = v;
    barrier();
    float s = wg_red_f[0];
    for (uint i = 1; i < gl_NumSubgroups; i++) s = max(s, wg_red_f[i]);
    barrier();
    return s;
}

uint wg_sum_u(uint v) {
    v = subgroupAdd(v);
    if (subgroupElect()) wg_red_u[gl_SubgroupID] = v;
    barrier();
    uint s = 0;
    for (uint i = 0; i < gl_NumSubgroups; i++) s += wg_red_u[i];
    barrier();
    return s;
}

uint wg_max_u(uint v) {
    v = subgroupMax(v);
    if (subgroupElect()) wg_red_u[gl_SubgroupID] = v;
    barrier();
    uint s = wg_red_u[0];
    for (uint i = 1; i < gl_NumSubgroups; i++) s = max(s, wg_red_u[i]);
    barrier();
    return s;
}
#endif
