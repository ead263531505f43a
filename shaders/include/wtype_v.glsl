// A fused QKV whose v matrix has a type of its own (llama.cpp's Q4_K_M keeps Gemma's v at Q8_0
// beside Q5_0 q/k where a row is not a whole K-quant super-block, or at Q6_K beside Q4_K):
// matvec.comp includes this before binding 2's block decoder, which is then built for
// V_WTYPE_*. The block-pair path needs one type throughout, so it is off in such a kernel.
#undef WTYPE_F32
#undef WTYPE_F16
#undef WTYPE_BF16
#undef WTYPE_Q8_0
#undef WTYPE_Q4_0
#undef WTYPE_Q5_0
#undef WTYPE_Q4_K
#undef WTYPE_Q5_K
#undef WTYPE_Q6_K
#undef WTYPE_Q4_1
#undef WTYPE_Q5_1
#undef WTYPE_IQ4_NL
#undef WTYPE_IQ4_XS
#undef WTYPE_Q2_K
#undef WTYPE_Q3_K
#undef HAS_PAIRS
#undef PAIR_WORDS
#undef QWORDS
#if defined(V_WTYPE_Q8_0)
#define WTYPE_Q8_0
#elif defined(V_WTYPE_Q5_0)
#define WTYPE_Q5_0
#elif defined(V_WTYPE_Q4_K)
#define WTYPE_Q4_K
#elif defined(V_WTYPE_Q5_K)
#define WTYPE_Q5_K
#elif defined(V_WTYPE_Q6_K)
#define WTYPE_Q6_K
#else
#error "MIXED_V: V_WTYPE_* names no supported type"
#endif
