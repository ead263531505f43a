#version 450
// Probe for `python -m bench.int_dot_rate`: the arithmetic rate of one instruction kind, each
// invocation running CHAINS independent accumulators through pc.iters rounds (independent chains:
// the issue rate, not the latency, is timed). OP 0: packed int8 dot (OpSDot) then an integer add,
// as the engine's int8 kernels write it; OP 1: OpSDotAccSat (the dot with its accumulate in one
// instruction); OP 2: f32 fma; OP 3: f16vec2 fma (two halves an instruction). One result per
// invocation is stored so nothing is optimised away.
#extension GL_EXT_spirv_intrinsics : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int fmt);
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4453)
int sdot4x8_acc_sat(uint a, uint b, int acc, spirv_literal int fmt);

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(constant_id = 1) const uint OP = 0;
const uint CHAINS = 8;

PUSH_CONSTANTS

layout(binding = 0) writeonly buffer O { uint o[]; };

void main() {
    const uint g = gl_GlobalInvocationID.x;
    uint a = g * 2654435761u + pc.seed, b = a ^ 0x5bd1e995u;
    if (OP <= 1u) {
        int acc[CHAINS];
        [[unroll]] for (uint c = 0u; c < CHAINS; c++) acc[c] = int(c);
        for (uint r = 0u; r < pc.iters; r++) {
            [[unroll]] for (uint c = 0u; c < CHAINS; c++) {
                if (OP == 0u) acc[c] = sdot4x8(a + c, b, 0) + acc[c];
                else acc[c] = sdot4x8_acc_sat(a + c, b, acc[c], 0);
            }
            b += 0x01010101u;
        }
        int s = 0;
        [[unroll]] for (uint c = 0u; c < CHAINS; c++) s += acc[c];
        o[g] = uint(s);
    } else if (OP == 2u) {
        float acc[CHAINS];
        const float x = float(a & 255u) * 1e-3, y = float(b & 255u) * 1e-3;
        [[unroll]] for (uint c = 0u; c < CHAINS; c++) acc[c] = float(c);
        for (uint r = 0u; r < pc.iters; r++) {
            [[unroll]] for (uint c = 0u; c < CHAINS; c++) acc[c] = fma(acc[c], x, y);
        }
        float s = 0.0;
        [[unroll]] for (uint c = 0u; c < CHAINS; c++) s += acc[c];
        o[g] = floatBitsToUint(s);
    } else {
        f16vec2 acc[CHAINS];
        const f16vec2 x = f16vec2(float16_t(float(a & 255u) * 1e-3)), y = f16vec2(float16_t(float(b & 255u) * 1e-3));
        [[unroll]] for (uint c = 0u; c < CHAINS; c++) acc[c] = f16vec2(float16_t(c));
        for (uint r = 0u; r < pc.iters; r++) {
            [[unroll]] for (uint c = 0u; c < CHAINS; c++) acc[c] = fma(acc[c], x, y);
        }
        f16vec2 s = f16vec2(0.0);
        [[unroll]] for (uint c = 0u; c < CHAINS; c++) s += acc[c];
        o[g] = packFloat2x16(s);
    }
}
