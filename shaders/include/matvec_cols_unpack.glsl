// One 32-weight chunk of a row unpacked for the multi-column int8 matvec (matvec_cols.comp):
// q: 32 signed int8 values packed 4 per word, in the order of the x block's values; with the x
// block's q8_1 values xq, scale dx and sum sx:
//   sum(w x) = dx (d0 q[0..15].xq[0..15] + d1 q[16..31].xq[16..31]) + m0 sx            (most types)
//   sum(w x) = dx (d0 S0 + d1 S1 + m0 sum(xq[0..15]) + m1 sum(xq[16..31]))           (Q2_K's mins)
// Unpacked once per row and chunk, then dotted with every vector's block.
#ifndef MATVEC_COLS_UNPACK_GLSL
#define MATVEC_COLS_UNPACK_GLSL
struct CHUNK {
    uint q[8];
    float d0, d1, m0, m1;
};

// packed bytes 0..63 minus a constant k < 64 per byte, as signed int8 (SWAR: no borrow crosses bytes)
uint bytes_minus(uint u, uint k4) { return ((u | 0x80808080u) - k4) ^ 0x80808080u; }
#endif
