// Prototype 2: a bf16 GEMM with AVX512_BF16's VDPBF16PS, BLIS-style blocking (prefill shapes).
// C[M,N] f32 = A[M,K] bf16 @ B[K,N] bf16. B packed once (a weight) in k-pairs per NR-column panel:
// [N/NR][K/2][NR][2]. A packed per KC chunk into MR-row micro-panels of k-pairs: [M/MR][KC/2][MR]
// (32-bit entries: each broadcast reads contiguous memory). Loops: K in chunks of KC (the A chunk,
// M x KC, stays in L2) -> NR-column panels claimed by the threads (the panel's KC x NR chunk stays
// in L1) -> MR-row micro-panels -> the MR x NR register tile (MR * NR / 16 zmm sums).
// Build: g++ -O3 -march=native -std=c++17 -o gemm2 gemm2.cc -lpthread && ./gemm2 MR NR KC
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

static uint16_t bf(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return u >> 16;
}
static float fl(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

// The MR x NR tile over `pairs` k-pairs: a [pairs][MR] int32 (packed A), b [pairs][NR][2] bf16.
template <int MR, int NR>
static inline void micro(const int32_t* a, const uint16_t* b, int64_t pairs, float* c, int64_t ldc, bool acc_in,
                         int rows) {
  constexpr int NV = NR / 16;
  __m512 s[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NV; ++j)
      s[m][j] = acc_in && m < rows ? _mm512_loadu_ps(c + m * ldc + 16 * j) : _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = (__m512bh)_mm512_loadu_si512(b + p * 2 * NR + 32 * j);
    _mm_prefetch((const char*)(a + (p + 16) * MR), _MM_HINT_T0);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(a[p * MR + m]);
      for (int j = 0; j < NV; ++j) s[m][j] = _mm512_dpbf16_ps(s[m][j], av, bv[j]);
    }
  }
  for (int m = 0; m < rows; ++m)
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(c + m * ldc + 16 * j, s[m][j]);
}

template <int MR, int NR>
static double run(int64_t M, int64_t K, int64_t N, int64_t KC, int reps, double* err_out) {
  std::vector<uint16_t> A(M * K), B(K * N), Bp(K * N);
  srand(1);
  for (auto& x : A) x = bf((rand() / float(RAND_MAX) - 0.5f));
  for (auto& x : B) x = bf((rand() / float(RAND_MAX) - 0.5f) / 32);
  for (int64_t nb = 0; nb < N / NR; ++nb)
    for (int64_t p = 0; p < K / 2; ++p)
      for (int64_t j = 0; j < NR; ++j)
        for (int64_t t = 0; t < 2; ++t) Bp[((nb * (K / 2) + p) * NR + j) * 2 + t] = B[(2 * p + t) * N + nb * NR + j];
  const int64_t mb = (M + MR - 1) / MR;
  std::vector<int32_t> Ap(mb * MR * (KC / 2));
  std::vector<float> C(M * N);
  std::vector<double> times;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kn = std::min(KC, K - k0), pairs = kn / 2;
      // pack A's chunk: each thread its half of the micro-panels, then both compute
      std::atomic<int64_t> next{0}, packed{0};
      auto work = [&](int half) {
        for (int64_t i = half * mb / 2; i < (half + 1) * mb / 2; ++i)
          for (int64_t p = 0; p < pairs; ++p)
            for (int m = 0; m < MR; ++m) {
              const int64_t r = i * MR + m;
              int32_t v = 0;
              if (r < M) memcpy(&v, &A[r * K + k0 + 2 * p], 4);
              Ap[(i * pairs + p) * MR + m] = v;
            }
        packed++;
        while (packed.load() < 2) {
        }
        for (int64_t nb; (nb = next++) < N / NR;) {
          const uint16_t* b = Bp.data() + (nb * (K / 2) + k0 / 2) * NR * 2;
          for (int64_t i = 0; i < mb; ++i)
            micro<MR, NR>(Ap.data() + i * pairs * MR, b, pairs, C.data() + i * MR * N + nb * NR, N, k0 > 0,
                          int(std::min<int64_t>(MR, M - i * MR)));
        }
      };
      std::thread t(work, 1);
      work(0);
      t.join();
    }
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  double err = 0, mx = 0;
  for (int i = 0; i < 200; ++i) {
    int64_t m = rand() % M, n = rand() % N;
    double ref = 0;
    for (int64_t k = 0; k < K; ++k) ref += double(fl(A[m * K + k])) * fl(B[k * N + n]);
    err = std::max(err, std::abs(ref - C[m * N + n]));
    mx = std::max(mx, std::abs(ref));
  }
  *err_out = err / mx;
  return 2.0 * M * N * K / times[times.size() / 2] / 1e9;
}

int main(int argc, char** argv) {
  const int mr = argc > 1 ? atoi(argv[1]) : 12, nr = argc > 2 ? atoi(argv[2]) : 32;
  const int64_t KC = argc > 3 ? atol(argv[3]) : 256;
  const int reps = argc > 4 ? atoi(argv[4]) : 25;
  const int64_t shapes[][3] = {{256, 1024, 4096}, {256, 1024, 6144}, {256, 3072, 1024}, {256, 2048, 1024}};
  for (auto& s : shapes) {
    double err = 0, g = 0;
    if (mr == 12 && nr == 32) g = run<12, 32>(s[0], s[1], s[2], KC, reps, &err);
    else if (mr == 6 && nr == 64) g = run<6, 64>(s[0], s[1], s[2], KC, reps, &err);
    else if (mr == 14 && nr == 32) g = run<14, 32>(s[0], s[1], s[2], KC, reps, &err);
    else return fprintf(stderr, "MR x NR one of 12x32, 6x64, 14x32\n"), 1;
    printf("[%ld x %ld] @ [%ld x %ld] %dx%d KC %ld: median %.0f GFLOP/s, max err %.1e (relative)\n", s[0], s[1], s[1],
           s[2], mr, nr, KC, g, err);
  }
}
