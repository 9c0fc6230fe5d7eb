// A float32 matrix product for XLA:CPU against a weight packed in column blocks, registered with
// XLA through its typed FFI (`lm/cpu_gemm.py` packs weights, builds, loads and calls it; the
// prototype and the measurements behind these choices are in experiments/ffi_gemv/).
//
//   y[M, N] = x[M, K] @ W[K, N], W stored as blocks [ceil(N / 64), K, 64] (columns past N zero).
//
// Why: a decode step reads every weight once for a few rows of activations, so its speed is the
// rate at which its products stream weights. XLA:CPU's dot reads a row-major [K, N] at 7-16 GB/s
// for 2..16 rows; a packed block is one contiguous stream, which the hardware prefetcher follows at
// the core's full read bandwidth (~25 GB/s a core on the development machine).
// How: up to 6 rows x 64 columns of y (24 zmm accumulators) stay in registers while the k loop
// streams a block; with more rows than one tile (a prefill), K is cut into chunks of 128 rows
// (32 KiB of W) that stay in L1 while every row group reads them, so the same code is a blocked
// GEMM there, level with XLA's at prefill's hundreds of rows.
// Threads: `threads` other than 1 (< 0: as many as XLA's intra-op pool has) splits the blocks into
// chunks claimed dynamically by the caller and by tasks on XLA's intra-op pool; a task that starts
// late finds no chunk left, so the caller never waits for a thread that has not started (only for
// chunks already being computed), and one busy core slows a product down instead of stalling it.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kBlock = 64;             // columns per block: 4 vectors of 16 floats
constexpr int kMaxTileRows = 6;            // rows per register tile (6 x 4 = 24 accumulators)
constexpr int64_t kChunkRows = 128;        // k-chunk when the rows need more than one tile
constexpr int64_t kMaxChunkCols = 4096;    // most columns in one claimed work chunk

// y[0:MT, 0:64] (+)= x[0:MT, 0:kn] @ w[0:kn, 0:64]; x row stride ldx, w contiguous (row stride
// 64), y row stride ldy; `accum`: add to y's values (a later k-chunk).
using MicroFn = void (*)(const float* x, int64_t ldx, const float* w, float* y, int64_t ldy,
                         int64_t kn, bool accum);

#if defined(__AVX512F__)
template <int MT>
void micro(const float* __restrict x, int64_t ldx, const float* __restrict w, float* __restrict y,
           int64_t ldy, int64_t kn, bool accum) {
  constexpr int NV = kBlock / 16;
  __m512 acc[MT][NV];
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < NV; ++v)
      acc[m][v] = accum ? _mm512_loadu_ps(y + m * ldy + v * 16) : _mm512_setzero_ps();
  for (int64_t k = 0; k < kn; ++k, w += kBlock) {
    __m512 wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_ps(w + v * 16);
    for (int m = 0; m < MT; ++m) {
      const __m512 b = _mm512_set1_ps(x[m * ldx + k]);
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_fmadd_ps(b, wv[v], acc[m][v]);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(y + m * ldy + v * 16, acc[m][v]);
}
#else
// Without AVX-512: the same loop nest in plain C++, vectorised by the compiler for the machine.
template <int MT>
void micro(const float* __restrict x, int64_t ldx, const float* __restrict w, float* __restrict y,
           int64_t ldy, int64_t kn, bool accum) {
  float acc[MT][kBlock];
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < kBlock; ++j) acc[m][j] = accum ? y[m * ldy + j] : 0.f;
  for (int64_t k = 0; k < kn; ++k, w += kBlock)
    for (int m = 0; m < MT; ++m) {
      const float b = x[m * ldx + k];
#pragma omp simd
      for (int j = 0; j < kBlock; ++j) acc[m][j] += b * w[j];
    }
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < kBlock; ++j) y[m * ldy + j] = acc[m][j];
}
#endif

const MicroFn kMicro[kMaxTileRows + 1] = {nullptr,  micro<1>, micro<2>, micro<3>,
                                          micro<4>, micro<5>, micro<6>};

struct Problem {
  const float* x;  // [M, K]
  const float* w;  // packed: [ceil(N / kBlock), K, kBlock], columns past N zero
  float* y;        // [M, N]
  int64_t m, k, n;
  int64_t tile_rows;  // rows per register tile (<= 6: 24 accumulators of 4 zmm a row)
};

// y[:, c0:c1] (c0 a multiple of kBlock), block by block.
void columns(const Problem& p, int64_t c0, int64_t c1) {
  float partial[kMaxTileRows * kBlock];  // the last block's tile when it is narrower than kBlock
  const int64_t kc = p.m <= p.tile_rows ? p.k : kChunkRows;
  for (int64_t c = c0; c < c1; c += kBlock) {
    const int64_t nc = std::min(kBlock, p.n - c);
    const float* block = p.w + (c / kBlock) * p.k * kBlock;  // [K, kBlock]
    for (int64_t m0 = 0; m0 < p.m; m0 += p.tile_rows) {
      const int64_t mt = std::min(p.tile_rows, p.m - m0);
      float* out = nc == kBlock ? p.y + m0 * p.n + c : partial;
      const int64_t ldy = nc == kBlock ? p.n : kBlock;
      for (int64_t k0 = 0; k0 < p.k; k0 += kc)
        kMicro[mt](p.x + m0 * p.k + k0, p.k, block + k0 * kBlock, out, ldy, std::min(kc, p.k - k0), k0 > 0);
      if (nc < kBlock)
        for (int64_t m = 0; m < mt; ++m)
          std::copy(partial + m * kBlock, partial + m * kBlock + nc, p.y + (m0 + m) * p.n + c);
    }
  }
}

// Work shared by the caller and the pool's tasks; owned jointly so a late task finds it alive.
struct Shared {
  Problem p;
  int64_t chunk_cols, chunks;
  std::atomic<int64_t> next{0}, done{0};
  void work() {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      const int64_t c0 = i * chunk_cols, c1 = std::min(p.n, (i + 1) * chunk_cols);
      columns(p, c0, c1);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Computes p (its tile rows set here) on the caller and, with threads, on XLA's intra-op pool.
ffi::Error Run(Problem p, ffi::ThreadPool& pool, int64_t threads) {
  if (p.m == 0 || p.n == 0) return ffi::Error::Success();
  if (p.k == 0) {
    std::fill(p.y, p.y + p.m * p.n, 0.f);
    return ffi::Error::Success();
  }
  // Rows split evenly over the fewest tiles (8 rows: 4 + 4, not 6 + 2).
  const int64_t groups = (p.m + kMaxTileRows - 1) / kMaxTileRows;
  p.tile_rows = (p.m + groups - 1) / groups;
  // threads < 0: as many as XLA's intra-op pool has (every core by default), the caller among them;
  // never more than one per 256 columns (below that a chunk costs more to hand over than to compute).
  const int64_t pool_threads = pool.num_threads();
  int64_t total = threads < 0 ? std::max<int64_t>(pool_threads, 1) : threads;
  total = std::min({total, pool_threads + 1, (p.n + 255) / 256});
  const int64_t helpers = total - 1;
  auto shared = std::make_shared<Shared>();
  shared->p = p;
  if (helpers <= 0) {
    shared->chunk_cols = p.n;
    shared->chunks = 1;
    shared->work();
    return ffi::Error::Success();
  }
  // At least 4 chunks a thread, so a slow thread's share is taken over; whole blocks of 64.
  const int64_t per = (p.n + 4 * (helpers + 1) - 1) / (4 * (helpers + 1));
  shared->chunk_cols = std::min<int64_t>(kMaxChunkCols, std::max<int64_t>(kBlock, (per + kBlock - 1) / kBlock * kBlock));
  shared->chunks = (p.n + shared->chunk_cols - 1) / shared->chunk_cols;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([shared] { shared->work(); });
  shared->work();
  // Every chunk is claimed now; wait for those another thread is still computing.
  for (int64_t spins = 0; shared->done.load(std::memory_order_acquire) < shared->chunks; ++spins)
    if (spins > 1000) std::this_thread::yield();
  return ffi::Error::Success();
}

// x [M, K] @ packed w [ceil(N / 64), K, 64] (columns past N zero) -> y [M, N].
ffi::Error PackedGemmImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                          ffi::ResultBuffer<ffi::F32> y, int64_t threads) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2 || xd[1] != wd[1] || wd[2] != kBlock ||
      yd[0] != xd[0] || (yd[1] + kBlock - 1) / kBlock != wd[0])
    return ffi::Error::InvalidArgument("lm_cpu_gemm_packed: x must be [M, K], w [ceil(N / 64), K, 64], y [M, N]");
  Problem p{};
  p.x = x.typed_data();
  p.w = w.typed_data();
  p.y = y->typed_data();
  p.m = xd[0];
  p.k = xd[1];
  p.n = yd[1];
  return Run(p, pool, threads);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LmCpuGemmPackedF32, PackedGemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("threads"));
