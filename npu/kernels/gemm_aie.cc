// AIE-ML (XDNA1, npu1) compute kernels for the Phoenix Chat GEMM designs (gemm_design.py).
//
// Compiled per tile shape with Peano (llvm-aie) by build.py:
//   clang++ -O2 -std=c++20 --target=aie2-none-unknown-elf -DNDEBUG -I <mlir-aie>/include
//           -DTILE_M=64 -DTILE_K=64 -DTILE_N=64 -c gemm_aie.cc
// NOT compiled by this project yet (no toolchain on the development machines): see docs/NPU.md.
//
// L1 layouts (the host packs them; npu/kernels/spec.py): A [m/r][k/s][r][s], B [k/s][n/t][s][t],
// C [m/r][n/t][r][t] — every MAC operand is one contiguous vector load.
// `matmul_*` accumulates onto C (zeroed once per output tile by `zero_*`), so the core loops over
// K tiles without touching C's layout.

#include <aie_api/aie.hpp>
#include <stdint.h>

#ifndef TILE_M
#define TILE_M 64
#endif
#ifndef TILE_K
#define TILE_K 64
#endif
#ifndef TILE_N
#define TILE_N 64
#endif

template <typename T, unsigned size>
static inline void zero_tile(T *__restrict c) {
  constexpr unsigned lanes = 256 / (8 * sizeof(T)) * 2;   // 512-bit stores
  static_assert(size % lanes == 0);
  const aie::vector<T, lanes> zeros = aie::zeros<T, lanes>();
  for (unsigned i = 0; i < size; i += lanes)
    chess_prepare_for_pipelining aie::store_v(c + i, zeros);
}

// C[m×n] += A[m×k] · B[k×n] on (r×s)·(s×t) micro-blocks.
template <typename Tin, typename Tout, typename Acc, unsigned r, unsigned s, unsigned t,
          unsigned m, unsigned k, unsigned n>
static inline void mac_tile(const Tin *__restrict a, const Tin *__restrict b, Tout *__restrict c) {
  using MMUL = aie::mmul<r, s, t, Tin, Tin, Acc>;
  static_assert(m % r == 0 && k % s == 0 && n % t == 0);
  constexpr unsigned mr = m / r, ks = k / s, nt = n / t;
  for (unsigned i = 0; i < mr; ++i)
    chess_loop_range(1, ) {
      for (unsigned j = 0; j < nt; ++j) {
        Tout *c_blk = c + (i * nt + j) * MMUL::size_C;
        MMUL acc(aie::load_v<MMUL::size_C>(c_blk));
        const Tin *a_blk = a + i * ks * MMUL::size_A;
        const Tin *b_blk = b + j * MMUL::size_B;
        for (unsigned p = 0; p < ks; ++p)
          chess_prepare_for_pipelining {
            acc.mac(aie::load_v<MMUL::size_A>(a_blk), aie::load_v<MMUL::size_B>(b_blk));
            a_blk += MMUL::size_A;
            b_blk += nt * MMUL::size_B;
          }
        aie::store_v(c_blk, acc.template to_vector<Tout>());
      }
    }
}

extern "C" {

// int8 × int8 → int32 (MAC shape 4×8×8, 32-bit accumulators). Scales are applied by the host.
void zero_i32(int32_t *c) { zero_tile<int32_t, TILE_M * TILE_N>(c); }

void matmul_i8_i32(const int8_t *a, const int8_t *b, int32_t *c) {
  mac_tile<int8, int32_t, acc32, 4, 8, 8, TILE_M, TILE_K, TILE_N>(a, b, c);
}

// bf16 × bf16 → f32 (MAC shape 4×8×4, f32 accumulators).
void zero_f32(float *c) { zero_tile<float, TILE_M * TILE_N>(c); }

void matmul_bf16_f32(const bfloat16 *a, const bfloat16 *b, float *c) {
  mac_tile<bfloat16, float, accfloat, 4, 8, 4, TILE_M, TILE_K, TILE_N>(a, b, c);
}

}  // extern "C"
