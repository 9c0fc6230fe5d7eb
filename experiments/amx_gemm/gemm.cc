// AMX bf16 GEMM prototype: y[M,N] f32 = bf16(x[M,K] f32) @ W (VNNI-packed bf16)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <vector>
#include <thread>
#include <atomic>
#include <cmath>
#include <random>
#include <algorithm>
#include "amx.h"
static int64_t up32(int64_t v) { return (v + 31) / 32 * 32; }
// W [K, N] bf16 bits -> [Np/32][Kp/32][2][16 pairs][16 cols][2], zero-padded
static void packB(const uint16_t* w, int64_t K, int64_t N, uint16_t* out) {
  const int64_t Kp = up32(K), Np = up32(N);
  for (int64_t nb = 0; nb < Np / 32; ++nb) for (int64_t kb = 0; kb < Kp / 32; ++kb) for (int h = 0; h < 2; ++h)
    for (int p = 0; p < 16; ++p) for (int c = 0; c < 16; ++c) for (int e = 0; e < 2; ++e) {
      int64_t k = kb * 32 + 2 * p + e, n = nb * 32 + h * 16 + c;
      *out++ = (k < K && n < N) ? w[k * N + n] : 0;
    }
}
// x [M, K] f32 rows [m0, m0+32) -> a micro-panel [Kp/32][2][16][32] bf16 (rows/cols past M, K zero)
static void packA(const float* x, int64_t M, int64_t K, int64_t m0, uint16_t* out) {
  const int64_t Kp = up32(K);
  for (int64_t kb = 0; kb < Kp / 32; ++kb) for (int r = 0; r < 32; ++r) {
    uint16_t* dst = out + (kb * 2 + r / 16) * 512 + (r % 16) * 32;
    const int64_t m = m0 + r, k0 = kb * 32;
    if (m < M && k0 + 32 <= K) {
      const float* src = x + m * K + k0;
      __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src));
      _mm512_store_si512(dst, (__m512i)v);
    } else {
      alignas(64) float tmp[32] = {};
      if (m < M) for (int64_t k = k0; k < std::min(K, k0 + 32); ++k) tmp[k - k0] = x[m * K + k];
      __m512bh v = _mm512_cvtne2ps_pbh(_mm512_load_ps(tmp + 16), _mm512_load_ps(tmp));
      _mm512_store_si512(dst, (__m512i)v);
    }
  }
}
int KC = 256, NC = 512, MC = 128;
// rows [m0, m1) (multiples of 32 but for the end) x panels [n0, n1) of y; ap: packed A (all micro-panels)
static void block(const uint16_t* ap, const uint16_t* bp, float* y, int64_t M, int64_t K, int64_t N,
                  int64_t m0, int64_t m1, int64_t nb0, int64_t nb1) {
  const int64_t KB = up32(K) / 32, kcb = std::max<int64_t>(1, KC / 32);
  alignas(64) float edge[32 * 32];
  for (int64_t k0 = 0; k0 < KB; k0 += kcb) {
    const int64_t k1 = std::min(KB, k0 + kcb);
    for (int64_t mb = m0 / 32; mb * 32 < m1; ++mb) {
      const uint16_t* a = ap + mb * KB * 1024;
      for (int64_t nb = nb0; nb < nb1; ++nb) {
        const uint16_t* b = bp + nb * KB * 1024;
        const bool full = mb * 32 + 32 <= M && nb * 32 + 32 <= N;
        float* c = full ? y + mb * 32 * N + nb * 32 : edge;
        const int64_t ld = full ? N * 4 : 128, half = full ? 16 * N : 512;
        if (!full && k0 > 0) {  // the edge block's partial sums from y
          for (int r = 0; r < 32; ++r) for (int q = 0; q < 32; ++q) {
            int64_t m = mb * 32 + r, n = nb * 32 + q;
            edge[r * 32 + q] = (m < M && n < N) ? y[m * N + n] : 0.f;
          }
        }
        if (k0 == 0) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
        else { _tile_loadd(0, c, ld); _tile_loadd(1, c + 16, ld); _tile_loadd(2, c + half, ld); _tile_loadd(3, c + half + 16, ld); }
        for (int64_t kb = k0; kb < k1; ++kb) {
          amx_step(a + kb * 1024, b + kb * 1024);
        }
        _tile_stored(0, c, ld); _tile_stored(1, c + 16, ld); _tile_stored(2, c + half, ld); _tile_stored(3, c + half + 16, ld);
        if (!full) {
          for (int r = 0; r < 32; ++r) for (int q = 0; q < 32; ++q) {
            int64_t m = mb * 32 + r, n = nb * 32 + q;
            if (m < M && n < N) y[m * N + n] = edge[r * 32 + q];
          }
        }
      }
    }
  }
}
struct Gemm {
  int64_t M, K, N; const float* x; const uint16_t* bp; float* y; uint16_t* ap;
  void run(int threads) {
    const int64_t Mp = up32(M), KB = up32(K) / 32, NB = up32(N) / 32;
    const int64_t mcs = (Mp + MC - 1) / MC, ncs = (NB + NC / 32 - 1) / (NC / 32);
    const int64_t units = mcs * ncs, mbs = Mp / 32;
    std::atomic<int64_t> next_pack{0}, packed{0}, next{0};
    auto work = [&]() {
      amx_config();
      for (int64_t i; (i = next_pack.fetch_add(1)) < mbs;) { packA(x, M, K, i * 32, ap + i * KB * 1024); packed.fetch_add(1); }
      while (packed.load() < mbs) {}
      for (int64_t u; (u = next.fetch_add(1)) < units;) {
        const int64_t nc = u % ncs, mc = u / ncs;  // consecutive units share rows: a thread's B chunks differ
        block(ap, bp, y, M, K, N, mc * MC, std::min(Mp, (mc + 1) * MC), nc * (NC / 32), std::min(NB, (nc + 1) * (NC / 32)));
      }
      _tile_release();
    };
    std::vector<std::thread> ts;
    for (int t = 1; t < threads; ++t) ts.emplace_back(work);
    work();
    for (auto& t : ts) t.join();
  }
};
static uint16_t bf(float f) { uint32_t u; memcpy(&u, &f, 4); return (u + 0x7fff + ((u >> 16) & 1)) >> 16; }
static float fl(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);  // the tiles' state for every thread
  int threads = argc > 1 ? atoi(argv[1]) : 1; KC = argc > 2 ? atoi(argv[2]) : 256; NC = argc > 3 ? atoi(argv[3]) : 512; MC = argc > 4 ? atoi(argv[4]) : 128;
  int64_t shapes[][3] = {{256, 1024, 6144}, {256, 3072, 1024}, {256, 1024, 4096}, {256, 2048, 1024}, {512, 1024, 6144}, {100, 1000, 3000}, {64, 1024, 151936}};
  std::mt19937 rng(0); std::normal_distribution<float> nd;
  for (auto& s : shapes) {
    int64_t M = s[0], K = s[1], N = s[2];
    std::vector<float> x(M * K); std::vector<uint16_t> w(K * N);
    for (auto& v : x) v = nd(rng); for (auto& v : w) v = bf(nd(rng) / 32);
    uint16_t* bp = (uint16_t*)aligned_alloc(4096, up32(K) * up32(N) * 2 + 4096); packB(w.data(), K, N, bp);
    uint16_t* ap = (uint16_t*)aligned_alloc(4096, up32(M) * up32(K) * 2 + 4096);
    float* y = (float*)aligned_alloc(4096, M * N * 4 + 4096);
    Gemm g{M, K, N, x.data(), bp, y, ap};
    g.run(threads);
    double err = 0, ref = 0;
    for (int i = 0; i < 50; ++i) { int64_t m = (i * 37) % M, n = (i * 101 + 7) % N; double r = 0; for (int64_t k = 0; k < K; ++k) r += (double)fl(bf(x[m * K + k])) * fl(w[k * N + n]); err = std::max(err, std::fabs(r - y[m * N + n])); ref = std::max(ref, std::fabs(r)); }
    std::vector<double> t;
    for (int r = 0; r < 20; ++r) { auto a = std::chrono::steady_clock::now(); g.run(threads); t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count()); }
    std::sort(t.begin(), t.end());
    printf("%ld %ld %ld: %.3f ms %.0f GFLOP/s err %.1e of %.1e\n", M, K, N, t[10] * 1e3, 2.0 * M * K * N / t[10] / 1e9, err, ref);
    free(bp); free(ap); free(y);
  }
}
