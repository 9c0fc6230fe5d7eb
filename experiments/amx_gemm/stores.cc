// Tile stores against TDPBF16PS with operands hot in L1: ./stores MODE (ns and cycles an
// iteration). 2: four TDPBF16PS; 3: and four stores; 6: and four tile loads; 7: TDPs and loads,
// no stores; 8/9/10: a 32-step K loop on L1-hot tiles, then store+zero / zero / store.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include "amx.h"
int main(int argc, char** argv) {
  amx_init();
  int mode = atoi(argv[1]);
  float* buf = (float*)aligned_alloc(4096, 1 << 16); memset(buf, 0, 1 << 16);
  uint16_t* ab = (uint16_t*)aligned_alloc(4096, 1 << 16); memset(ab, 0, 1 << 16);
  const long n = mode >= 8 ? 10000 : 200000;
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  _tile_loadd(4, ab, 64); _tile_loadd(5, ab + 512, 64); _tile_loadd(6, ab + 1024, 64); _tile_loadd(7, ab + 1536, 64);
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    if (mode == 0) { _tile_stored(0, buf, 64); }  // one store, no dependency
    if (mode == 1) { _tile_stored(0, buf, 64); _tile_stored(1, buf + 256, 64); _tile_stored(2, buf + 512, 64); _tile_stored(3, buf + 768, 64); }
    if (mode == 2) { _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
    if (mode == 3) { _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
                     _tile_stored(0, buf, 64); _tile_stored(1, buf + 256, 64); _tile_stored(2, buf + 512, 64); _tile_stored(3, buf + 768, 64); }
    if (mode == 4) { _tile_loadd(0, buf, 64); }
    if (mode == 6) { _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
                     _tile_stored(0, buf, 64); _tile_stored(1, buf + 256, 64); _tile_stored(2, buf + 512, 64); _tile_stored(3, buf + 768, 64);
                     _tile_loadd(4, ab, 64); _tile_loadd(5, ab + 512, 64); _tile_loadd(6, ab + 1024, 64); _tile_loadd(7, ab + 1536, 64); }
    if (mode == 7) { _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
                     _tile_loadd(4, ab, 64); _tile_loadd(5, ab + 512, 64); _tile_loadd(6, ab + 1024, 64); _tile_loadd(7, ab + 1536, 64); }
    if (mode == 8) { for (int j = 0; j < 32; ++j) { _tile_loadd(4, ab, 64); _tile_loadd(6, ab + 1024, 64); _tile_dpbf16ps(0, 4, 6); _tile_loadd(7, ab + 1536, 64); _tile_dpbf16ps(1, 4, 7); _tile_loadd(5, ab + 512, 64); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
                     _tile_stored(0, buf, 64); _tile_stored(1, buf + 256, 64); _tile_stored(2, buf + 512, 64); _tile_stored(3, buf + 768, 64); _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
    if (mode == 9) { for (int j = 0; j < 32; ++j) { _tile_loadd(4, ab, 64); _tile_loadd(6, ab + 1024, 64); _tile_dpbf16ps(0, 4, 6); _tile_loadd(7, ab + 1536, 64); _tile_dpbf16ps(1, 4, 7); _tile_loadd(5, ab + 512, 64); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
                     _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
    if (mode == 10) { for (int j = 0; j < 32; ++j) { _tile_loadd(4, ab, 64); _tile_loadd(6, ab + 1024, 64); _tile_dpbf16ps(0, 4, 6); _tile_loadd(7, ab + 1536, 64); _tile_dpbf16ps(1, 4, 7); _tile_loadd(5, ab + 512, 64); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
                     _tile_stored(0, buf, 64); _tile_stored(1, buf + 256, 64); _tile_stored(2, buf + 512, 64); _tile_stored(3, buf + 768, 64); }
    if (mode == 5) { _tile_dpbf16ps(0, 4, 6); _tile_stored(0, buf, 64); }
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("mode %d: %.1f ns an iteration (~%.0f cycles at 3 GHz)\n", mode, s / n * 1e9, s / n * 3e9);
}
