// The f32-activation block decoders of matvec_dot.glsl once more, reading x from 32 values in
// registers (float xr[32]) instead of the x binding: for the whole-row-per-invocation shape
// (THREAD_ROWS, CPU devices), whose invocation loads a chunk of x once and uses it for all of
// its rows — on a CPU every load is paid lane by lane. The caller sets W16 / WF / W32 and FN
// (a name of its own, e.g. PASTE(n, _w0r)); the int8 path has no register form.
#ifndef INT_DOT
#define XREGS
#undef XF
#undef XARG
#define XF(i) xr[i]
#define XARG float xr[32]
#include "matvec_dot.glsl"
#undef XF
#undef XARG
#undef XREGS
#define XF(i) xf[xb + (i)]
#define XARG uint xb
#endif
