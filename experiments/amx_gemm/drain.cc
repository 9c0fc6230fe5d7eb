// The cost of storing a 32 x 32 result between blocks of the 2 x 2 tile loop, operands in L2:
// ./drain M K N VARIANT [PF] runs every (32-row, 32-column) block of x[M, K] @ W[K, N] in order.
// VARIANT 0: zero, the K loop, store (the GEMM's pattern); 1: the next block's first x and W
// tiles loaded above the stores; 2: no store (the ceiling); 3: the next block's first PF steps
// prefetched into L1 before the stores.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <algorithm>
#include <vector>
#include "amx.h"
// A [MB][KB][2][16][32], B [NB][KB][2][16][16][2]; C [M, N]; blocks (mb, nb) in order mb outer.
// variant 0: zero, loop, store. 1: next block's first A, B tile loads hoisted above the stores (pipelined).
// 2: no store. 3: prefetch next block's first PF steps before stores.
int main(int argc, char** argv) {
  amx_init();
  long M = atol(argv[1]), K = atol(argv[2]), N = atol(argv[3]); int var = atoi(argv[4]); int PF = argc > 5 ? atoi(argv[5]) : 2;
  long KB = K / 32, MB = M / 32, NB = N / 32;
  uint16_t* A = (uint16_t*)aligned_alloc(4096, M * K * 2); uint16_t* B = (uint16_t*)aligned_alloc(4096, K * N * 2);
  float* C = (float*)aligned_alloc(4096, M * N * 4);
  memset(A, 0, M*K*2); memset(B, 0, K*N*2); memset(C, 0, M*N*4);
  std::vector<double> ts;
  long nblocks = MB * NB;
  for (int rep = 0; rep < 30; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < nblocks; ++i) {
      long mb = i / NB, nb = i % NB;
      const uint16_t* a = A + mb * KB * 1024; const uint16_t* b = B + nb * KB * 1024;
      float* cc = C + mb * 32 * N + nb * 32; long ld = N * 4, half = 16 * N;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      long kb = 0;
      if (var == 1 && i > 0) {  // step 0's A0 and B0 already loaded (tiles 4, 6)
        _tile_dpbf16ps(0, 4, 6); _tile_loadd(7, b + 512, 64); _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a + 512, 64); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); kb = 1;
      }
      for (; kb < KB; ++kb) {
        amx_step(a + kb * 1024, b + kb * 1024);
      }
      long j = i + 1; long mb2 = j / NB, nb2 = j % NB;
      const uint16_t* a2 = A + (j < nblocks ? mb2 : 0) * KB * 1024; const uint16_t* b2 = B + (j < nblocks ? nb2 : 0) * KB * 1024;
      if (var == 1) { _tile_loadd(4, a2, 64); _tile_loadd(6, b2, 64); }
      if (var == 3) for (int s = 0; s < PF; ++s) for (int l = 0; l < 2048; l += 64) { _mm_prefetch((const char*)(a2 + s * 1024) + l, _MM_HINT_T0); _mm_prefetch((const char*)(b2 + s * 1024) + l, _MM_HINT_T0); }
      if (var != 2) { _tile_stored(0, cc, ld); _tile_stored(1, cc + 16, ld); _tile_stored(2, cc + half, ld); _tile_stored(3, cc + half + 16, ld); }
    }
    ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ts.begin(), ts.end());
  printf("%ld %ld %ld var %d pf %d: %.0f GFLOP/s\n", M, K, N, var, PF, 2.0 * M * K * N / ts[15] / 1e9);
}
