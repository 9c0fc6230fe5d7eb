// The AMX bf16 ceiling of one core: TDPBF16PS on four accumulator tiles from operands already in tiles
// (no loads), 16 x 16 x 32 multiply-adds each.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <chrono>
#include "amx.h"
int main() {
  amx_init();
  alignas(64) static uint16_t buf[16 * 32] = {};
  _tile_loadd(4, buf, 64); _tile_loadd(5, buf, 64); _tile_loadd(6, buf, 64); _tile_loadd(7, buf, 64);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int rep = 0; rep < 5; ++rep) {
    const long n = 2000000;
    auto a = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i) {
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    printf("%.0f GFLOP/s\n", 4.0 * n * 16 * 16 * 32 * 2 / s / 1e9);
  }
  alignas(64) float out[256]; _tile_stored(0, out, 64); printf("%f\n", out[0]);
}
