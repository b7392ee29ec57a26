"""The C++ text every kernel starts with: a few headers and small inline helpers.

Kept small on purpose (compile time): only ``<stdint.h>``. ``<math.h>`` alone costs g++ ~70 ms
in C++ mode (it drags in ``<cmath>``), half of a kernel's compile, so the prelude declares the
libm functions it uses itself (``LIBM``), and no ``at::vec``. Loops vectorize through GCC's
auto-vectorizer guided by ``#pragma omp simd``; libm calls vectorize through glibc's libmvec,
whose vector variants we declare with ``__attribute__((simd))`` for the functions this
machine's libmvec provides (see ``vector_math_functions``).

float16/bfloat16 values live in registers as their raw 16-bit pattern (``uint16_t``) and are
converted to/from float with branch-free bit arithmetic (vectorizable, round-to-nearest-even).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# libm functions with one (or two, for atan2/hypot/pow) float arguments that glibc's libmvec
# may provide as SIMD variants (glibc >= 2.22 has sin/cos/exp/log/pow; >= 2.35 the rest).
_MVEC_CANDIDATES = {
    "sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1, "sinh": 1, "cosh": 1,
    "tanh": 1, "asinh": 1, "acosh": 1, "atanh": 1, "exp": 1, "exp2": 1, "expm1": 1, "log": 1,
    "log2": 1, "log10": 1, "log1p": 1, "erf": 1, "erfc": 1, "atan2": 2, "hypot": 2, "pow": 2,
}


@functools.lru_cache(None)
def vector_math_functions() -> tuple[str, ...]:
    """Names (double precision; the float one adds ``f``) whose SIMD variants libmvec exports
    for every x86 ISA level GCC may pick (SSE2 'b', AVX 'c', AVX2 'd', AVX-512 'e')."""
    path = ctypes.util.find_library("mvec")
    if path is None:
        return ()
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return ()
    found = []
    for name, nargs in _MVEC_CANDIDATES.items():
        v = "v" * nargs
        need = [
            f"_ZGVbN4{v}_{name}f", f"_ZGVcN8{v}_{name}f", f"_ZGVdN8{v}_{name}f",
            f"_ZGVeN16{v}_{name}f", f"_ZGVbN2{v}_{name}", f"_ZGVcN4{v}_{name}",
            f"_ZGVdN4{v}_{name}", f"_ZGVeN8{v}_{name}",
        ]
        if all(hasattr(lib, sym) for sym in need):
            found.append(name)
    return tuple(found)


#: the libm functions kernels call (name -> number of arguments), float and double versions
LIBM = {
    "sqrt": 1, "exp": 1, "exp2": 1, "expm1": 1, "log": 1, "log2": 1, "log10": 1, "log1p": 1,
    "sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1, "sinh": 1, "cosh": 1,
    "tanh": 1, "asinh": 1, "acosh": 1, "atanh": 1, "erf": 1, "erfc": 1, "lgamma": 1,
    "floor": 1, "ceil": 1, "trunc": 1, "nearbyint": 1, "fabs": 1, "atan2": 2, "hypot": 2,
    "copysign": 2, "fmod": 2, "pow": 2,
}


#: libm functions kernels call under a ``kiln_`` alias (``kiln_sinf``, bound to the symbol
#: ``sinf`` with an asm label) so GCC does not treat them as builtins: GCC merges ``sinf(x)``
#: and ``cosf(x)`` of one argument into a complex ``cexpi`` call that has no vector variant,
#: which stops the whole loop from vectorizing (``sin(x) * 2 + cos(x)`` ran scalar).
NOT_BUILTIN = ("sin", "cos")


def _libm_decls() -> str:
    vector = set(vector_math_functions())
    lines = []
    for name, nargs in LIBM.items():
        attr = '__attribute__((simd("notinbranch"))) ' if name in vector else ""
        for ctype, suffix in (("float", "f"), ("double", "")):
            params = ", ".join([ctype] * nargs)
            if name in NOT_BUILTIN:
                lines.append(f"{attr}__attribute__((const)) {ctype} kiln_{name}{suffix}({params}) "
                             f'__asm__("{name}{suffix}");')
            else:
                lines.append(f"{attr}{ctype} {name}{suffix}({params});")
    return "\n".join(lines)


_HELPERS = r"""
#define KILN_INLINE static inline __attribute__((always_inline))

// ---- threads: the wrapper sets this from torch.get_num_threads() when it loads the kernel
#define KILN_MAX_THREADS 256  // per-thread partial results of a parallel reduction
extern "C" int omp_get_thread_num(void);
static int kiln_num_threads = 1;
extern "C" void kiln_set_num_threads(int n) { kiln_num_threads = n > 0 ? n : 1; }

// ---- bit casts, float16 and bfloat16 <-> float (raw 16-bit patterns, round-to-nearest-even)
KILN_INLINE float kiln_f32_from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }
KILN_INLINE uint32_t kiln_bits_from_f32(float f) { return __builtin_bit_cast(uint32_t, f); }

KILN_INLINE float kiln_h2f(uint16_t h) {
  const uint32_t w = (uint32_t)h << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normal = kiln_f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float subnormal = kiln_f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t bits = two_w < (1u << 27) ? kiln_bits_from_f32(subnormal) : kiln_bits_from_f32(normal);
  return kiln_f32_from_bits(sign | bits);
}
KILN_INLINE uint16_t kiln_f2h(float f) {
  float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = kiln_bits_from_f32(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = kiln_f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = kiln_bits_from_f32(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}
KILN_INLINE float kiln_bf2f(uint16_t h) { return kiln_f32_from_bits((uint32_t)h << 16); }
KILN_INLINE uint16_t kiln_f2bf(float f) {
  const uint32_t u = kiln_bits_from_f32(f);
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (uint16_t)(f != f ? 0x7FC0u : r);
}

// ---- math with torch's semantics
// NaN wins; ties give a (torch's sign of zero). Written as one select on "b wins": GCC
// vectorizes chains of these (a pooling window's max); the nested form stopped it.
template <typename T> KILN_INLINE T kiln_maximum(T a, T b) { return (b > a || b != b) ? b : a; }
template <typename T> KILN_INLINE T kiln_minimum(T a, T b) { return (b < a || b != b) ? b : a; }
template <typename T> KILN_INLINE T kiln_sign(T x) { return (T)((T(0) < x) - (x < T(0))); }
template <typename T> KILN_INLINE T kiln_abs(T x) { return x < T(0) ? (T)-x : x; }
KILN_INLINE float kiln_abs(float x) { return fabsf(x); }
KILN_INLINE double kiln_abs(double x) { return fabs(x); }

template <typename T> KILN_INLINE T kiln_floordiv(T a, T b) {  // integers, rounds toward -inf
  if (b == 0) return 0;  // torch raises; never trap inside a kernel
  T q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? (T)(q - 1) : q;
}
KILN_INLINE float kiln_floordiv(float a, float b) {  // Python's float //
  if (b == 0) return a / b;
  const float mod = fmodf(a, b);
  float div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0f;
  if (div == 0) return copysignf(0.0f, a / b);
  const float fl = floorf(div);
  return (div - fl > 0.5f) ? fl + 1.0f : fl;
}
KILN_INLINE double kiln_floordiv(double a, double b) {
  if (b == 0) return a / b;
  const double mod = fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div == 0) return copysign(0.0, a / b);
  const double fl = floor(div);
  return (div - fl > 0.5) ? fl + 1.0 : fl;
}
template <typename T> KILN_INLINE T kiln_truncdiv(T a, T b) { return b == 0 ? (T)0 : (T)(a / b); }
KILN_INLINE float kiln_truncdiv(float a, float b) { return truncf(a / b); }
KILN_INLINE double kiln_truncdiv(double a, double b) { return trunc(a / b); }
template <typename T> KILN_INLINE T kiln_remainder(T a, T b) {  // sign of the divisor
  if (b == 0) return 0;
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;
}
KILN_INLINE float kiln_remainder(float a, float b) {
  float r = fmodf(a, b);
  return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
KILN_INLINE double kiln_remainder(double a, double b) {
  double r = fmod(a, b);
  return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}
template <typename T> KILN_INLINE T kiln_fmod(T a, T b) { return b == 0 ? (T)0 : (T)(a % b); }
KILN_INLINE float kiln_fmod(float a, float b) { return fmodf(a, b); }
KILN_INLINE double kiln_fmod(double a, double b) { return fmod(a, b); }
template <typename T> KILN_INLINE T kiln_pow(T a, T b) {  // integers, b >= 0
  if (b < 0) return (a == 1) ? (T)1 : (a == -1 ? ((b & 1) ? (T)-1 : (T)1) : (T)0);
  T r = 1;
  while (b) { if (b & 1) r = (T)(r * a); a = (T)(a * a); b = (T)(b >> 1); }
  return r;
}
KILN_INLINE float kiln_pow(float a, float b) { return powf(a, b); }
KILN_INLINE double kiln_pow(double a, double b) { return pow(a, b); }
KILN_INLINE bool kiln_pow(bool a, bool b) { return a || !b; }
template <typename T> KILN_INLINE T kiln_shl(T a, T b) {
  return (b < 0 || b >= (T)(8 * sizeof(T))) ? (T)0 : (T)((uint64_t)a << b);
}
template <typename T> KILN_INLINE T kiln_shr(T a, T b) {
  return (b < 0 || b >= (T)(8 * sizeof(T))) ? (T)(a < 0 ? -1 : 0) : (T)(a >> b);
}
KILN_INLINE float kiln_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
KILN_INLINE double kiln_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
// erf of a float as a rational function of x^2 (odd numerator, |x| clamped at 4): no libm call
// and no branch, so it vectorizes inline (GELU's erf through libmvec's erff was ~2x slower
// than ATen's). Max error 4.3e-7 absolute, 4e-7 relative; NaN stays NaN (comparisons fail).
KILN_INLINE float kiln_erf(float a) {
  float x = a < -4.0f ? -4.0f : (a > 4.0f ? 4.0f : a);
  float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return (p * x) / q;
}
KILN_INLINE double kiln_erf(double x) { return erf(x); }
template <typename T> KILN_INLINE T kiln_erfinv(T y) {  // initial guess + 3 Newton steps
  if (y <= T(-1)) return y == T(-1) ? -(T)INFINITY : (T)NAN;
  if (y >= T(1)) return y == T(1) ? (T)INFINITY : (T)NAN;
  double yd = y, w = -log((1.0 - yd) * (1.0 + yd)), x;
  if (w < 5.0) {
    w -= 2.5;
    double p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w; p = -0.00125372503 + p * w; p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w; p = 1.50140941 + p * w;
    x = p * yd;
  } else {
    w = sqrt(w) - 3.0;
    double p = -0.000200214257;
    p = 0.000100950558 + p * w; p = 0.00134934322 + p * w; p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w; p = -0.0076224613 + p * w; p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w; p = 2.83297682 + p * w;
    x = p * yd;
  }
  for (int k = 0; k < 3; k++) x -= (erf(x) - yd) / (1.1283791670955126 * exp(-x * x));
  return (T)x;
}

// ---- argmax / argmin: (value, index) pairs; NaN is both the max and the min; ties -> lower index
template <typename T> KILN_INLINE bool kiln_isnan(T x) { return x != x; }
template <typename T> KILN_INLINE bool kiln_argmax_take(T v, T acc) {  // v comes later than acc
  return (v > acc) || (kiln_isnan(v) && !kiln_isnan(acc));
}
template <typename T> KILN_INLINE bool kiln_argmin_take(T v, T acc) {
  return (v < acc) || (kiln_isnan(v) && !kiln_isnan(acc));
}
template <typename T> KILN_INLINE bool kiln_argmax_better(T v, int64_t i, T acc, int64_t ai) {
  if (kiln_isnan(acc)) return kiln_isnan(v) && i < ai;
  if (kiln_isnan(v)) return true;
  return v > acc || (v == acc && i < ai);
}
template <typename T> KILN_INLINE bool kiln_argmin_better(T v, int64_t i, T acc, int64_t ai) {
  if (kiln_isnan(acc)) return kiln_isnan(v) && i < ai;
  if (kiln_isnan(v)) return true;
  return v < acc || (v == acc && i < ai);
}

// ---- atomic add (store mode "atomic_add"), CAS loops so any type works
template <typename T> KILN_INLINE void kiln_atomic_add(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED), upd;
  do { upd = (T)(old + v); } while (!__atomic_compare_exchange_n(p, &old, upd, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}
KILN_INLINE void kiln_atomic_add(float* p, float v) {
  uint32_t* q = (uint32_t*)p;
  uint32_t old = __atomic_load_n(q, __ATOMIC_RELAXED), upd;
  do { upd = kiln_bits_from_f32(kiln_f32_from_bits(old) + v); } while (!__atomic_compare_exchange_n(q, &old, upd, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}
KILN_INLINE void kiln_atomic_add(double* p, double v) {
  uint64_t* q = (uint64_t*)p;
  uint64_t old = __atomic_load_n(q, __ATOMIC_RELAXED), upd;
  do { upd = __builtin_bit_cast(uint64_t, __builtin_bit_cast(double, old) + v); } while (!__atomic_compare_exchange_n(q, &old, upd, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}
KILN_INLINE void kiln_atomic_add_f16(uint16_t* p, float v) {
  uint16_t old = __atomic_load_n(p, __ATOMIC_RELAXED), upd;
  do { upd = kiln_f2h(kiln_h2f(old) + v); } while (!__atomic_compare_exchange_n(p, &old, upd, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}
KILN_INLINE void kiln_atomic_add_bf16(uint16_t* p, float v) {
  uint16_t old = __atomic_load_n(p, __ATOMIC_RELAXED), upd;
  do { upd = kiln_f2bf(kiln_bf2f(old) + v); } while (!__atomic_compare_exchange_n(p, &old, upd, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}
"""


@functools.lru_cache(None)
def prelude() -> str:
    return (
        "// kiln C++ kernel prelude\n"
        "#include <stdint.h>\n"
        "#define INFINITY (__builtin_inff())\n"
        "#define NAN (__builtin_nanf(\"\"))\n\n"
        "// libm (declared here: <math.h> is slow to parse); simd = a libmvec vector variant exists\n"
        'extern "C" {\n' + _libm_decls() + "\n}\n" + _HELPERS
    )


#: element bytes -> the unsigned type a 16x16 register transpose moves them as
TRANSPOSE_WORDS = {4: "uint32_t", 2: "uint16_t"}


@functools.lru_cache(None)
def transpose_helper(nbytes: int) -> str:
    """``kiln_transpose16_<bits>(src, src_stride, dst, dst_stride)``: a 16x16 block of
    ``nbytes``-byte elements transposed in registers (``dst[c*ds + r] = src[r*ss + c]``):
    16 vector loads, 4 stages of two-row shuffles (stage ``h`` swaps the elements whose row
    and column differ in bit ``h``), 16 vector stores. GCC vector extensions, no headers; only
    kernels that call it include it (``CppKernel._tiled_group``)."""
    word = TRANSPOSE_WORDS[nbytes]
    vec = f"kiln_v{nbytes * 8}x16"
    lines = [f"typedef {word} {vec} __attribute__((vector_size({16 * nbytes})));",
             f"static inline void kiln_transpose16_{nbytes * 8}(const void* __restrict__ src, "
             "int64_t ss, void* __restrict__ dst, int64_t ds)", "{",
             "    const char* s = (const char*)src; char* d = (char*)dst;",
             f"    {vec} a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15;"]
    lines += [f"    __builtin_memcpy(&a{r}, s + {r} * ss * {nbytes}, {16 * nbytes});" for r in range(16)]
    for h in (1, 2, 4, 8):
        lo = [j if not j & h else 16 + j - h for j in range(16)]
        hi = [j + h if not j & h else 16 + j for j in range(16)]
        for i in range(16):
            if i & h:
                continue
            lines.append(f"    {{ const {vec} t = __builtin_shufflevector(a{i}, a{i + h}, "
                         f"{', '.join(map(str, lo))}); a{i + h} = __builtin_shufflevector(a{i}, "
                         f"a{i + h}, {', '.join(map(str, hi))}); a{i} = t; }}")
    lines += [f"    __builtin_memcpy(d + {c} * ds * {nbytes}, &a{c}, {16 * nbytes});" for c in range(16)]
    lines.append("}")
    return "\n".join(lines) + "\n"
