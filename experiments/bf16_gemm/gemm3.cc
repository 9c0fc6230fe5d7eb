// Prototype 3 (session of 2026-12-06; the kernel lm/cpu_gemm.cc PackedDotBF16Impl grew from it): A
// read in place (bf16 row-major, one 32-bit broadcast a k-pair), B packed in k-pairs
// [N/NR][K/2][NR][2] or, with -DUNPACK, in the decode's layout [N/64][K][64] with rows k and k + 1
// paired in registers (VPUNPCKLWD / VPUNPCKHWD, MR x 64 only); all of K in the register tile (KC >= K)
// or K chunks of KC with the sums reloaded; NR-column panels claimed by 2 threads. -DPFB=n
// prefetches B n k-pairs ahead.
// Build: g++ -O3 -march=native -std=c++17 [-DUNPACK] -o gemm3 gemm3.cc -lpthread && ./gemm3 MR NR KC
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
static uint16_t bf(float x) { uint32_t u; memcpy(&u, &x, 4); u += 0x7fff + ((u >> 16) & 1); return u >> 16; }
static float fl(uint16_t b) { uint32_t u = uint32_t(b) << 16; float x; memcpy(&x, &u, 4); return x; }

template <int MR, int NR>
static inline void micro(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t pairs, float* c, int64_t ldc,
                         bool acc_in, int rows) {
  constexpr int NV = NR / 16;
  __m512 s[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NV; ++j)
      s[m][j] = acc_in && m < rows ? _mm512_loadu_ps(c + m * ldc + 16 * j) : _mm512_setzero_ps();
  const uint16_t* ar[MR];
  for (int m = 0; m < MR; ++m) ar[m] = a + std::min(m, rows - 1) * lda;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = (__m512bh)_mm512_loadu_si512(b + p * 2 * NR + 32 * j);
#ifdef PFB
    _mm_prefetch((const char*)(b + (p + PFB) * 2 * NR), _MM_HINT_T0);
    if (NR == 64) _mm_prefetch((const char*)(b + (p + PFB) * 2 * NR + 64), _MM_HINT_T0);
#endif
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      int32_t v; memcpy(&v, ar[m] + 2 * p, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(v);
      for (int j = 0; j < NV; ++j) s[m][j] = _mm512_dpbf16_ps(s[m][j], av, bv[j]);
    }
  }
  for (int m = 0; m < rows; ++m)
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(c + m * ldc + 16 * j, s[m][j]);
}


template <int MR>
static inline void micro_u(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t pairs, float* c, int64_t ldc,
                         bool acc_in, int rows) {
  __m512 s[MR][4];
  for (int m = 0; m < MR; ++m) for (int j = 0; j < 4; ++j) s[m][j] = _mm512_setzero_ps();
  const uint16_t* ar[MR];
  for (int m = 0; m < MR; ++m) ar[m] = a + std::min(m, rows - 1) * lda;
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512i r0a = _mm512_loadu_si512(b + p * 128), r0b = _mm512_loadu_si512(b + p * 128 + 32);
    const __m512i r1a = _mm512_loadu_si512(b + p * 128 + 64), r1b = _mm512_loadu_si512(b + p * 128 + 96);
    __m512bh bv[4] = {(__m512bh)_mm512_unpacklo_epi16(r0a, r1a), (__m512bh)_mm512_unpackhi_epi16(r0a, r1a),
                      (__m512bh)_mm512_unpacklo_epi16(r0b, r1b), (__m512bh)_mm512_unpackhi_epi16(r0b, r1b)};
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      int32_t v; memcpy(&v, ar[m] + 2 * p, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(v);
      for (int j = 0; j < 4; ++j) s[m][j] = _mm512_dpbf16_ps(s[m][j], av, bv[j]);
    }
  }
  const __m512i i0 = _mm512_setr_epi32(0,1,2,3,16,17,18,19,4,5,6,7,20,21,22,23);
  const __m512i i1 = _mm512_setr_epi32(8,9,10,11,24,25,26,27,12,13,14,15,28,29,30,31);
  for (int m = 0; m < rows; ++m) {
    for (int h = 0; h < 2; ++h) {
      __m512 o0 = _mm512_permutex2var_ps(s[m][2*h], i0, s[m][2*h+1]);
      __m512 o1 = _mm512_permutex2var_ps(s[m][2*h], i1, s[m][2*h+1]);
      if (acc_in) { o0 = _mm512_add_ps(o0, _mm512_loadu_ps(c + m * ldc + 32 * h)); o1 = _mm512_add_ps(o1, _mm512_loadu_ps(c + m * ldc + 32 * h + 16)); }
      _mm512_storeu_ps(c + m * ldc + 32 * h, o0); _mm512_storeu_ps(c + m * ldc + 32 * h + 16, o1);
    }
  }
}

template <int MR, int NR>
static double run(int64_t M, int64_t K, int64_t N, int64_t KC, int reps, double* err_out, int order) {
  std::vector<uint16_t> A(M * K), B(K * N), Bp(K * N);
  srand(1);
  for (auto& x : A) x = bf((rand() / float(RAND_MAX) - 0.5f));
  for (auto& x : B) x = bf((rand() / float(RAND_MAX) - 0.5f) / 32);
  for (int64_t nb = 0; nb < N / NR; ++nb)
    for (int64_t p = 0; p < K / 2; ++p)
      for (int64_t j = 0; j < NR; ++j)
        for (int64_t t = 0; t < 2; ++t) {
#ifdef UNPACK
          Bp[((nb * K) + 2 * p + t) * NR + j] = B[(2 * p + t) * N + nb * NR + j];
#else
          Bp[((nb * (K / 2) + p) * NR + j) * 2 + t] = B[(2 * p + t) * N + nb * NR + j];
#endif
        }
  const int64_t mb = (M + MR - 1) / MR, nbs = N / NR;
  std::vector<float> C(M * N);
  std::vector<double> times;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    std::atomic<int64_t> next{0};
    auto work = [&](int) {
      // a unit: one NR panel, all rows, K in chunks of KC (panel chunk reused by every row tile)
      for (int64_t nb; (nb = next++) < nbs;) {
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
          const int64_t pairs = std::min(KC, K - k0) / 2;
          const uint16_t* b = Bp.data() + (nb * (K / 2) + k0 / 2) * NR * 2;
          for (int64_t i = 0; i < mb; ++i)
#ifdef UNPACK
            micro_u<MR>(A.data()
#else
            micro<MR, NR>(A.data()
#endif
 + i * MR * K + k0, K, b, pairs, C.data() + i * MR * N + nb * NR, N, k0 > 0,
                          int(std::min<int64_t>(MR, M - i * MR)));
        }
      }
    };
    std::thread t(work, 1);
    work(0);
    t.join();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  double err = 0, mx = 0;
  for (int i = 0; i < 200; ++i) {
    int64_t m = rand() % M, n = rand() % N;
    double ref = 0;
    for (int64_t k = 0; k < K; ++k) ref += double(fl(A[m * K + k])) * fl(B[k * N + n]);
    err = std::max(err, std::abs(ref - C[m * N + n])); mx = std::max(mx, std::abs(ref));
  }
  *err_out = err / mx;
  return 2.0 * M * N * K / times[times.size() / 2] / 1e9;
}

int main(int argc, char** argv) {
  const int mr = argc > 1 ? atoi(argv[1]) : 6, nr = argc > 2 ? atoi(argv[2]) : 64;
  const int64_t KC = argc > 3 ? atol(argv[3]) : 4096;
  const int reps = argc > 4 ? atoi(argv[4]) : 25;
  const int64_t shapes[][3] = {{256, 1024, 4096}, {256, 2048, 1024}, {256, 1024, 6144}, {256, 3072, 1024}};
  for (auto& s : shapes) {
    double err = 0, g = 0;
    if (mr == 6 && nr == 64) g = run<6, 64>(s[0], s[1], s[2], KC, reps, &err, 0);
    else if (mr == 12 && nr == 32) g = run<12, 32>(s[0], s[1], s[2], KC, reps, &err, 0);
    else if (mr == 14 && nr == 32) g = run<14, 32>(s[0], s[1], s[2], KC, reps, &err, 0);
    else if (mr == 8 && nr == 48) g = run<8, 48>(s[0], s[1], s[2], KC, reps, &err, 0);
    else return 1;
    printf("[%ld x %ld] @ [%ld x %ld] %dx%d KC %ld: %.0f GFLOP/s, err %.1e\n", s[0], s[1], s[1], s[2], mr, nr, KC, g, err);
  }
}
