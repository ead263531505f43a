// "The last-arriving workgroup finishes": a multi-workgroup op whose workgroups each write a
// partial result, then count themselves in an arrival counter; the workgroup that arrives last
// (sees n - 1) reads every partial and finishes the op (split-K reduce, final argmax/top-k)
// in the same dispatch, so the op needs no second dispatch and no barrier between the two.
//
// Memory model (GLSL without the Vulkan memory model): the partials and the counters live in
// `coherent` buffers; every invocation orders its partial writes before the count with
// memoryBarrierBuffer() and a barrier(), and the last workgroup orders its partial reads after
// it with another memoryBarrierBuffer(). The last workgroup puts the counter back to 0, so the
// counters (zeroed once when allocated) are 0 again when the dispatch ends: a recorded command
// buffer replays without host work, and ops separated by a pipeline barrier may share counters.
// Define ARRIVAL_BINDING (the counters' binding) before including this file. Call
// arrive_last from uniform control flow; its result is uniform over the workgroup.
#ifndef LAST_ARRIVAL_GLSL
#define LAST_ARRIVAL_GLSL

layout(std430, binding = ARRIVAL_BINDING) coherent buffer Arrival { uint arrival[]; };

shared bool arrival_last_sh;

// counts this workgroup in arrival[counter]; true in the last of n workgroups to arrive
bool arrive_last(uint counter, uint n) {
    memoryBarrierBuffer();    // this invocation's partial writes are visible device-wide ...
    barrier();                // ... for every invocation of the workgroup, before the count
    if (gl_LocalInvocationIndex == 0) {
        const bool last = atomicAdd(arrival[counter], 1u) == n - 1u;
        if (last) arrival[counter] = 0u;
        arrival_last_sh = last;
    }
    barrier();
    const bool last = arrival_last_sh;
    memoryBarrierBuffer();    // the partial reads that follow come after the count
    return last;
}
#endif
