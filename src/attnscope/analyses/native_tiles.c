/* The streaming engine's per-row work on one tile of attention scores, done while each row is in
 * the cache (attnscope.analyses.native builds and loads this file; the torch path in streaming.py
 * computes the same values with several passes over the whole tile).
 *
 * s [rows keys] float32, row-major, rows = h * c (h heads of c query rows each); masked scores are
 * float32's most negative finite value. In place, each row becomes its softmax p = exp(s - m) / z
 * (m = the row's largest score), and
 *   ent[r] = ln z - sum p (s - m)   the entropy (nats)
 *   top[r] = 1 / z                  the largest weight
 *   mass[r ncls + f] = sum_j p_j cls[f ld + j]   the mass on each key class (cls: [ncls, >= keys])
 *   diag (or NULL) [h, keys + c - 1]: the mass of each head's c rows per distance, column
 *     x = c - 1 - i + j for row i and key j (the layout of longctx.diagonal_sums).
 * Three passes over a row: its maximum; exp, z and the entropy's sum; then p, the distances and
 * (up to four at a time) the classes.
 *
 * Compiled with -ffast-math (so that expf is vectorized through glibc's libmvec and the sums are
 * reassociated), but linked without it: gcc links -ffast-math's start-up file, which sets the CPU to
 * flush denormals for the whole process, into a shared library too. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* p = x * iz in place (when scale), d[j] += p (when d), and the mass on nc <= 4 classes */
static inline void classes_pass(float *restrict x, int64_t keys, float iz, int scale,
                                float *restrict d, const float *restrict cls, int64_t ld,
                                int nc, float *restrict mass) {
  float m0 = 0.f, m1 = 0.f, m2 = 0.f, m3 = 0.f;
  for (int64_t j = 0; j < keys; j++) {
    float p = scale ? x[j] * iz : x[j];
    if (scale) x[j] = p;
    if (d) d[j] += p;
    if (nc > 0) m0 += p * cls[j];
    if (nc > 1) m1 += p * cls[ld + j];
    if (nc > 2) m2 += p * cls[2 * ld + j];
    if (nc > 3) m3 += p * cls[3 * ld + j];
  }
  if (nc > 0) mass[0] = m0;
  if (nc > 1) mass[1] = m1;
  if (nc > 2) mass[2] = m2;
  if (nc > 3) mass[3] = m3;
}

/* the same with nc and whether d is given known to the compiler, so that each loop vectorizes */
static void pass(float *x, int64_t keys, float iz, int scale, float *d, const float *cls,
                 int64_t ld, int64_t nc, float *mass) {
#define CASE(n)                                                                   \
  case n:                                                                         \
    if (d) classes_pass(x, keys, iz, scale, d, cls, ld, n, mass);                 \
    else classes_pass(x, keys, iz, scale, NULL, cls, ld, n, mass);                \
    break;
  switch (nc) { CASE(0) CASE(1) CASE(2) CASE(3) CASE(4) }
#undef CASE
}

void attnscope_softmax_stats(float *s, int64_t rows, int64_t keys, int64_t c, float *ent,
                             float *top, float *diag, const float *cls, int64_t ncls, int64_t ld,
                             float *mass) {
  const int64_t width = keys + c - 1;
  for (int64_t r = 0; r < rows; r++) {
    float *restrict x = s + r * keys;
    float m = -FLT_MAX;
    for (int64_t j = 0; j < keys; j++) m = fmaxf(m, x[j]);
    float z = 0.f, a = 0.f;
    for (int64_t j = 0; j < keys; j++) {
      /* a masked score is -FLT_MAX: t is clamped so that e * t stays finite (e is 0 there) */
      float t = fmaxf(x[j] - m, -1e4f);
      float e = expf(t);
      x[j] = e;
      z += e;
      a += e * t;
    }
    const float iz = 1.f / z;
    ent[r] = logf(z) - a * iz;
    top[r] = iz;
    float *d = NULL;
    if (diag) {
      const int64_t i = r % c;
      d = diag + (r / c) * width;
      if (i == 0) memset(d, 0, (size_t)width * sizeof(float));
      d += c - 1 - i;
    }
    int64_t f = ncls < 4 ? ncls : 4;
    pass(x, keys, iz, 1, d, cls, ld, f, mass + r * ncls);
    for (; f < ncls; f += 4)
      pass(x, keys, iz, 0, NULL, cls + f * ld, ld, ncls - f < 4 ? ncls - f : 4, mass + r * ncls + f);
  }
}
