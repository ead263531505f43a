// Handoff: a decode matvec recorded with no pipeline barrier after the small kernel whose output
// it reads (norm_add, attention, quantize) starts while that kernel still runs. The producer's
// workgroups count themselves in handoff[0] after their last writes; the last one sets
// handoff[1]. The consumer's workgroups first load the start of their own weight rows (pulling
// them toward the caches while the producer works: `sink` keeps the loads alive), then wait for
// handoff[1] and only then read the producer's output. Measured on an H100 (bench.dispatch_cost
// --handoff): a barrier costs ~2.3 us plus the next stream's ramp-up; a flag hides both and most
// of a short producer's run time.
//
// Why the spin is safe: a queue issues the producer's workgroups before any of the consumer's
// (dispatch order), so every producer workgroup is resident or done when a consumer spins, and
// the handoff always follows a barrier, so the consumer's caches hold no stale copy of what the
// producer writes. Vulkan does not promise that dispatch order, so handoffs can be turned off
// (PHOENIX_VULKAN_HANDOFF=0); every slot is zeroed at the start of the command buffer.
// Define HANDOFF_BINDING and HANDOFF_ID (a free constant_id) before including this file; call
// both functions from uniform control flow.
#ifndef HANDOFF_GLSL
#define HANDOFF_GLSL

layout(constant_id = HANDOFF_ID) const uint HANDOFF = 0u;   // 1: signal (producer) or wait (consumer)
layout(std430, binding = HANDOFF_BINDING) volatile coherent buffer Handoff { uint handoff[]; };

// producer: every workgroup, after its last write
void handoff_signal() {
    if (HANDOFF == 0u) return;
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        const uint total = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_NumWorkGroups.z;
        if (atomicAdd(handoff[0], 1u) == total - 1u) {
            memoryBarrierBuffer();
            atomicExchange(handoff[1], 1u);
        }
    }
}

// consumer: true while the producer still runs (worth loading weights early)
bool handoff_pending() {
    return HANDOFF != 0u && handoff[1] == 0u;
}

// consumer: before the first read of the producer's output. `sink`: what the early loads read
void handoff_wait(uint sink) {
    if (HANDOFF == 0u) return;
    if (gl_LocalInvocationIndex == 0u) {
        while (handoff[1] == 0u) {}
    }
    barrier();
    // every invocation then reads the flag itself (set by now) before its acquire barrier, so its
    // own reads of the producer's output are ordered after a read of the producer's release
    while (handoff[1] == 0u) {}
    memoryBarrierBuffer();
    if (sink == 0x9E3779B9u) handoff[2] = sink;   // never read: keeps the early loads from being dropped
}
#endif
