// What every AMX experiment here shares: the tile configuration (eight tiles of 16 rows x 64 bytes:
// 0-3 float32 sums, 4-5 two 16-row tiles of x, 6-7 two 16-column tiles of W in k-pairs) and the
// 2 x 2 step over one k-chunk of 32.
#pragma once
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdint>
#include <cstring>

struct alignas(64) TileCfg { uint8_t palette; uint8_t start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; };

// Loads the configuration on this thread (each thread that uses the tiles must).
inline void amx_config() {
  TileCfg c; memset(&c, 0, sizeof c); c.palette = 1;
  for (int t = 0; t < 8; ++t) { c.rows[t] = 16; c.colsb[t] = 64; }
  _tile_loadconfig(&c);
}

// Asks Linux for the tiles' register state (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), then configures.
inline void amx_init() {
  syscall(SYS_arch_prctl, 0x1023, 18);
  amx_config();
}

// Sums 0-3 += x's two tiles at a, a + 512 times W's two tiles at b, b + 512 (bf16 elements).
inline void amx_step(const uint16_t* a, const uint16_t* b) {
  _tile_loadd(4, a, 64); _tile_loadd(6, b, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, b + 512, 64);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(5, a + 512, 64);
  _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
}
