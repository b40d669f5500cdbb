/* The streaming engine's compiled kernels (attnscope.engines.native builds and loads this file).
 *
 * attnscope_flash: one layer of one sequence in one call. Its attention output and every row's
 * statistics, from blocks of query rows and keys small enough to stay in the cache (as torch's
 * fused CPU attention does), with an online softmax across the key blocks; the two products
 * per block are the BLAS sgemm that torch links (passed in as a function pointer).
 *
 * attnscope_softmax_stats: the row work on one tile that holds whole rows (the tiles of word-level
 * sequences and probes, which need every weight of a row): the torch path in streaming.py
 * computes the same values with several passes over the whole tile.
 *
 * attnscope_softmax_stats: s [rows keys] float32, row-major, rows = h * c (h heads of c query rows each); masked scores are
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
#include <stdlib.h>
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

/* ---- attnscope_flash ---------------------------------------------------------------------- */

/* Fortran BLAS sgemm (column-major, 32-bit integers): C = alpha op(A) op(B) + beta C */
typedef void (*sgemm_fn)(const char *, const char *, const int *, const int *, const int *,
                         const float *, const float *, const int *, const float *, const int *,
                         const float *, float *, const int *);

/* longctx.bucket_of: 0 -> 0, 1 -> 1, 2 -> 2, 3-4 -> 3, 5-8 -> 4, ...; the last bucket takes the rest */
static inline int64_t bucket(int64_t d, int64_t nb) {
  const int64_t b = d <= 1 ? d : 65 - __builtin_clzll((uint64_t)(d - 1));
  return b < nb ? b : nb - 1;
}
static inline int64_t bucket_end(int64_t b, int64_t nb) { /* the largest distance of bucket b */
  return b == 0 ? 0 : (b == nb - 1 ? INT64_MAX / 2 : (int64_t)1 << (b - 1));
}
static inline float sum(const float *restrict x, int64_t n) {
  float s = 0.f;
  for (int64_t j = 0; j < n; j++) s += x[j];
  return s;
}
static inline float dot(const float *restrict x, const float *restrict y, int64_t n) {
  float s = 0.f;
  for (int64_t j = 0; j < n; j++) s += x[j] * y[j];
  return s;
}

typedef struct {
  sgemm_fn gemm;
  const float *q, *k, *v; /* [h t x] at h * qh + t * qt + x (and so on) */
  int64_t qh, qt, kh, kt, vh, vt, oh, ot;
  float *out;
  int64_t G, d, n, nkeys, R, bk, ncls, ld, nb, rf, rh, mt;
  float scale, cap;
  int causal;
  const uint8_t *mask; /* allowed[i mt + j], or NULL */
  const float *cls;    /* [ncls, >= nkeys] at f ld + j */
  float *rowv;         /* [2 + ncls, Hq, n] at f rf + h rh + i */
} layer_t;

/* Rows r0 .. r1-1 of key head g's G query heads (M = G c rows, head-major), over key blocks of
 * bk. Per row, with m its largest score so far: z = sum e, a = sum e (s - m), e = exp(s - m),
 * the output, the class masses and the mass per distance bucket, all sums of e, so that a new
 * maximum rescales them by exp(m - m') (a becomes exp(m - m') (a - (m' - m) z)). At the end
 * p = e / z: entropy ln z - a / z, largest weight 1 / z. */
static void unit(const layer_t *L, int64_t g, int64_t r0, int64_t r1, float *scratch, double *dist) {
  const int64_t c = r1 - r0, G = L->G, d = L->d, bk = L->bk, ncls = L->ncls, nb = L->nb;
  const int64_t M = G * c, W = nb + 1; /* the buckets, then distance +1 ("previous") */
  float *qb = scratch, *S = qb + M * d, *O = S + M * bk, *mx = O + M * d, *Z = mx + M;
  float *A = Z + M, *cm = A + M, *acc = cm + M * ncls;
  for (int64_t h = 0; h < G; h++)
    for (int64_t i = 0; i < c; i++) {
      const float *src = L->q + (g * G + h) * L->qh + (r0 + i) * L->qt;
      float *dst = qb + (h * c + i) * d;
      for (int64_t x = 0; x < d; x++) dst[x] = src[x] * L->scale;
    }
  memset(O, 0, sizeof(float) * M * d);
  memset(cm, 0, sizeof(float) * M * ncls);
  memset(acc, 0, sizeof(float) * M * W);
  const int64_t kend = L->causal ? r1 : L->nkeys;
  const float one = 1.f, zero = 0.f;
  const int id = (int)d, iM = (int)M, ibk = (int)bk, ikt = (int)L->kt, ivt = (int)L->vt;
  const float *kg = L->k + g * L->kh, *vg = L->v + g * L->vh;
  for (int64_t j0 = 0; j0 < kend; j0 += bk) {
    const int64_t j1 = j0 + bk < kend ? j0 + bk : kend, n = j1 - j0;
    const int in = (int)n;
    /* S [M n] (row-major, row stride bk) = qb K[j0:j1]^T, as its column-major transpose */
    L->gemm("T", "N", &in, &iM, &id, &one, kg + j0 * L->kt, &ikt, qb, &id, &zero, S, &ibk);
    for (int64_t m = 0; m < M; m++) {
      const int64_t i = r0 + m % c;
      float *restrict x = S + m * bk;
      if (L->cap > 0.f)
        for (int64_t j = 0; j < n; j++) x[j] = L->cap * tanhf(x[j] / L->cap);
      if (L->mask) {
        const uint8_t *ok = L->mask + i * L->mt + j0;
        for (int64_t j = 0; j < n; j++) x[j] = ok[j] ? x[j] : -FLT_MAX;
      }
      if (L->causal) /* (whatever the mask allows: a key-padding mask has no triangle) */
        for (int64_t j = i + 1 - j0 > 0 ? i + 1 - j0 : 0; j < n; j++) x[j] = -FLT_MAX;
      float bm = -FLT_MAX;
      for (int64_t j = 0; j < n; j++) bm = fmaxf(bm, x[j]);
      float mo = mx[m], z = Z[m], a = A[m];
      if (j0 == 0) {
        mo = bm, z = 0.f, a = 0.f;
      } else if (bm > mo) {
        /* (where every earlier key was masked, alpha is 0: those keys drop out) */
        const float delta = bm - mo, alpha = expf(fmaxf(-delta, -1e4f));
        a = alpha > 0.f ? alpha * (a - delta * z) : 0.f;
        z *= alpha;
        for (int64_t t = 0; t < d; t++) O[m * d + t] *= alpha;
        for (int64_t f = 0; f < ncls; f++) cm[m * ncls + f] *= alpha;
        for (int64_t w = 0; w < W; w++) acc[m * W + w] *= alpha;
        mo = bm;
      }
      for (int64_t j = 0; j < n; j++) {
        /* a masked score is -FLT_MAX: t is clamped so that e * t stays finite (e is 0 there) */
        const float t = fmaxf(x[j] - mo, -1e4f), e = expf(t);
        x[j] = e;
        z += e;
        a += e * t;
      }
      mx[m] = mo, Z[m] = z, A[m] = a;
      for (int64_t f = 0; f < ncls; f++) cm[m * ncls + f] += dot(x, L->cls + f * L->ld + j0, n);
      float *ac = acc + m * W;
      int64_t j = j1 < i + 1 ? j1 : i + 1; /* keys j <= i, distance i - j, one bucket at a time */
      while (j > j0) {
        const int64_t b = bucket(i - j + 1, nb), lo = i - bucket_end(b, nb);
        const int64_t ja = lo > j0 ? lo : j0;
        ac[b] += sum(x + ja - j0, j - ja);
        j = ja;
      }
      for (j = j0 > i + 1 ? j0 : i + 1; j < j1;) { /* keys j > i, distance j - i */
        const int64_t b = bucket(j - i, nb), hi = i + bucket_end(b, nb) + 1;
        const int64_t jb = hi < j1 ? hi : j1;
        ac[b] += sum(x + j - j0, jb - j);
        j = jb;
      }
      if (i - 1 >= j0 && i - 1 < j1) ac[nb] += x[i - 1 - j0];
    }
    /* O [M d] += E V[j0:j1], as O^T += V^T E^T in column-major terms */
    L->gemm("N", "N", &id, &iM, &in, &one, vg + j0 * L->vt, &ivt, S, &ibk, &one, O, &id);
  }
  for (int64_t m = 0; m < M; m++) {
    const int64_t h = g * G + m / c, i = r0 + m % c;
    const float iz = 1.f / Z[m];
    float *o = L->out + h * L->oh + i * L->ot;
    for (int64_t t = 0; t < d; t++) o[t] = O[m * d + t] * iz;
    float *rv = L->rowv + h * L->rh + i;
    rv[0] = logf(Z[m]) - A[m] * iz;
    rv[L->rf] = iz;
    for (int64_t f = 0; f < ncls; f++) rv[(2 + f) * L->rf] = cm[m * ncls + f] * iz;
    if (i >= 1) /* row 0 gives its output only, as in the tiles */
      for (int64_t w = 0; w < W; w++) dist[h * W + w] += (double)acc[m * W + w] * iz;
  }
}

/* One layer of one sequence: rows 0 .. n-1 of every head (Hkv key heads of G query heads each).
 * Writes the output rows, each row's entropy, largest weight and class masses into rowv, and adds
 * each head's mass per distance bucket over rows >= 1 (and at distance +1) to dist [Hq nb+1].
 * Blocks of R rows are shared among the threads (OpenMP, torch's runtime), the largest first.
 * Returns 0, or 1 where memory for the blocks could not be had. */
int attnscope_flash(sgemm_fn gemm, const float *q, int64_t qh, int64_t qt, const float *k,
                    int64_t kh, int64_t kt, const float *v, int64_t vh, int64_t vt, float *out,
                    int64_t oh, int64_t ot, int64_t Hkv, int64_t G, int64_t d, int64_t n,
                    int64_t nkeys, float scale, float cap, int causal, const uint8_t *mask,
                    int64_t mt, const float *cls, int64_t ncls, int64_t ld, float *rowv,
                    int64_t rf, int64_t rh, double *dist, int64_t nb, int64_t R, int64_t bk) {
  const layer_t L = {gemm, q, k, v, qh, qt, kh, kt, vh, vt, oh, ot, out, G, d, n, nkeys, R, bk,
                     ncls, ld, nb, rf, rh, mt, scale, cap, causal, mask, cls, rowv};
  const int64_t blocks = (n + R - 1) / R, units = blocks * Hkv, W = nb + 1, M = G * R;
  const size_t floats = (size_t)(M * (2 * d + bk + 3 + ncls + W));
  int failed = 0;
#pragma omp parallel
  {
    float *scratch = malloc(sizeof(float) * floats);
    double *mine = calloc((size_t)(Hkv * G * W), sizeof(double));
    if (!scratch || !mine) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < units; u++) {
      const int64_t b = L.causal ? blocks - 1 - u / Hkv : u / Hkv; /* the longest rows first */
      if (scratch && mine) unit(&L, u % Hkv, b * R, (b + 1) * R < n ? (b + 1) * R : n, scratch, mine);
    }
    if (mine) {
#pragma omp critical
      for (int64_t x = 0; x < Hkv * G * W; x++) dist[x] += mine[x];
    }
    free(scratch);
    free(mine);
  }
  return failed;
}
