// The multi-column int8 matvec's chunk decoder for one weight binding (W16 / W32, names FN(...)),
// included after matvec_dot.glsl for that binding: FN(unpack_chunk) reads chunk c of a row into a
// CHUNK (include/matvec_cols_unpack.glsl), FN(chunk_i8) dots it with one q8_1 block of x at word xb.
// The bit layouts are those of matvec_dot.glsl's int8 chunk_dot, per type.

void FN(unpack_chunk)(uint row, uint c, uint n_cols, out CHUNK u) {
    u.m0 = 0.0;
    u.m1 = 0.0;
#if defined(WTYPE_Q8_0)
    const uint b = (row * (n_cols >> 5) + c) * 17u;
    u.d0 = half_lo(W16[b]);
    u.d1 = u.d0;
    [[unroll]] for (uint i = 0u; i < 8u; i++) u.q[i] = uint(W16[b + 1u + 2u * i]) | (uint(W16[b + 2u + 2u * i]) << 16);
#elif defined(WTYPE_Q4_0) || defined(WTYPE_Q4_1) || defined(WTYPE_IQ4_NL) || defined(WTYPE_IQ4_XS)
#if defined(WTYPE_Q4_0)
    const uint b = (row * (n_cols >> 5) + c) * 9u;
    u.d0 = half_lo(W16[b]);
    u.m0 = -8.0 * u.d0;
    const uint qo = b + 1u;
#elif defined(WTYPE_Q4_1)
    const uint b = (row * (n_cols >> 5) + c) * 10u;
    u.d0 = half_lo(W16[b]);
    u.m0 = half_lo(W16[b + 1u]);
    const uint qo = b + 2u;
#elif defined(WTYPE_IQ4_NL)
    const uint b = (row * (n_cols >> 5) + c) * 9u;
    u.d0 = half_lo(W16[b]);
    const uint qo = b + 1u;
#else
    const uint b = (row * (n_cols >> 8) + (c >> 3)) * 68u;
    u.d0 = half_lo(W16[b]) * FN(iq4xs_scale)(b, c & 7u);
    const uint qo = b + 4u + 8u * (c & 7u);
#endif
    u.d1 = u.d0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        const uint w = uint(W16[qo + 2u * i]) | (uint(W16[qo + 2u * i + 1u]) << 16);
#if defined(WTYPE_IQ4_NL) || defined(WTYPE_IQ4_XS)
        u.q[i] = iq4_bytes(w);
        u.q[4u + i] = iq4_bytes(w >> 4);
#else
        u.q[i] = w & 0x0F0F0F0Fu;
        u.q[4u + i] = (w >> 4) & 0x0F0F0F0Fu;
#endif
    }
#elif defined(WTYPE_Q5_0) || defined(WTYPE_Q5_1)
#if defined(WTYPE_Q5_0)
    const uint b = (row * (n_cols >> 5) + c) * 11u;
    u.d0 = half_lo(W16[b]);
    u.m0 = -16.0 * u.d0;
    const uint qh = uint(W16[b + 1u]) | (uint(W16[b + 2u]) << 16);
    const uint qo = b + 3u;
#else
    const uint b = (row * (n_cols >> 5) + c) * 12u;
    u.d0 = half_lo(W16[b]);
    u.m0 = half_lo(W16[b + 1u]);
    const uint qh = uint(W16[b + 2u]) | (uint(W16[b + 3u]) << 16);
    const uint qo = b + 4u;
#endif
    u.d1 = u.d0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        const uint w = uint(W16[qo + 2u * i]) | (uint(W16[qo + 2u * i + 1u]) << 16);
        const uint hl = qh >> (4u * i);
        const uint hh = qh >> (4u * i + 16u);
        const uint bl = ((hl & 1u) << 4) | ((hl & 2u) << 11) | ((hl & 4u) << 18) | ((hl & 8u) << 25);
        const uint bh = ((hh & 1u) << 4) | ((hh & 2u) << 11) | ((hh & 4u) << 18) | ((hh & 8u) << 25);
        u.q[i] = (w & 0x0F0F0F0Fu) | bl;
        u.q[4u + i] = ((w >> 4) & 0x0F0F0F0Fu) | bh;
    }
#elif defined(WTYPE_Q2_K) || defined(WTYPE_Q3_K)
    const uint ib = c & 7u, h = ib >> 2, sh = 2u * (ib & 3u);
#if defined(WTYPE_Q2_K)
    const uint w0 = (row * (n_cols >> 8) + (c >> 3)) * 42u;
    const uint qo = w0 + 8u + 16u * h;
    const float d = half_lo(W16[w0 + 40u]), dmin = half_lo(W16[w0 + 41u]);
    const uint sc0 = FN(byte)(2u * w0 + 2u * ib), sc1 = FN(byte)(2u * w0 + 2u * ib + 1u);
    u.d0 = d * float(sc0 & 15u);
    u.d1 = d * float(sc1 & 15u);
    u.m0 = -dmin * float(sc0 >> 4);
    u.m1 = -dmin * float(sc1 >> 4);
#else
    const uint w0 = (row * (n_cols >> 8) + (c >> 3)) * 55u;
    const uint qo = w0 + 16u + 16u * h;
    const float d = half_lo(W16[w0 + 54u]);
    u.d0 = d * FN(q3k_scale)(2u * w0 + 96u, 2u * ib);
    u.d1 = d * FN(q3k_scale)(2u * w0 + 96u, 2u * ib + 1u);
#endif
    [[unroll]] for (uint k = 0u; k < 8u; k++) {
        const uint lw = uint(W16[qo + 2u * k]) | (uint(W16[qo + 2u * k + 1u]) << 16);
        uint v = (lw >> sh) & 0x03030303u;
#if defined(WTYPE_Q3_K)
        const uint hw = uint(W16[w0 + 2u * k]) | (uint(W16[w0 + 2u * k + 1u]) << 16);
        v = bytes_minus(v | (((hw >> ib) & 0x01010101u) << 2), 0x04040404u);
#endif
        u.q[k] = v;
    }
#elif defined(WTYPE_Q4_K) || defined(WTYPE_Q5_K)
#if defined(WTYPE_Q4_K)
    const uint BW = 72u, QS = 16u;
#else
    const uint BW = 88u, QS = 48u;
#endif
    const uint j = c & 7u;
    const uint w0 = (row * (n_cols >> 8) + (c >> 3)) * BW;
    float sc, m;
    FN(scale_min)(w0 * 2u + 4u, j, sc, m);
    u.d0 = half_lo(W16[w0]) * sc;
    u.d1 = u.d0;
    u.m0 = -half_lo(W16[w0 + 1u]) * m;
    const uint qw = w0 + QS / 2u + (j >> 1) * 16u;
    const uint shift = (j & 1u) * 4u;
    [[unroll]] for (uint k = 0u; k < 8u; k++) {
        const uint w = uint(W16[qw + 2u * k]) | (uint(W16[qw + 2u * k + 1u]) << 16);
        uint q = (w >> shift) & 0x0F0F0F0Fu;
#if defined(WTYPE_Q5_K)
        const uint hb = uint(W16[w0 + 8u + 2u * k]) | (uint(W16[w0 + 9u + 2u * k]) << 16);
        q |= ((hb >> j) & 0x01010101u) << 4;
#endif
        u.q[k] = q;
    }
#elif defined(WTYPE_Q6_K)
    const uint w0 = (row * (n_cols >> 8) + (c >> 3)) * 105u;
    const uint h = (c & 7u) >> 2, q = c & 3u;
    const float d = half_lo(W16[w0 + 104u]);
    const uint ql = w0 + 32u * h + (q & 1u) * 16u;
    const uint qh = w0 + 64u + 16u * h;
    const uint nsh = (q >> 1) * 4u, hsh = 2u * q;
    u.d0 = d * float(int(FN(byte)(w0 * 2u + 192u + 8u * h + 2u * q) << 24) >> 24);
    u.d1 = d * float(int(FN(byte)(w0 * 2u + 192u + 8u * h + 1u + 2u * q) << 24) >> 24);
    [[unroll]] for (uint k = 0u; k < 8u; k++) {
        const uint lw = uint(W16[ql + 2u * k]) | (uint(W16[ql + 2u * k + 1u]) << 16);
        const uint hw = uint(W16[qh + 2u * k]) | (uint(W16[qh + 2u * k + 1u]) << 16);
        u.q[k] = bytes_minus(((lw >> nsh) & 0x0F0F0F0Fu) | (((hw >> hsh) & 0x03030303u) << 4), 0x20202020u);
    }
#else
#error "matvec_cols: unsupported weight type"
#endif
}

float FN(chunk_i8)(CHUNK u, uint xb) {
    int s0 = 0, s1 = 0;
    [[unroll]] for (uint k = 0u; k < 4u; k++) {
        s0 = sdot4x8(u.q[k], xq[xb + k], 0) + s0;
        s1 = sdot4x8(u.q[4u + k], xq[xb + 4u + k], 0) + s1;
    }
    const float dx = uintBitsToFloat(xq[xb + 8u]);
#if defined(WTYPE_Q2_K)
    int h0 = 0, h1 = 0;
    [[unroll]] for (uint k = 0u; k < 4u; k++) {
        h0 = sdot4x8(0x01010101u, xq[xb + k], 0) + h0;
        h1 = sdot4x8(0x01010101u, xq[xb + 4u + k], 0) + h1;
    }
    return dx * (u.d0 * float(s0) + u.d1 * float(s1) + u.m0 * float(h0) + u.m1 * float(h1));
#else
    return dx * (u.d0 * float(s0) + u.d1 * float(s1)) + u.m0 * uintBitsToFloat(xq[xb + 9u]);
#endif
}
