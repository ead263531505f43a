// Shared by every kernel: extensions, helpers. Numerics: f32 everywhere outside the weights
// (Gemma 3 overflows f16 activations).
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

#define PASTE2(a, b) a##b
#define PASTE(a, b) PASTE2(a, b)

float gelu_tanh(float x) {
    const float k = 0.7978845608028654;   // sqrt(2/pi)
    float u = clamp(k * (x + 0.044715 * x * x * x), -15.0, 15.0);   // tanh() of a huge value is NaN on some drivers
    return 0.5 * x * (1.0 + tanh(u));
}

float half_lo(uint16_t v) { return unpackHalf2x16(uint(v)).x; }
float bf16(uint16_t v) { return uintBitsToFloat(uint(v) << 16); }
