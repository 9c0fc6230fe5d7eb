#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
double run_bf16(long iters) {
  __m512 acc[24]; for (auto& a : acc) a = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x3f803f80);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int j = 0; j < 24; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
    __asm__ volatile("" : "+v"(x));
  }
  float s = 0; for (auto& a : acc) s += _mm512_reduce_add_ps(a); return s;
}
double run_f32(long iters) {
  __m512 acc[24]; for (auto& a : acc) a = _mm512_setzero_ps();
  __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1.0f);
  for (long i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int j = 0; j < 24; ++j) acc[j] = _mm512_fmadd_ps(x, y, acc[j]);
    __asm__ volatile("" : "+v"(x));
  }
  float s = 0; for (auto& a : acc) s += _mm512_reduce_add_ps(a); return s;
}
int main() {
  long iters = 20000000;
  for (int threads : {1, 2}) for (int kind : {0, 1}) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) ts.emplace_back([&] { volatile double r = kind ? run_bf16(iters) : run_f32(iters); });
    for (auto& t : ts) t.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double flops = (double)iters * 24 * (kind ? 64 : 32) * threads;
    printf("%s %d threads: %.0f GFLOP/s\n", kind ? "bf16 dpbf16ps" : "f32 fma", threads, flops / s / 1e9);
  }
}
