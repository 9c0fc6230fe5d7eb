// One operand (A, 8 KiB) held in L1 and the other (B) streamed over BYTES, at a 2 x 2 tile step
// (four tile loads, four TDPBF16PS); PREFETCH 1 adds prefetcht0 of B DIST steps ahead. Buffers are
// 4 KiB aligned: with malloc's 16-byte alignment each 64-byte tile row spans two lines (~950 GFLOP/s).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <vector>
#include "amx.h"
int main(int argc, char** argv) {
  amx_init();
  long span = atol(argv[1]); int pf = atoi(argv[2]); int dist = argc > 3 ? atoi(argv[3]) : 2;
  uint16_t* Ap = (uint16_t*)aligned_alloc(4096, 16384); uint16_t* Bp = (uint16_t*)aligned_alloc(4096, span + 131072); memset(Ap, 0, 16384); memset(Bp, 0, span + 131072); struct { uint16_t* p; uint16_t* data() { return p; } } A{Ap}, B{Bp};
  long tiles = span / 1024;
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int rep = 0; rep < 3; ++rep) {
    const long n = 1000000;
    auto a = std::chrono::steady_clock::now();
    long t = 0; int ta = 0;
    for (long i = 0; i < n; ++i) {
      const uint16_t* ap = A.data() + ta * 512; const uint16_t* bp = B.data() + t * 512;
      if (pf) { const char* q = (const char*)(bp + dist * 1024); for (int l = 0; l < 2048; l += 64) _mm_prefetch(q + l, _MM_HINT_T0); }
      amx_step(ap, bp);
      t += 2; if (t + 2 > tiles) t = 0;
      ta = (ta + 2) & 7;
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    printf("B span %ld KB pf %d dist %d: %.0f GFLOP/s\n", span / 1024, pf, dist, 4.0 * n * 16 * 16 * 32 * 2 / s / 1e9);
  }
}
