// Prototype: a bf16 GEMM with AVX512_BF16's VDPBF16PS (prefill shapes), C[M,N] f32 = A[M,K] bf16 @ B[K,N] bf16.
// B packed in k-pairs per 64-column block: [N/64][K/2][64][2]; A row-major bf16 (each row's k-pair is one
// 32-bit broadcast). 6x64 register tile (24 zmm sums), K in chunks of KC, column blocks split over threads.
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
template <int MR>
static inline void micro(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t pairs, float* c, int64_t ldc, bool acc_in) {
  __m512 s[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 4; ++j) s[m][j] = acc_in ? _mm512_loadu_ps(c + m * ldc + 16 * j) : _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * 128), b1 = (__m512bh)_mm512_loadu_si512(b + p * 128 + 32),
                   b2 = (__m512bh)_mm512_loadu_si512(b + p * 128 + 64), b3 = (__m512bh)_mm512_loadu_si512(b + p * 128 + 96);
    _mm_prefetch((const char*)(b + (p + 8) * 128), _MM_HINT_T0);
    _mm_prefetch((const char*)(b + (p + 8) * 128 + 64), _MM_HINT_T0);
#pragma GCC unroll 6
    for (int m = 0; m < MR; ++m) {
      int32_t pair; memcpy(&pair, a + m * lda + 2 * p, 4);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      s[m][0] = _mm512_dpbf16_ps(s[m][0], av, b0); s[m][1] = _mm512_dpbf16_ps(s[m][1], av, b1);
      s[m][2] = _mm512_dpbf16_ps(s[m][2], av, b2); s[m][3] = _mm512_dpbf16_ps(s[m][3], av, b3);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(c + m * ldc + 16 * j, s[m][j]);
}
static void block(const uint16_t* A, int64_t M, int64_t K, const uint16_t* Bp, float* C, int64_t N, int64_t nb, int64_t KC) {
  const uint16_t* bblk = Bp + nb * K * 64;
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t kn = std::min(KC, K - k0);
    for (int64_t m0 = 0; m0 < M; m0 += 6) {
      const int64_t mr = std::min<int64_t>(6, M - m0);
      const uint16_t* a = A + m0 * K + k0; const uint16_t* b = bblk + k0 * 64; float* c = C + m0 * N + nb * 64;
      switch (mr) {
        case 6: micro<6>(a, K, b, kn / 2, c, N, k0 > 0); break;
        case 5: micro<5>(a, K, b, kn / 2, c, N, k0 > 0); break;
        case 4: micro<4>(a, K, b, kn / 2, c, N, k0 > 0); break;
        case 3: micro<3>(a, K, b, kn / 2, c, N, k0 > 0); break;
        case 2: micro<2>(a, K, b, kn / 2, c, N, k0 > 0); break;
        default: micro<1>(a, K, b, kn / 2, c, N, k0 > 0); break;
      }
    }
  }
}
int main(int argc, char** argv) {
  const int64_t KC = argc > 1 ? atol(argv[1]) : 256;
  const int64_t shapes[][3] = {{256, 1024, 4096}, {256, 1024, 6144}, {256, 3072, 1024}, {256, 2048, 1024}};
  for (auto& s : shapes) {
    const int64_t M = s[0], K = s[1], N = s[2];
    std::vector<uint16_t> A(M * K), B(K * N), Bp(K * N);
    srand(1);
    for (auto& x : A) x = bf((rand() / float(RAND_MAX) - 0.5f));
    for (auto& x : B) x = bf((rand() / float(RAND_MAX) - 0.5f) / 32);
    for (int64_t nb = 0; nb < N / 64; ++nb)
      for (int64_t p = 0; p < K / 2; ++p)
        for (int64_t j = 0; j < 64; ++j)
          for (int64_t t = 0; t < 2; ++t) Bp[((nb * (K / 2) + p) * 64 + j) * 2 + t] = B[(2 * p + t) * N + nb * 64 + j];
    std::vector<float> C(M * N);
    std::vector<double> times;
    for (int rep = 0; rep < 25; ++rep) {
      std::atomic<int64_t> next{0};
      auto t0 = std::chrono::steady_clock::now();
      auto work = [&] { for (int64_t nb; (nb = next++) < N / 64;) block(A.data(), M, K, Bp.data(), C.data(), N, nb, KC); };
      std::thread t(work); work(); t.join();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    double err = 0, mx = 0;
    for (int i = 0; i < 200; ++i) {
      int64_t m = rand() % M, n = rand() % N; double ref = 0;
      for (int64_t k = 0; k < K; ++k) ref += double(fl(A[m * K + k])) * fl(B[k * N + n]);
      err = std::max(err, std::abs(ref - C[m * N + n])); mx = std::max(mx, std::abs(ref));
    }
    printf("[%ld x %ld] @ [%ld x %ld] KC %ld: median %.0f GFLOP/s (best %.0f), max err %.1e of %.2f\n", M, K, K, N, KC,
           2.0 * M * N * K / times[12] / 1e9, 2.0 * M * N * K / times[0] / 1e9, err, mx);
  }
}
