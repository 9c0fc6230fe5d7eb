// A matrix product for XLA:CPU against a weight packed in column blocks, registered with XLA
// through its typed FFI (`lm/cpu_gemm.py` packs weights, builds, loads and calls it; the prototype
// and the measurements behind these choices are in experiments/ffi_gemv/).
//
//   y[M, N] = x[M, K] @ W[K, N], W stored as blocks [ceil(N / B), K, B] (columns past N zero),
//   B = kBlock, the build's block width (64 with AVX-512, 16 with AVX2); x and y float32, W float32
//   (`LmCpuGemmPackedF32`) or bfloat16 (`LmCpuGemmPackedBF16`).
//
// bfloat16 weights: a decode step streams half the bytes. Each weight is widened to float32 in
// registers (a bfloat16 is the top half of a float32: a zero-extend and a shift) and multiplied
// there, so x keeps float32 precision and the sums are float32, as XLA's bf16 dot accumulates;
// every SIMD level has the instructions. (AVX512_BF16's VDPBF16PS on weights packed in k-pairs,
// rows rounded to bf16, was built and measured 1.3-1.5x slower than this at 4-16 rows on the
// 2-core AMX Xeon, [1024, 12288]: not kept; docs/results/2026-12-04-bf16-cpu.md.)
//
// Why: a decode step reads every weight once for a few rows of activations, so its speed is the
// rate at which its products stream weights. XLA:CPU's dot reads a row-major [K, N] at 7-16 GB/s
// for 2..16 rows; a packed block is one contiguous stream, which the hardware prefetcher follows at
// the core's full read bandwidth (~25 GB/s a core on the development machine).
// How: up to 6 rows x one block of y stay in registers while the k loop streams the block (AVX-512:
// 64 columns, 24 zmm accumulators; AVX2: 16 columns, 12 ymm accumulators, as its 16 registers
// cannot hold a 64-column tile). With more rows than one tile (a prefill), K is cut into chunks
// that stay in L1 while every row group reads them, so the same code is a blocked GEMM there. The
// block width is the library's (`LmCpuGemmBlock`), and `lm/cpu_gemm.py` packs to it.
// Threads: `threads` other than 1 (< 0: as many as XLA's intra-op pool has) splits the blocks into
// chunks claimed dynamically by the caller and by tasks on XLA's intra-op pool; a task that starts
// late finds no chunk left, so the caller never waits for a thread that has not started (only for
// chunks already being computed), and one busy core slows a product down instead of stalling it.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define LM_GEMM_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LM_GEMM_AVX2 1
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#if defined(LM_GEMM_AVX2)
// 16 columns (2 vectors of 8 floats): a 6-row tile is 12 of the 16 ymm registers. A block is one
// contiguous stream ([K, 16]); 4 blocks read side by side (a 64-column tile in 4 passes over
// strided lines) streamed at 9.6 GB/s where one 16-column block streams at 16.1 (decode, M = 4, 2
// threads, the development machine's 2-core AMD EPYC without AVX-512, 2026-12-01).
constexpr int64_t kBlock = 16;
// Prefill order: each k-chunk of x (every row, packed) is read by every block of a work chunk
// before the next k-chunk, so x streams from L2 rather than from L3 once per 16 columns; each
// block's [kc, 16] chunk (32 KiB at kc 512) stays in L1 over the row groups. kc: as long as x's
// chunk fits in 512 KiB (the development machine's L2 a core), 128 to 512: fewer chunks means fewer
// passes of loads and stores over y (1.2x the GFLOP/s of kc 256 at 256 rows, one core, measured).
constexpr int64_t kMaxPanelFloats = 128 * 1024;
constexpr int64_t kChunkRows = 512;
constexpr bool kChunkOuter = true;
#else
constexpr int64_t kBlock = 64;             // columns per block: 4 vectors of 16 floats
constexpr int64_t kMaxPanelFloats = 0;     // (x is read in place: no panel)
// k-chunk when the rows need more than one tile: a block's chunk up to 768 KiB, 3/4 of the 2-core
// EPYC's 1 MiB L2 a core, read from L2 by every row group. 128 reloaded the sums K / 128 times: the
// float32 prefill program at sampler_bench's (a) took 63 ms against 54 with whole-K tiles, (b)
// 0.95x (5 alternating processes each, 2026-12-06), as the bf16 kernel found (all of K: 1.12-1.23x KC 256).
constexpr int64_t kChunkRows = 3072;
constexpr bool kChunkOuter = false;        // per block, every row group over every k-chunk
#endif
constexpr int kMaxTileRows = 6;            // rows per register tile (6 x 4 zmm / 6 x 2 ymm)
constexpr int64_t kMaxChunkCols = 4096;    // most columns in one claimed work chunk
constexpr float kNegInf = -0.7f * 3.4028234663852886e38f;  // a masked score (lm.model._NEG_INF)

// y[0:MT, 0:B] (+)= x[0:MT, 0:kn] @ w[0:kn, 0:B] (B = kBlock); x[m, k] at x[m * ldx + k * ldk]
// (row-major x, or a packed k-major panel), w contiguous (row stride B) of float32 or bfloat16
// (W = float or uint16_t, the bf16 bits), y row stride ldy; `accum`: add to y's values (a later
// k-chunk).
template <typename W>
using MicroFn = void (*)(const float* x, int64_t ldx, int64_t ldk, const W* w, float* y,
                         int64_t ldy, int64_t kn, bool accum);

// Scalar bf16 -> float32 (the bits as a float32's top half).
inline float widen(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  __builtin_memcpy(&out, &wide, sizeof out);
  return out;
}
inline float widen(float value) { return value; }

#if defined(LM_GEMM_AVX512)
// Weight rows a micro-kernel prefetches ahead of the one it multiplies. A decode step's products
// stream their weights from memory: with 16 rows ahead, the [1024, 151936] output head at 4 rows
// ran 1.25x faster in bf16 (18.7 -> 14.9 ms) and 1.21x in float32 (30.5 -> 25.2), 8 rows 1.23x and
// 1.18x; 8 and 32 rows ahead were no better (2-core AMX Xeon, 8 interleaved calls, 2026-12-04).
constexpr int64_t kPrefetchRows = 16;
// 16 weights at p as float32.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

template <int MT, typename W>
void micro(const float* __restrict x, int64_t ldx, int64_t ldk, const W* __restrict w,
           float* __restrict y, int64_t ldy, int64_t kn, bool accum) {
  // Fully unrolled loops over the tile and y added after the k loop (as in the AVX2 path below).
  // (A narrow tile of 7-12 rows over half a block, so a decode step's 8 rows load each weight
  // once, measured 1.3-1.5x slower than 4 + 4 rows over the whole block; not kept.)
  constexpr int NV = kBlock / 16;
  __m512 acc[MT][NV];
#pragma GCC unroll 24
  for (int i = 0; i < MT * NV; ++i) acc[i / NV][i % NV] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kn; ++k, w += kBlock) {
    // The block's row kPrefetchRows ahead, every cache line of it: more loads in flight than the
    // hardware's stream prefetcher keeps (an x86 prefetch past the block's end never faults).
#pragma GCC unroll 4
    for (int line = 0; line < kBlock * static_cast<int>(sizeof(W)); line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchRows * kBlock) + line, _MM_HINT_T0);
    __m512 wv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) wv[v] = load16(w + v * 16);
#pragma GCC unroll 6
    for (int m = 0; m < MT; ++m) {
      const __m512 b = _mm512_set1_ps(x[m * ldx + k * ldk]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_fmadd_ps(b, wv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 24
  for (int i = 0; i < MT * NV; ++i) {
    float* out = y + (i / NV) * ldy + (i % NV) * 16;
    _mm512_storeu_ps(out, accum ? _mm512_add_ps(acc[i / NV][i % NV], _mm512_loadu_ps(out)) : acc[i / NV][i % NV]);
  }
}
#elif defined(LM_GEMM_AVX2)
// 8 weights at p as float32.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

template <int MT, typename W>
void micro(const float* __restrict x, int64_t ldx, int64_t ldk, const W* __restrict w,
           float* __restrict y, int64_t ldy, int64_t kn, bool accum) {
  // Fully unrolled loops over the tile and y added after the k loop: otherwise GCC keeps the
  // accumulators on the stack too, a store per FMA (a third of the rate, measured). y's lines are
  // fetched while the k loop runs: in a prefill they are rows N floats apart, last touched a whole
  // k-chunk earlier (1.1-1.25x the GFLOP/s at 256 rows, one core, measured).
  __m256 acc[MT][2];
#pragma GCC unroll 6
  for (int m = 0; m < MT; ++m) {
    acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    _mm_prefetch(reinterpret_cast<const char*>(y + m * ldy), _MM_HINT_T0);
  }
  for (int64_t k = 0; k < kn; ++k, w += kBlock) {
    const __m256 w0 = load8(w), w1 = load8(w + 8);
#pragma GCC unroll 6
    for (int m = 0; m < MT; ++m) {
      const __m256 b = _mm256_broadcast_ss(x + m * ldx + k * ldk);
      acc[m][0] = _mm256_fmadd_ps(b, w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(b, w1, acc[m][1]);
    }
  }
#pragma GCC unroll 6
  for (int m = 0; m < MT; ++m) {
    float* out = y + m * ldy;
    if (accum) {
      acc[m][0] = _mm256_add_ps(acc[m][0], _mm256_loadu_ps(out));
      acc[m][1] = _mm256_add_ps(acc[m][1], _mm256_loadu_ps(out + 8));
    }
    _mm256_storeu_ps(out, acc[m][0]);
    _mm256_storeu_ps(out + 8, acc[m][1]);
  }
}
#else
// Without AVX-512 or AVX2: the same loop nest in plain C++, vectorised by the compiler.
template <int MT, typename W>
void micro(const float* __restrict x, int64_t ldx, int64_t ldk, const W* __restrict w,
           float* __restrict y, int64_t ldy, int64_t kn, bool accum) {
  float acc[MT][kBlock];
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < kBlock; ++j) acc[m][j] = accum ? y[m * ldy + j] : 0.f;
  for (int64_t k = 0; k < kn; ++k, w += kBlock)
    for (int m = 0; m < MT; ++m) {
      const float b = x[m * ldx + k * ldk];
#pragma omp simd
      for (int j = 0; j < kBlock; ++j) acc[m][j] += b * widen(w[j]);
    }
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < kBlock; ++j) y[m * ldy + j] = acc[m][j];
}
#endif

template <typename W>
constexpr MicroFn<W> kMicro[kMaxTileRows + 1] = {nullptr,        micro<1, W>, micro<2, W>, micro<3, W>,
                                                 micro<4, W>,    micro<5, W>, micro<6, W>};

template <typename W>
struct Problem {
  const float* x;  // [M, K]
  const W* w;      // packed: [ceil(N / kBlock), K, kBlock], columns past N zero
  float* y;        // [M, N]
  int64_t m, k, n;
  int64_t tile_rows;  // rows per register tile (<= kMaxTileRows)
};

// y[:, c] (+)= x[:, k0:k1] @ w[k0:k1, c:c + kBlock] for the block at column c, every row group;
// `accum`: add to y (not the first k-chunk). A block narrower than kBlock (the last, columns past
// N zero) computes into `partial` ([M, kBlock], the caller's), copied into y after its last chunk.
// `panel`: x[:, k0:k1] packed by `pack_panel`, or null to read x itself.
template <typename W>
void block_rows(const Problem<W>& p, int64_t c, int64_t k0, int64_t k1, bool accum, float* partial,
                const float* panel) {
  const int64_t nc = std::min(kBlock, p.n - c);
  const W* block = p.w + (c / kBlock) * p.k * kBlock + k0 * kBlock;  // [K, kBlock] from row k0
  float* out = nc == kBlock ? p.y + c : partial;
  const int64_t ldy = nc == kBlock ? p.n : kBlock;
  for (int64_t m0 = 0; m0 < p.m; m0 += p.tile_rows) {
    const int64_t mt = std::min(p.tile_rows, p.m - m0);
    if (panel)
      kMicro<W>[mt](panel + m0 * (k1 - k0), 1, mt, block, out + m0 * ldy, ldy, k1 - k0, accum);
    else
      kMicro<W>[mt](p.x + m0 * p.k + k0, p.k, 1, block, out + m0 * ldy, ldy, k1 - k0, accum);
  }
  if (nc < kBlock && k1 == p.k)
    for (int64_t m = 0; m < p.m; ++m) std::copy(partial + m * kBlock, partial + m * kBlock + nc, p.y + m * p.n + c);
}

// x[:, k0:k1] as consecutive row groups, each [k1 - k0, rows of the group] (k-major), so a tile's
// broadcasts read one contiguous stream instead of one per row (rows K floats apart).
template <typename W>
void pack_panel(const Problem<W>& p, int64_t k0, int64_t k1, float* panel) {
  const int64_t kn = k1 - k0;
  for (int64_t m0 = 0; m0 < p.m; m0 += p.tile_rows) {
    const int64_t mt = std::min(p.tile_rows, p.m - m0);
    float* group = panel + m0 * kn;
    for (int64_t m = 0; m < mt; ++m) {
      const float* row = p.x + (m0 + m) * p.k + k0;
      for (int64_t k = 0; k < kn; ++k) group[k * mt + m] = row[k];
    }
  }
}

// y[:, c0:c1] (c0 a multiple of kBlock). Rows within one tile (decode): each block over all of K
// at once. More rows (prefill): K in chunks, per block (kChunkOuter false) or, with x's chunk
// packed once for every block of the work chunk, per work chunk (kChunkOuter true).
template <typename W>
void columns(const Problem<W>& p, int64_t c0, int64_t c1) {
  const bool prefill = p.m > p.tile_rows;
  int64_t kc = prefill ? kChunkRows : p.k;
  if (kChunkOuter && prefill)  // x's packed chunk within kMaxPanelFloats, in steps of 64, >= 128
    kc = std::min(p.k, std::max<int64_t>(128, std::min(kc, kMaxPanelFloats / p.m / 64 * 64)));
  const bool ragged = c1 == p.n && p.n % kBlock != 0;  // this chunk holds the last, narrower block
  std::unique_ptr<float[]> partial(ragged ? new float[p.m * kBlock] : nullptr);
  if (kChunkOuter && prefill) {
    std::unique_ptr<float[]> panel(new float[p.m * kc]);
    for (int64_t k0 = 0; k0 < p.k; k0 += kc) {
      const int64_t k1 = std::min(p.k, k0 + kc);
      pack_panel(p, k0, k1, panel.get());
      for (int64_t c = c0; c < c1; c += kBlock) block_rows(p, c, k0, k1, k0 > 0, partial.get(), panel.get());
    }
    return;
  }
  for (int64_t c = c0; c < c1; c += kBlock)
    for (int64_t k0 = 0; k0 < p.k; k0 += kc)
      block_rows(p, c, k0, std::min(p.k, k0 + kc), k0 > 0, partial.get(), nullptr);
}

// Runs body(0..chunks-1) on the caller and on up to `helpers` tasks of XLA's intra-op pool. Chunks
// are claimed dynamically; the work is owned jointly so a late task finds it alive. A task that
// starts late finds no chunk left, so the caller never waits for a thread that has not started
// (only for chunks already being computed), and one busy core slows the call instead of stalling it.
struct Chunks {
  std::function<void(int64_t)> body;
  int64_t chunks = 0;
  std::atomic<int64_t> next{0}, done{0};
  void work() {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      body(i);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

void ParallelChunks(ffi::ThreadPool& pool, int64_t helpers, int64_t chunks, std::function<void(int64_t)> body) {
  auto shared = std::make_shared<Chunks>();
  shared->body = std::move(body);
  shared->chunks = chunks;
  for (int64_t t = 0; t < std::min(helpers, chunks - 1); ++t) pool.Schedule([shared] { shared->work(); });
  shared->work();
  // Every chunk is claimed now; wait for those another thread is still computing.
  for (int64_t spins = 0; shared->done.load(std::memory_order_acquire) < shared->chunks; ++spins)
    if (spins > 1000) std::this_thread::yield();
}

// Threads a call uses in all, the caller among them: `threads` < 0 as many as XLA's intra-op pool
// has (every core by default), never more than the pool plus the caller, nor than `most`.
int64_t TotalThreads(ffi::ThreadPool& pool, int64_t threads, int64_t most) {
  const int64_t pool_threads = pool.num_threads();
  const int64_t total = threads < 0 ? std::max<int64_t>(pool_threads, 1) : threads;
  return std::max<int64_t>(1, std::min({total, pool_threads + 1, most}));
}

// Runs body(0..units-1), each unit on one thread: on the caller alone, or claimed by it and tasks
// on XLA's pool (`threads` as TotalThreads's). The attention kernels' units are (row, kv head).
void EachUnit(ffi::ThreadPool& pool, int64_t threads, int64_t units, std::function<void(int64_t)> body) {
  const int64_t helpers = TotalThreads(pool, threads, units) - 1;
  if (helpers <= 0) {
    for (int64_t i = 0; i < units; ++i) body(i);
  } else {
    ParallelChunks(pool, helpers, units, std::move(body));
  }
}

// Computes p (its tile rows set here) on the caller and, with threads, on XLA's intra-op pool.
template <typename W>
ffi::Error Run(Problem<W> p, ffi::ThreadPool& pool, int64_t threads) {
  if (p.m == 0 || p.n == 0) return ffi::Error::Success();
  if (p.k == 0) {
    std::fill(p.y, p.y + p.m * p.n, 0.f);
    return ffi::Error::Success();
  }
  // Rows split evenly over the fewest tiles (8 rows: 4 + 4, not 6 + 2).
  const int64_t groups = (p.m + kMaxTileRows - 1) / kMaxTileRows;
  p.tile_rows = (p.m + groups - 1) / groups;
  // Never more than one thread per 256 columns (below that a chunk costs more to hand over than
  // to compute).
  const int64_t helpers = TotalThreads(pool, threads, (p.n + 255) / 256) - 1;
  if (helpers <= 0) {
    columns(p, 0, p.n);
    return ffi::Error::Success();
  }
  // At least 4 chunks a thread, so a slow thread's share is taken over; whole blocks of 64.
  const int64_t per = (p.n + 4 * (helpers + 1) - 1) / (4 * (helpers + 1));
  const int64_t cols = std::min<int64_t>(kMaxChunkCols, std::max<int64_t>(kBlock, (per + kBlock - 1) / kBlock * kBlock));
  ParallelChunks(pool, helpers, (p.n + cols - 1) / cols, [p, cols](int64_t i) {
    columns(p, i * cols, std::min(p.n, (i + 1) * cols));
  });
  return ffi::Error::Success();
}

// x [M, K] @ packed w [ceil(N / B), K, B] (columns past N zero) -> y [M, N]; T the weight's type.
template <ffi::DataType T>
ffi::Error PackedGemmImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<T> w,
                          ffi::ResultBuffer<ffi::F32> y, int64_t threads) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2 || xd[1] != wd[1] || wd[2] != kBlock ||
      yd[0] != xd[0] || (yd[1] + kBlock - 1) / kBlock != wd[0])
    return ffi::Error::InvalidArgument(
        "lm_cpu_gemm_packed: x must be [M, K], w [ceil(N / B), K, B] with B this build's block width "
        "(LmCpuGemmBlock), y [M, N]");
  Problem<ffi::NativeType<T>> p{};
  p.x = x.typed_data();
  p.w = w.typed_data();
  p.y = y->typed_data();
  p.m = xd[0];
  p.k = xd[1];
  p.n = yd[1];
  return Run(p, pool, threads);
}

// ---- A prefill's bfloat16 products with AVX512_BF16 (VDPBF16PS) ----------------------------------
//
// y[M, N] = x[M, K] @ W[K, N] for bfloat16 rows x (row-major) and the packed bfloat16 weight above
// ([ceil(N / 64), K, 64]); float32 sums, as XLA's bf16 dot (VDPBF16PS adds two products of bf16
// values to a float32 sum; bf16 subnormals count as zero, as the instruction defines).
// Why: a prefill's products are most of its first token (shape (b) of benchmarks/sampler_bench.py
// in bf16: 589 of 674 ms), and XLA's bf16 dot (YNNPACK) ran them at 336-385 GFLOP/s on the 2-core
// EPYC whose VDPBF16PS peak is 444: vLLM's prepacked oneDNN products ran the same four shapes at
// 417-448 (docs/results/2026-12-06-bf16-prefill-products.md). The decode steps' widened float32
// products (above) stay: at a few rows VDPBF16PS on k-pairs measured 1.3-1.5x slower.
// How: one unit of work is one 64-column block over every row, in tiles of 6 rows x 64 columns (24
// zmm sums) over all of K, so each sum is stored once (chunking K and reloading the sums measured
// 0.85x). Rows k and k + 1 of the block (two 128-byte rows of the decode layout) are interleaved
// into k-pairs in registers (VPUNPCKLWD / VPUNPCKHWD: 4 shuffles per 24 VDPBF16PS, which measured
// level with a weight packed in k-pairs, so one packed copy serves both decode and prefill); x's
// k-pair is one 32-bit broadcast read in place. The block (K x 128 bytes) stays in L2 over the
// row tiles. The interleave leaves a sum's lanes in the column order 0-3, 8-11, ... (low) and 4-7,
// 12-15, ... (high), put back in order at the store.
#if defined(__AVX512BF16__) && defined(LM_GEMM_AVX512)
#define LM_GEMM_BF16_DOT 1
constexpr int kDotRows = 6;

// y[0:rows, 0:cols] = x[0:rows, 0:K] @ block [K, 64] (rows <= kDotRows, cols <= 64; a shorter tile
// computes its last row again for the missing ones and stores only its own).
template <typename Y>
inline void DotTile(const uint16_t* x, int64_t ldx, const uint16_t* block, int64_t k, Y* y, int64_t ldy,
                    int rows, int cols) {
  __m512 s[kDotRows][4];
  for (int m = 0; m < kDotRows; ++m)
    for (int j = 0; j < 4; ++j) s[m][j] = _mm512_setzero_ps();
  const uint16_t* xr[kDotRows];
  for (int m = 0; m < kDotRows; ++m) xr[m] = x + std::min(m, rows - 1) * ldx;
  const int64_t pairs = k / 2;
  auto step = [&](__m512i r0a, __m512i r0b, __m512i r1a, __m512i r1b, auto pair_of_row) {
    const __m512bh b[4] = {(__m512bh)_mm512_unpacklo_epi16(r0a, r1a), (__m512bh)_mm512_unpackhi_epi16(r0a, r1a),
                           (__m512bh)_mm512_unpacklo_epi16(r0b, r1b), (__m512bh)_mm512_unpackhi_epi16(r0b, r1b)};
#pragma GCC unroll 6
    for (int m = 0; m < kDotRows; ++m) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair_of_row(m));
      for (int j = 0; j < 4; ++j) s[m][j] = _mm512_dpbf16_ps(s[m][j], a, b[j]);
    }
  };
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t* w = block + p * 128;
    step(_mm512_loadu_si512(w), _mm512_loadu_si512(w + 32), _mm512_loadu_si512(w + 64),
         _mm512_loadu_si512(w + 96), [&](int m) {
           int32_t v;
           std::memcpy(&v, xr[m] + 2 * p, 4);
           return v;
         });
  }
  if (k % 2) {  // the last k alone: paired with a zero row and a zero x
    const uint16_t* w = block + (k - 1) * 64;
    const __m512i zero = _mm512_setzero_si512();
    step(_mm512_loadu_si512(w), _mm512_loadu_si512(w + 32), zero, zero,
         [&](int m) { return static_cast<int32_t>(xr[m][k - 1]); });
  }
  const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int m = 0; m < rows; ++m)
    for (int half = 0; half < 2; ++half) {
      const __m512 out[2] = {_mm512_permutex2var_ps(s[m][2 * half], lo, s[m][2 * half + 1]),
                             _mm512_permutex2var_ps(s[m][2 * half], hi, s[m][2 * half + 1])};
      for (int q = 0; q < 2; ++q) {
        const int c0 = 32 * half + 16 * q;
        if (c0 >= cols) break;
        const __mmask16 keep = cols - c0 >= 16 ? 0xffff : static_cast<__mmask16>((1u << (cols - c0)) - 1);
        if constexpr (std::is_same_v<Y, float>)
          _mm512_mask_storeu_ps(y + m * ldy + c0, keep, out[q]);
        else  // rounded to nearest even (VCVTNEPS2BF16)
          _mm256_mask_storeu_epi16(y + m * ldy + c0, keep, (__m256i)_mm512_cvtneps_pbh(out[q]));
      }
    }
}
#endif

// run(y's data) as float* or, for a bfloat16 y, uint16_t* (the bf16 kernels' outputs).
template <typename Run>
ffi::Error WithOutput(ffi::Result<ffi::AnyBuffer>& y, Run run) {
  if (y->element_type() == ffi::DataType::BF16)
    run(static_cast<uint16_t*>(y->untyped_data()));
  else
    run(static_cast<float*>(y->untyped_data()));
  return ffi::Error::Success();
}

// What a bf16 kernel's handler answers in a build without AVX512_BF16.
inline ffi::Error NoBF16Dot(const char* target) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented,
                    std::string(target) + ": this build has no AVX512_BF16 (LmCpuGemmBF16Dot() is 0)");
}

// bfloat16 x [M, K] @ packed bfloat16 w [ceil(N / 64), K, 64] -> y [M, N] float32 by VDPBF16PS
// (above); a build without AVX512_BF16 refuses the call (`LmCpuGemmBF16Dot` says which it is).
ffi::Error PackedDotBF16Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> w,
                             ffi::Result<ffi::AnyBuffer> y, int64_t threads) {
#if defined(LM_GEMM_BF16_DOT)
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2 || xd[1] != wd[1] || wd[2] != kBlock ||
      yd[0] != xd[0] || (yd[1] + kBlock - 1) / kBlock != wd[0] ||
      (y->element_type() != ffi::DataType::F32 && y->element_type() != ffi::DataType::BF16))
    return ffi::Error::InvalidArgument(
        "lm_cpu_gemm_packed_bf16_dot: x must be [M, K] bfloat16, w [ceil(N / 64), K, 64] bfloat16, y [M, N] "
        "float32 or bfloat16");
  const int64_t m = xd[0], k = xd[1], n = yd[1], blocks = wd[0];
  if (m == 0 || n == 0) return ffi::Error::Success();
  const auto* xp = reinterpret_cast<const uint16_t*>(x.typed_data());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.typed_data());
  if (k == 0) {
    std::memset(y->untyped_data(), 0, y->size_bytes());  // +0.0 in either dtype
    return ffi::Error::Success();
  }
  // One unit a 64-column block, claimed dynamically (a slow thread's share is taken over); a
  // software prefetch of the next block's weights into L2 measured no faster (1.01x).
  auto run = [&](auto* yp) {
    EachUnit(pool, threads, blocks, [=](int64_t c) {
      const int cols = static_cast<int>(std::min<int64_t>(kBlock, n - c * kBlock));
      for (int64_t r = 0; r < m; r += kDotRows)
        DotTile(xp + r * k, k, wp + c * k * kBlock, k, yp + r * n + c * kBlock, n,
                static_cast<int>(std::min<int64_t>(kDotRows, m - r)), cols);
    });
  };
  return WithOutput(y, run);
#else
  return NoBF16Dot("lm_cpu_gemm_packed_bf16_dot");
#endif
}

// exp(x) in float32 within ~2 ulp, branch-free so that a loop of it vectorises (std::exp is a
// scalar libm call: ~4M of them a float32 forward at rl_bench's shape). x = n ln2 + f with
// |f| <= ln2 / 2 (ln2 in two parts), e^f by its degree-6 Taylor polynomial, 2^n in the exponent
// bits; x below -87.3 (kNegInf, -inf) gives 0, as std::exp's underflow does to float32.
inline float FastExp(float x) {
  const float lo = -87.33654f;
  const float y = std::max(x, lo);
  const float n = std::nearbyint(y * 1.44269504088896341f);
  const float f = (y - n * 0.693359375f) + n * 2.12194440e-4f;
  float e = 1.f / 720;
  e = e * f + 1.f / 120;
  e = e * f + 1.f / 24;
  e = e * f + 1.f / 6;
  e = e * f + 0.5f;
  e = e * f + 1.f;
  e = e * f + 1.f;
  int32_t bits;
  std::memcpy(&bits, &e, 4);
  bits += static_cast<int32_t>(n) << 23;
  float out;
  std::memcpy(&out, &bits, 4);
  return x < lo ? 0.f : out;
}

// Each of the g rows of scores [g, s] -> its softmax, in place (as the model's: a row of masked
// scores, all kNegInf, becomes uniform).
inline void DecodeSoftmax(float* scores, int64_t g, int64_t s) {
  for (int64_t j = 0; j < g; ++j) {
    float* row = scores + j * s;
    float top = row[0];
    for (int64_t t = 1; t < s; ++t) top = std::max(top, row[t]);
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t t = 0; t < s; ++t) total += (row[t] = FastExp(row[t] - top));
    const float inv = 1.f / total;
#pragma omp simd
    for (int64_t t = 0; t < s; ++t) row[t] *= inv;
  }
}

// One decode step's attention for one (row, kv head): the G queries sharing that kv head over its
// S cached keys and values, scores and softmax in float32. Each key and value is read once for all
// G queries, so the step streams the cache once (XLA:CPU's fused multiply-reduce over
// [B, K, G, S, H] ran at ~5x the bytes' time: 12 + 6 ms of a 76 ms bf16 step at Qwen3-0.6B's
// shape, docs/results/2026-12-05-bf16-first-token.md). The cache is float32 or bfloat16 (T = float
// or uint16_t, the bf16 bits): a bf16 key or value is widened in registers, so a bf16 cache
// streams half the bytes and gives the same scores as its float32 copy.
template <typename T>
void DecodeHead(const float* q, const T* k, const T* v, const bool* mask, float* out, int64_t g,
                int64_t s, int64_t h, float scale, float* scores) {
  for (int64_t j = 0; j < g; ++j) {
    float* row = scores + j * s;
    const float* qj = q + j * h;
    for (int64_t t = 0; t < s; ++t) {
      const T* kt = k + t * h;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t e = 0; e < h; ++e) dot += qj[e] * widen(kt[e]);
      row[t] = mask[t] ? dot * scale : kNegInf;
    }
  }
  DecodeSoftmax(scores, g, s);
  std::fill(out, out + g * h, 0.f);
  for (int64_t t = 0; t < s; ++t) {
    const T* vt = v + t * h;
    for (int64_t j = 0; j < g; ++j) {
      const float p = scores[j * s + t];
      float* oj = out + j * h;
#pragma omp simd
      for (int64_t e = 0; e < h; ++e) oj[e] += p * widen(vt[e]);
    }
  }
}

#if defined(LM_GEMM_AVX512)
// out[j, :] = sum_t p[j, t] v[t, :] for the g rows of probabilities p = scores [g, s], in tiles
// of QJ queries x CN * 16 dims whose sums stay in registers over every key (a tile's sizes are
// compile-time, so its sums never touch memory); a last partial group repeats its last query and
// stores only the rows it has. The head dim h is a multiple of CN * 16.
template <typename T, int QJ, int CN>
void DecodeOutput(const float* scores, const T* v, float* out, int64_t g, int64_t s, int64_t h) {
  for (int64_t j0 = 0; j0 < g; j0 += QJ) {
    const float* p[QJ];
    for (int j = 0; j < QJ; ++j) p[j] = scores + std::min<int64_t>(j0 + j, g - 1) * s;
    for (int64_t e0 = 0; e0 < h; e0 += 16 * CN) {
      __m512 acc[QJ][CN];
      for (auto& a : acc)
        for (auto& x : a) x = _mm512_setzero_ps();
      for (int64_t t = 0; t < s; ++t) {
        __m512 vals[CN];
#pragma GCC unroll 8
        for (int c = 0; c < CN; ++c) vals[c] = load16(v + t * h + e0 + 16 * c);
#pragma GCC unroll 4
        for (int j = 0; j < QJ; ++j) {
          const __m512 pj = _mm512_set1_ps(p[j][t]);
#pragma GCC unroll 8
          for (int c = 0; c < CN; ++c) acc[j][c] = _mm512_fmadd_ps(pj, vals[c], acc[j][c]);
        }
      }
      for (int j = 0; j < QJ && j0 + j < g; ++j)
        for (int c = 0; c < CN; ++c) _mm512_storeu_ps(out + (j0 + j) * h + e0 + 16 * c, acc[j][c]);
    }
  }
}

// DecodeHead for a head dim that is a multiple of 16, in register tiles: the scores of 4 keys x 2
// queries at once (8 independent sums; each key read once for both queries, the keys in memory
// order), and the output in tiles held in registers over all S keys (`DecodeOutput`). The plain
// loops above widen each key for every query, sum one key at a time and load and store the output
// after every key: with a bf16 cache they ran at the arithmetic's speed, not the bytes'. 28 layers'
// caches at Qwen3-0.6B's shape (B 4, K 8, G 2, S 192, H 128), 2 threads, 2-core AMD EPYC,
// 2026-12-05: bf16 3.5 ms against 6.3, float32 7.0 against 7.9 (the bytes alone: 2.8 and 5.7 ms
// at 31 GB/s); at shape (a)'s (B 8, K 4, H 64) bf16 1.7 against 4.4, float32 2.8 against 3.7.
template <typename T>
void DecodeHead16(const float* q, const T* k, const T* v, const bool* mask, float* out, int64_t g,
                  int64_t s, int64_t h, float scale, float* scores) {
  const int64_t chunks = h / 16;
  for (int64_t j0 = 0; j0 < g; j0 += 2) {
    const int64_t gj = std::min<int64_t>(2, g - j0);
    const float* q0 = q + j0 * h;
    const float* q1 = q + (j0 + gj - 1) * h;  // (the same row again where one is left)
    int64_t t = 0;
    for (; t + 4 <= s; t += 4) {
      __m512 acc[2][4];
      for (auto& a : acc)
        for (auto& x : a) x = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {  // the keys in memory order (4 rows read side by side stream slower)
        const T* key_row = k + (t + u) * h;
        for (int64_t c = 0; c < chunks; ++c) {
          const __m512 key = load16(key_row + 16 * c);
          acc[0][u] = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + 16 * c), key, acc[0][u]);
          acc[1][u] = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + 16 * c), key, acc[1][u]);
        }
      }
      for (int64_t j = 0; j < gj; ++j)
        for (int u = 0; u < 4; ++u)
          scores[(j0 + j) * s + t + u] = mask[t + u] ? _mm512_reduce_add_ps(acc[j][u]) * scale : kNegInf;
    }
    for (; t < s; ++t) {
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c) {
        const __m512 key = load16(k + t * h + 16 * c);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + 16 * c), key, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + 16 * c), key, a1);
      }
      scores[j0 * s + t] = mask[t] ? _mm512_reduce_add_ps(a0) * scale : kNegInf;
      if (gj == 2) scores[(j0 + 1) * s + t] = mask[t] ? _mm512_reduce_add_ps(a1) * scale : kNegInf;
    }
  }
  DecodeSoftmax(scores, g, s);
  // The output: whole rows of 128 dims for 2 queries (16 sums), else 64 for 4, else 16 for 4.
  if (chunks % 8 == 0) {
    DecodeOutput<T, 2, 8>(scores, v, out, g, s, h);
  } else if (chunks % 4 == 0) {
    DecodeOutput<T, 4, 4>(scores, v, out, g, s, h);
  } else {
    DecodeOutput<T, 4, 1>(scores, v, out, g, s, h);
  }
}
#endif

// The decode head for head dim h: the register tiles where h is a multiple of 16 (AVX-512), else
// the plain loops.
template <typename T>
auto DecodeHeadFor(int64_t h) {
  auto head = DecodeHead<T>;
#if defined(LM_GEMM_AVX512)
  if (h % 16 == 0) head = DecodeHead16<T>;
#endif
  return head;
}

// q [B, K, G, H] float32, k and v [B, K, S, H] (the cache: float32, or bfloat16 for E = BF16),
// mask [B, S] -> out [B, K, G, H] float32; (row, kv head) pairs split over the threads.
template <ffi::DataType E>
ffi::Error DecodeAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<E> k,
                               ffi::Buffer<E> v, ffi::Buffer<ffi::PRED> mask,
                               ffi::ResultBuffer<ffi::F32> out, float scale, int64_t threads) {
  using T = std::conditional_t<E == ffi::DataType::BF16, uint16_t, float>;
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || md.size() != 2 || kd[0] != qd[0] ||
      kd[1] != qd[1] || kd[3] != qd[3] || vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2] ||
      vd[3] != kd[3] || md[0] != qd[0] || md[1] != kd[2])
    return ffi::Error::InvalidArgument(
        "lm_cpu_decode_attention: q must be [B, K, G, H], k and v [B, K, S, H], mask [B, S]");
  const int64_t b = qd[0], heads = qd[1], g = qd[2], h = qd[3], s = kd[2];
  if (b * heads * g * h == 0) return ffi::Error::Success();
  if (s == 0) return ffi::Error::InvalidArgument("lm_cpu_decode_attention: no keys (S = 0)");
  const float* qp = q.typed_data();
  const T* kp = reinterpret_cast<const T*>(k.untyped_data());
  const T* vp = reinterpret_cast<const T*>(v.untyped_data());
  const bool* mp = mask.typed_data();
  float* op = out->typed_data();
  const auto head = DecodeHeadFor<T>(h);
  auto pair = [=](int64_t i) {  // i = row * heads + head
    std::unique_ptr<float[]> scores(new float[g * s]);
    head(qp + i * g * h, kp + i * s * h, vp + i * s * h, mp + (i / heads) * s, op + i * g * h, g, s, h, scale,
         scores.get());
  };
  EachUnit(pool, threads, b * heads, pair);
  return ffi::Error::Success();
}


// A KV cache write in place: cache [B, K, S, H] with update [B, K, T, H] at slots
// [start, start + T), start = clamp(index, 0, S - T) as XLA's dynamic-update-slice; any dtype of
// 2 or 4 bytes (the bits are copied). The result is the cache operand's buffer (the call aliases
// them); where XLA gave it a buffer of its own, the cache is copied there first.
// Why: XLA:CPU runs a bfloat16 dynamic-update-slice in float32 (its float normalization), as a
// convert of the whole cache, the write, and a convert back: a pass over both caches of every
// layer at every decode step (2.9 ms of a ~41 ms bf16 step at Qwen3-0.6B's shape, 192 slots),
// where the write itself is B x K x H values.
ffi::Error CacheWriteImpl(ffi::AnyBuffer cache, ffi::AnyBuffer update, ffi::Buffer<ffi::S32> index,
                          ffi::Result<ffi::AnyBuffer> out) {
  const auto cd = cache.dimensions(), ud = update.dimensions();
  if (cd.size() != 4 || ud.size() != 4 || ud[0] != cd[0] || ud[1] != cd[1] || ud[3] != cd[3] || ud[2] > cd[2] ||
      update.element_type() != cache.element_type() || out->element_type() != cache.element_type() ||
      index.element_count() != 1)
    return ffi::Error::InvalidArgument(
        "lm_cpu_cache_write: cache must be [B, K, S, H], update [B, K, T <= S, H] of its dtype, index a scalar");
  const size_t bytes = ffi::ByteWidth(cache.element_type());
  if (bytes != 2 && bytes != 4) return ffi::Error::InvalidArgument("lm_cpu_cache_write: 2- or 4-byte values only");
  auto* dst = static_cast<char*>(out->untyped_data());
  if (dst != cache.untyped_data()) std::memcpy(dst, cache.untyped_data(), cache.size_bytes());
  const int64_t rows = cd[0] * cd[1], s = cd[2], t = ud[2], h = cd[3];
  const int64_t start = std::clamp<int64_t>(index.typed_data()[0], 0, s - t);
  const auto* src = static_cast<const char*>(update.untyped_data());
  const size_t span = t * h * bytes;
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + ((r * s + start) * h) * bytes, src + r * span, span);
  return ffi::Error::Success();
}

// ---- Attention over whole sequences (a prefill's, a train step's): forward and backward ----------
//
// Why: XLA:CPU runs a train step's attention as batched products over [B, K, G, T, S] scores with
// layout copies between them, about 37% of a float32 step's time for 4% of its FLOPs at rl_bench's
// shape (docs/results/2026-12-04-bf16-cpu.md). Here each (row, kv head) is one unit of work: its
// G x T queries against its S keys, the scores of a tile of queries held in L1, the products done
// as register-tiled outer products, and nothing of [T, S] size written to memory in the forward.
// Scores, softmax and sums are float32; a masked score is kNegInf as in the model (a row with no
// key attends every key uniformly, as its softmax does), keys past S are -inf (never counted).

// The compiler vectorises these loops; on AVX-512 CPUs GCC's tuning would make them 256 bits wide.
// 512 ran the float32 forward and backward at rl_bench's shape in 26.5 ms against 32.8 (2-core
// AMX Xeon). Only this section: built 512 wide, the decode steps measured slower at sampler_bench's
// shapes (a) float32 and (b) bfloat16 (0.93x, 2 trials, 2026-12-05).
#pragma GCC push_options
#pragma GCC target("prefer-vector-width=512")

constexpr int kAttRows = 4;   // query rows of a register tile
constexpr int kAttKeys = 64;  // keys of a scores tile; the backward's key block
constexpr int kAttBwdRows = 16;  // query rows per backward tile (the dK, dV updates sum over them)

constexpr int kAttStep = 16;  // keys a forward's tile of query rows skips past its last key in

// a[r * lda + j] = sum_e x[r][e] * yt[e * ldy + j] for r < MR, j < NK (yt a [h, >= NK] panel).
template <int MR, int NK = kAttKeys>
void ScoreTile(const float* const* x, const float* yt, int64_t ldy, int64_t h, float* a, int64_t lda) {
  float acc[MR][NK] = {};
  for (int64_t e = 0; e < h; ++e) {
    const float* y = yt + e * ldy;
    for (int r = 0; r < MR; ++r) {
      const float xv = x[r][e];
#pragma omp simd
      for (int j = 0; j < NK; ++j) acc[r][j] += xv * y[j];
    }
  }
  for (int r = 0; r < MR; ++r)
#pragma omp simd
    for (int j = 0; j < NK; ++j) a[r * lda + j] = acc[r][j];
}

template <int NK = kAttKeys>
void Scores(const float* const* x, int64_t m, const float* yt, int64_t ldy, int64_t h, float* a, int64_t lda) {
  for (int64_t r = 0; r < m; r += kAttRows) {
    switch (std::min<int64_t>(kAttRows, m - r)) {
      case 4: ScoreTile<4, NK>(x + r, yt, ldy, h, a + r * lda, lda); break;
      case 3: ScoreTile<3, NK>(x + r, yt, ldy, h, a + r * lda, lda); break;
      case 2: ScoreTile<2, NK>(x + r, yt, ldy, h, a + r * lda, lda); break;
      default: ScoreTile<1, NK>(x + r, yt, ldy, h, a + r * lda, lda); break;
    }
  }
}

// z[r][c0 + c] (+)= sum_{j < n} a[r * lda + j] * y[j][c0 + c] for r < MR, c < NC.
template <int MR, int NC>
void AddTile(const float* a, int64_t lda, int64_t n, const float* const* y, int64_t c0, float* const* z,
             bool accumulate) {
  float acc[MR][NC];
  for (int r = 0; r < MR; ++r)
#pragma omp simd
    for (int c = 0; c < NC; ++c) acc[r][c] = accumulate ? z[r][c0 + c] : 0.f;
  for (int64_t j = 0; j < n; ++j) {
    const float* yj = y[j] + c0;
    for (int r = 0; r < MR; ++r) {
      const float av = a[r * lda + j];
#pragma omp simd
      for (int c = 0; c < NC; ++c) acc[r][c] += av * yj[c];
    }
  }
  for (int r = 0; r < MR; ++r)
#pragma omp simd
    for (int c = 0; c < NC; ++c) z[r][c0 + c] = acc[r][c];
}

template <int MR>
void AddRows(const float* a, int64_t lda, int64_t n, const float* const* y, int64_t h, float* const* z,
             bool accumulate) {
  int64_t c = 0;
  for (; c + 64 <= h; c += 64) AddTile<MR, 64>(a, lda, n, y, c, z, accumulate);
  for (; c + 16 <= h; c += 16) AddTile<MR, 16>(a, lda, n, y, c, z, accumulate);
  for (; c < h; ++c) AddTile<MR, 1>(a, lda, n, y, c, z, accumulate);
}

// z[r] (+)= sum_{j < n} a[r * lda + j] * y[j] for r < m (rows of h floats): z = a @ y.
void AddProduct(const float* a, int64_t lda, int64_t m, int64_t n, const float* const* y, int64_t h,
                float* const* z, bool accumulate) {
  for (int64_t r = 0; r < m; r += kAttRows) {
    switch (std::min<int64_t>(kAttRows, m - r)) {
      case 4: AddRows<4>(a + r * lda, lda, n, y, h, z + r, accumulate); break;
      case 3: AddRows<3>(a + r * lda, lda, n, y, h, z + r, accumulate); break;
      case 2: AddRows<2>(a + r * lda, lda, n, y, h, z + r, accumulate); break;
      default: AddRows<1>(a + r * lda, lda, n, y, h, z + r, accumulate); break;
    }
  }
}

// Keys [j0, j0 + n) of a unit's keys (rows of h floats) as a [h, kAttKeys] panel, zero past n.
void KeyPanel(const float* const* keys, int64_t j0, int64_t n, int64_t h, float* panel) {
  std::fill(panel, panel + h * kAttKeys, 0.f);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t e = 0; e < h; ++e) panel[e * kAttKeys + j] = keys[j0 + j][e];
}

// row[j] = keep[j] ? row[j] * scale : kNegInf for j < n; returns their largest (-inf for n = 0).
// (AVX-512: 16 keys a step with a byte mask; the plain loop did not vectorise, the bool select.)
inline float MaskScale(float* row, const bool* keep, int64_t n, float scale) {
  float top = -INFINITY;
  int64_t j = 0;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  __m512 best = _mm512_set1_ps(-INFINITY);
  const __m512 masked = _mm512_set1_ps(kNegInf), times = _mm512_set1_ps(scale);
  for (; j + 16 <= n; j += 16) {
    const __mmask16 live = _mm_test_epi8_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(keep + j)),
                                              _mm_set1_epi8(-1));
    const __m512 v = _mm512_mask_mul_ps(masked, live, _mm512_loadu_ps(row + j), times);
    _mm512_storeu_ps(row + j, v);
    best = _mm512_max_ps(best, v);
  }
  top = _mm512_reduce_max_ps(best);
#endif
  for (; j < n; ++j) {
    row[j] = keep[j] ? row[j] * scale : kNegInf;
    top = std::max(top, row[j]);
  }
  return top;
}

// One unit's shapes and the keys each query row may read.
struct AttentionUnit {
  int64_t t, g, s, h, heads;  // queries T, group G, keys S, head dim H, kv heads K
  float scale;
  const bool* mask;  // the row's [T, S]
  std::vector<int64_t> lo, hi;  // per query t: its keys lie in [lo, hi); a t with none: [0, S)
  std::vector<char> empty;      // per query t: no key at all (attends every key uniformly)

  void Ranges() {
    lo.assign(t, 0), hi.assign(t, s), empty.assign(t, 0);
    for (int64_t i = 0; i < t; ++i) {
      const bool* m = mask + i * s;
      int64_t a = 0, b = s;
      while (a < s && !m[a]) ++a;
      while (b > a && !m[b - 1]) --b;
      if (a == s) empty[i] = 1; else lo[i] = a, hi[i] = b;
    }
  }
  // The keys any of rows [r0, r1) reads (rows r = t * G + g).
  std::pair<int64_t, int64_t> Range(int64_t r0, int64_t r1) const {
    int64_t a = s, b = 0;
    for (int64_t i = r0 / g; i <= (r1 - 1) / g; ++i) a = std::min(a, lo[i]), b = std::max(b, hi[i]);
    return {a, b};
  }
};

// Rows of a [B, T, K, G, H] array for (row b, kv head k): row r = t * G + g.
template <typename T>
void QueryRows(T* base, int64_t b, int64_t k, const AttentionUnit& u, T** rows) {
  for (int64_t i = 0; i < u.t; ++i)
    for (int64_t j = 0; j < u.g; ++j) rows[i * u.g + j] = base + (((b * u.t + i) * u.heads + k) * u.g + j) * u.h;
}

// The forward of one (row, kv head) on its rows as pointers: qr and outr [T * G] (row r = t * G + g),
// keys and values [S]; lse, where not null, gets query row r's log-sum-exp at lse[t * lse_t + g].
// (The whole-sequence kernel's unit below, and the attention block's prefill.)
void AttentionForwardRows(const float* const* qr, const float* const* keys, const float* const* values,
                          float* const* outr, float* lse, int64_t lse_t, const AttentionUnit& u) {
  const int64_t rows = u.t * u.g, h = u.h, s = u.s;
  const int64_t blocks = (s + kAttKeys - 1) / kAttKeys, width = blocks * kAttKeys;
  std::vector<float> panel(h * width), sc(kAttRows * width);
  for (int64_t c = 0; c < blocks; ++c) {  // K^T [H, width], block by block (each [H, 64])
    std::vector<float> blk(h * kAttKeys);
    KeyPanel(keys, c * kAttKeys, std::min<int64_t>(kAttKeys, s - c * kAttKeys), h, blk.data());
    for (int64_t e = 0; e < h; ++e)
      std::copy(blk.data() + e * kAttKeys, blk.data() + (e + 1) * kAttKeys, panel.data() + e * width + c * kAttKeys);
  }
  for (int64_t r0 = 0; r0 < rows; r0 += kAttRows) {
    const int64_t m = std::min<int64_t>(kAttRows, rows - r0);
    auto [a, z] = u.Range(r0, r0 + m);
    // Keys [j0, j1): the tile's keys in steps of kAttStep (a causal prefill's early rows skip
    // most of a 64-key block: 0.6x the products at 64 tokens), 64 at a time while they last.
    const int64_t j0 = a / kAttStep * kAttStep, j1 = (z + kAttStep - 1) / kAttStep * kAttStep;
    for (int64_t j = j0; j < j1;) {
      if (j1 - j >= kAttKeys) {
        Scores(qr + r0, m, panel.data() + j, width, h, sc.data() + j, width);
        j += kAttKeys;
      } else {
        Scores<kAttStep>(qr + r0, m, panel.data() + j, width, h, sc.data() + j, width);
        j += kAttStep;
      }
    }
    const int64_t live = std::min(j1, s);  // keys [live, j1) are past S: never read
    for (int64_t r = 0; r < m; ++r) {
      float* row = sc.data() + r * width;
      const bool* keep = u.mask + ((r0 + r) / u.g) * s;
      const float top = MaskScale(row + j0, keep + j0, live - j0, u.scale);
      float total = 0.f;
#pragma omp simd reduction(+ : total)
      for (int64_t j = j0; j < live; ++j) total += (row[j] = FastExp(row[j] - top));
      const float inv = 1.f / total;
#pragma omp simd
      for (int64_t j = j0; j < live; ++j) row[j] *= inv;
      std::fill(row + live, row + j1, 0.f);
      if (lse != nullptr) lse[(r0 + r) / u.g * lse_t + (r0 + r) % u.g] = top + std::log(total);
    }
    const int64_t n = std::min(j1, s) - j0;
    AddProduct(sc.data() + j0, width, m, n, values + j0, h, outr + r0, false);
  }
}

void AttentionForwardUnit(const float* q, const float* k, const float* v, float* out, float* lse, int64_t b,
                          int64_t kh, AttentionUnit& u) {
  const int64_t rows = u.t * u.g, h = u.h, s = u.s;
  std::vector<const float*> qr(rows), keys(s), values(s);
  QueryRows(q, b, kh, u, qr.data());
  std::vector<float*> outr(rows);
  QueryRows(out, b, kh, u, outr.data());
  const float* kb = k + (b * u.heads + kh) * s * h;
  const float* vb = v + (b * u.heads + kh) * s * h;
  for (int64_t j = 0; j < s; ++j) keys[j] = kb + j * h, values[j] = vb + j * h;
  AttentionForwardRows(qr.data(), keys.data(), values.data(), outr.data(),
                       lse + (b * u.t * u.heads + kh) * u.g, u.heads * u.g, u);
}

void AttentionBackwardUnit(const float* q, const float* k, const float* v, const float* out, const float* lse,
                           const float* dout, float* dq, float* dk, float* dv, int64_t b, int64_t kh,
                           AttentionUnit& u) {
  const int64_t rows = u.t * u.g, h = u.h, s = u.s;
  std::vector<const float*> qr(rows), outr(rows), doutr(rows), keys(s), values(s);
  std::vector<float*> dqr(rows), dkr(kAttKeys), dvr(kAttKeys);
  QueryRows(q, b, kh, u, qr.data());
  QueryRows(out, b, kh, u, outr.data());
  QueryRows(dout, b, kh, u, doutr.data());
  QueryRows(dq, b, kh, u, dqr.data());
  const int64_t unit = (b * u.heads + kh) * s * h;
  for (int64_t j = 0; j < s; ++j) keys[j] = k + unit + j * h, values[j] = v + unit + j * h;
  std::vector<float> delta(rows), rlse(rows);  // D = rowsum(dO * O), and each row's log-sum-exp
  for (int64_t r = 0; r < rows; ++r) {
    float d = 0.f;
#pragma omp simd reduction(+ : d)
    for (int64_t e = 0; e < h; ++e) d += doutr[r][e] * outr[r][e];
    delta[r] = d;
    rlse[r] = lse[((b * u.t + r / u.g) * u.heads + kh) * u.g + r % u.g];
    std::fill(dqr[r], dqr[r] + h, 0.f);
  }
  std::vector<float> kpanel(h * kAttKeys), vpanel(h * kAttKeys), sc(kAttBwdRows * kAttKeys),
      dp(kAttBwdRows * kAttKeys), pt(kAttKeys * kAttBwdRows), dst(kAttKeys * kAttBwdRows);
  for (int64_t j0 = 0; j0 < s; j0 += kAttKeys) {
    const int64_t n = std::min<int64_t>(kAttKeys, s - j0);
    KeyPanel(keys.data(), j0, n, h, kpanel.data());
    KeyPanel(values.data(), j0, n, h, vpanel.data());
    for (int64_t j = 0; j < n; ++j) {
      dkr[j] = dk + unit + (j0 + j) * h, dvr[j] = dv + unit + (j0 + j) * h;
      std::fill(dkr[j], dkr[j] + h, 0.f), std::fill(dvr[j], dvr[j] + h, 0.f);
    }
    for (int64_t r0 = 0; r0 < rows; r0 += kAttBwdRows) {
      const int64_t m = std::min<int64_t>(kAttBwdRows, rows - r0);
      auto [a, z] = u.Range(r0, r0 + m);
      if (z <= j0 || a >= j0 + n) continue;  // no row of the tile reads a key of the block
      Scores(qr.data() + r0, m, kpanel.data(), kAttKeys, h, sc.data(), kAttKeys);
      Scores(doutr.data() + r0, m, vpanel.data(), kAttKeys, h, dp.data(), kAttKeys);
      for (int64_t r = 0; r < m; ++r) {
        const int64_t i = r0 + r;
        const bool* keep = u.mask + (i / u.g) * s + j0;
        const float scale = u.scale, top = rlse[i], d = delta[i];
        // A row with no key reads each of the S keys with 1 / S (its lse, kNegInf + log S, rounds to
        // kNegInf in float32, so it is not recomputed from it); masked scores pass no gradient.
        const float uniform = u.empty[i / u.g] ? 1.f / s : -1.f;
        float* srow = sc.data() + r * kAttKeys;
        const float* dprow = dp.data() + r * kAttKeys;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          const float p = uniform >= 0.f ? uniform : (keep[j] ? FastExp(srow[j] * scale - top) : 0.f);
          const float ds = keep[j] ? p * (dprow[j] - d) * scale : 0.f;
          srow[j] = ds;
          pt[j * kAttBwdRows + r] = p;
          dst[j * kAttBwdRows + r] = ds;
        }
      }
      AddProduct(sc.data(), kAttKeys, m, n, keys.data() + j0, h, dqr.data() + r0, true);  // dQ += dS K
      AddProduct(dst.data(), kAttBwdRows, n, m, qr.data() + r0, h, dkr.data(), true);     // dK += dS^T Q
      AddProduct(pt.data(), kAttBwdRows, n, m, doutr.data() + r0, h, dvr.data(), true);   // dV += P^T dO
    }
  }
}

// Checks the shapes shared by the forward and the backward: q [B, T, K, G, H], k and v [B, K, S, H],
// mask [B, T, S]; fills u (but its ranges).
bool AttentionShapes(ffi::Span<const int64_t> qd, ffi::Span<const int64_t> kd, ffi::Span<const int64_t> vd,
                     ffi::Span<const int64_t> md, AttentionUnit& u) {
  if (qd.size() != 5 || kd.size() != 4 || vd.size() != 4 || md.size() != 3) return false;
  if (kd[0] != qd[0] || kd[1] != qd[2] || kd[3] != qd[4] || vd[0] != kd[0] || vd[1] != kd[1] ||
      vd[2] != kd[2] || vd[3] != kd[3] || md[0] != qd[0] || md[1] != qd[1] || md[2] != kd[2])
    return false;
  u.t = qd[1], u.heads = qd[2], u.g = qd[3], u.h = qd[4], u.s = kd[2];
  return true;
}

// q [B, T, K, G, H], k and v [B, K, S, H], mask [B, T, S] -> out [B, T, K, G, H] and the log-sum-exp
// of each query's scores lse [B, T, K, G] (what the backward recomputes the probabilities from).
ffi::Error AttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                         ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask, ffi::ResultBuffer<ffi::F32> out,
                         ffi::ResultBuffer<ffi::F32> lse, float scale, int64_t threads) {
  AttentionUnit shape{};
  if (!AttentionShapes(q.dimensions(), k.dimensions(), v.dimensions(), mask.dimensions(), shape))
    return ffi::Error::InvalidArgument(
        "lm_cpu_attention: q must be [B, T, K, G, H], k and v [B, K, S, H], mask [B, T, S]");
  const int64_t batch = q.dimensions()[0];
  if (batch * shape.t * shape.heads * shape.g * shape.h == 0) return ffi::Error::Success();
  if (shape.s == 0) return ffi::Error::InvalidArgument("lm_cpu_attention: no keys (S = 0)");
  shape.scale = scale;
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  const bool* mp = mask.typed_data();
  float *op = out->typed_data(), *lp = lse->typed_data();
  EachUnit(pool, threads, batch * shape.heads, [=](int64_t i) {
    const int64_t b = i / shape.heads, kh = i % shape.heads;
    AttentionUnit u = shape;
    u.mask = mp + b * u.t * u.s;
    u.Ranges();
    AttentionForwardUnit(qp, kp, vp, op, lp, b, kh, u);
  });
  return ffi::Error::Success();
}

// The gradient of AttentionImpl's out: from q, k, v, mask, out, lse and the cotangent dout
// [B, T, K, G, H] -> dq [B, T, K, G, H], dk and dv [B, K, S, H]. Masked scores get no gradient (the
// model's where()); the probabilities are recomputed a key block at a time.
ffi::Error AttentionBackwardImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                                 ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask, ffi::Buffer<ffi::F32> out,
                                 ffi::Buffer<ffi::F32> lse, ffi::Buffer<ffi::F32> dout,
                                 ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                                 ffi::ResultBuffer<ffi::F32> dv, float scale, int64_t threads) {
  AttentionUnit shape{};
  if (!AttentionShapes(q.dimensions(), k.dimensions(), v.dimensions(), mask.dimensions(), shape))
    return ffi::Error::InvalidArgument(
        "lm_cpu_attention_bwd: q must be [B, T, K, G, H], k and v [B, K, S, H], mask [B, T, S]");
  const int64_t batch = q.dimensions()[0];
  float *dqp = dq->typed_data(), *dkp = dk->typed_data(), *dvp = dv->typed_data();
  if (shape.s == 0 || batch * shape.heads * shape.h == 0) return ffi::Error::Success();
  if (shape.t * shape.g == 0) {  // no queries: no gradient for the keys
    std::fill(dkp, dkp + batch * shape.heads * shape.s * shape.h, 0.f);
    std::fill(dvp, dvp + batch * shape.heads * shape.s * shape.h, 0.f);
    return ffi::Error::Success();
  }
  shape.scale = scale;
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data(), *op = out.typed_data(),
              *lp = lse.typed_data(), *dop = dout.typed_data();
  const bool* mp = mask.typed_data();
  EachUnit(pool, threads, batch * shape.heads, [=](int64_t i) {
    const int64_t b = i / shape.heads, kh = i % shape.heads;
    AttentionUnit u = shape;
    u.mask = mp + b * u.t * u.s;
    u.Ranges();
    AttentionBackwardUnit(qp, kp, vp, op, lp, dop, dqp, dkp, dvp, b, kh, u);
  });
  return ffi::Error::Success();
}

#pragma GCC pop_options

// ---- A layer's attention block: from the QKV product to the attention's output -------------------
//
// decoder_layer's work between a fused QKV product and its output projection, for a decode step
// (one new token a row) or a prefill (a row's T prompt tokens): queries and keys through their
// RMSNorm (Qwen3) and rope, keys and values written into the cache, and the attention, in one call.
// Why: XLA:CPU ran that work as ~20 small fusions and copies a layer (converts, slices, the norms'
// reductions, rope's rotate-half as a concatenation, the keys' transposes into the cache layout,
// computed twice: once for the cache, once for the attention) around the cache writes and the
// attention: 3.5 ms of a 38.5 ms bf16 decode step at Qwen3-0.6B's shape (B 4), each a few to ~30 us,
// mostly moving a few KB between the two cores' caches; ~125 ms of a 1.24 s float32 prefill of 4 x 64
// tokens there (docs/results/2026-12-05-prefill-block.md). Here each (row, kv head) is one unit on
// one core, from the product's output to its heads' attention.
// Rounding follows the model's ops in its compute dtype (`bf16`: every op's result rounded to
// bfloat16, as XLA's bf16 ops; float32: none): the product's output rounded, the bias added and
// rounded; the norm's statistics in float32, the normed value rounded, times the weight, rounded;
// rope's two products each rounded, their sum rounded; the attention output rounded. The norm's sum
// runs in its own order and 1 / sqrt is XLA's rsqrt to float32 round-off, so a value can differ
// from XLA's ops by one bf16 rounding step (tests/lm/cpu_gemm_test.py bounds it).

// x rounded to bfloat16 (round to nearest even; NaN stays NaN), as a float32.
// (Branch-free, so the loops that round vectorise: a prefill rounds every element of its T tokens'
// heads several times.)
inline float RoundBF16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t nearest = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const uint32_t quiet = (u | 0x00400000u) & 0xffff0000u;
  u = (u & 0x7fffffffu) > 0x7f800000u ? quiet : nearest;
  std::memcpy(&x, &u, 4);
  return x;
}

// x rounded to the compute dtype: bfloat16 (B) or float32 (none).
template <bool B>
inline float RoundTo(float x) {
  return B ? RoundBF16(x) : x;
}

inline void StoreAs(float x, float* p) { *p = x; }
inline void StoreAs(float x, uint16_t* p) {
  const float r = RoundBF16(x);
  uint32_t u;
  std::memcpy(&u, &r, 4);
  *p = static_cast<uint16_t>(u >> 16);
}

// A small float32 or bfloat16 array (weights, biases, rope's table) widened to float32.
std::vector<float> Widened(const ffi::AnyBuffer& a) {
  const size_t n = a.element_count();
  std::vector<float> out(n);
  if (a.element_type() == ffi::DataType::BF16) {
    const auto* bits = static_cast<const uint16_t*>(a.untyped_data());
    for (size_t i = 0; i < n; ++i) out[i] = widen(bits[i]);
  } else {
    std::memcpy(out.data(), a.untyped_data(), n * sizeof(float));
  }
  return out;
}

// silu(x @ W[:, :F]) * (x @ W[:, F:]) for bfloat16 rows x [M, K] and a packed bfloat16 gate/up weight
// [2F / 64, K, 64] (F a multiple of 64) -> y [M, F] float32 or bfloat16 (rounded once, as the model
// rounds the gating's float32 result for the down product).
// Why: the gate/up product's float32 output ([M, 2F]: 6 MB at shape (b)) was written, then read
// back by XLA's fusion of SiLU and the gating (0.33 ms a layer); here each 64 columns of the gate and
// of the up product are computed by the same unit into a 6 x 64 scratch each and gated there.
// SiLU as g / (1 + e^-g) with FastExp on -|g| (within a few float32 ulp of XLA's logistic).
ffi::Error PackedSwiGLUBF16Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> w,
                                ffi::Result<ffi::AnyBuffer> y, int64_t threads) {
#if defined(LM_GEMM_BF16_DOT)
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2 || xd[1] != wd[1] || wd[2] != kBlock ||
      yd[0] != xd[0] || yd[1] % kBlock != 0 || wd[0] != 2 * yd[1] / kBlock ||
      (y->element_type() != ffi::DataType::F32 && y->element_type() != ffi::DataType::BF16))
    return ffi::Error::InvalidArgument(
        "lm_cpu_swiglu_bf16: x must be [M, K] bfloat16, w [2F / 64, K, 64] bfloat16 (gate columns, then up), "
        "y [M, F] float32 or bfloat16 with F a multiple of 64");
  const int64_t m = xd[0], k = xd[1], f = yd[1], half = f / kBlock;
  if (m == 0 || f == 0) return ffi::Error::Success();
  if (k == 0) {
    std::memset(y->untyped_data(), 0, y->size_bytes());  // silu(0) * 0
    return ffi::Error::Success();
  }
  const auto* xp = reinterpret_cast<const uint16_t*>(x.typed_data());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.typed_data());
  auto run = [&](auto* yp) {
    EachUnit(pool, threads, half, [=](int64_t c) {
      alignas(64) float gate[kDotRows * kBlock], up[kDotRows * kBlock];
      for (int64_t r = 0; r < m; r += kDotRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kDotRows, m - r));
        DotTile(xp + r * k, k, wp + c * k * kBlock, k, gate, kBlock, rows, kBlock);
        DotTile(xp + r * k, k, wp + (c + half) * k * kBlock, k, up, kBlock, rows, kBlock);
        for (int i = 0; i < rows; ++i) {
          auto* out = yp + (r + i) * f + c * kBlock;
#pragma omp simd
          for (int j = 0; j < kBlock; ++j) {
            const float g = gate[i * kBlock + j], e = FastExp(-std::abs(g)), s = 1.f / (1.f + e);
            StoreAs(g * (g >= 0.f ? s : e * s) * up[i * kBlock + j], out + j);
          }
        }
      }
    });
  };
  return WithOutput(y, run);
#else
  return NoBF16Dot("lm_cpu_swiglu_bf16");
#endif
}

struct AttentionBlock {
  int64_t b, t, heads, g, h, s, m, start;  // rows, tokens, kv heads, queries per kv head, head dim,
                                           // cache slots, keys attended (mask's last axis), first slot
  float scale, eps;
  bool norm, bias;
  const void* qkv;  // [B, T, (N + 2K) * H], float32 or (qkv_bf16) bfloat16
  bool qkv_bf16;
  std::vector<float> bias_v, q_norm, k_norm, cos, sin;  // [N + 2K, H], [H], [H], [B, T, H], [B, T, H]
  const bool* mask;  // [B, T, M]
  void* out;         // [B, T, N * H], float32 or (out_bf16) bfloat16
  bool out_bf16;

  // Head `head` (0 .. N + 2K) of row r's token i as the model's compute dtype (bfloat16: B) has it:
  // the product's output rounded, plus the bias, rounded.
  template <bool B>
  void Head(int64_t r, int64_t i, int64_t head, float* x) const {
    const int64_t at = ((r * t + i) * heads * (g + 2) + head) * h;
    if (qkv_bf16)
      HeadFrom<B>(static_cast<const uint16_t*>(qkv) + at, head, x);
    else
      HeadFrom<B>(static_cast<const float*>(qkv) + at, head, x);
  }
  template <bool B, typename S>
  void HeadFrom(const S* src, int64_t head, float* x) const {
    if (bias) {
      const float* add = bias_v.data() + head * h;
#pragma omp simd
      for (int64_t e = 0; e < h; ++e) x[e] = RoundTo<B>(RoundTo<B>(widen(src[e])) + add[e]);
    } else {
#pragma omp simd
      for (int64_t e = 0; e < h; ++e) x[e] = RoundTo<B>(widen(src[e]));
    }
  }

  // x [H] through the norm (weight w; none when !norm) and rope at row r's token i, in place.
  template <bool B>
  void NormRope(int64_t r, int64_t i, const float* w, float* x, float* tmp) const {
    if (norm) {
      float total = 0.f;
#pragma omp simd reduction(+ : total)
      for (int64_t e = 0; e < h; ++e) total += x[e] * x[e];
      const float inv = 1.f / std::sqrt(total / static_cast<float>(h) + eps);
#pragma omp simd
      for (int64_t e = 0; e < h; ++e) x[e] = RoundTo<B>(w[e] * RoundTo<B>(x[e] * inv));
    }
    const int64_t half = h / 2;
    const float* c = cos.data() + (r * t + i) * h;
    const float* sn = sin.data() + (r * t + i) * h;
#pragma omp simd
    for (int64_t e = 0; e < half; ++e) tmp[e] = RoundTo<B>(RoundTo<B>(x[e] * c[e]) + RoundTo<B>(-x[e + half] * sn[e]));
#pragma omp simd
    for (int64_t e = half; e < h; ++e) tmp[e] = RoundTo<B>(RoundTo<B>(x[e] * c[e]) + RoundTo<B>(x[e - half] * sn[e]));
    std::copy(tmp, tmp + h, x);
  }
};

// One (row, kv head): its T keys and values into the cache from the slot `start`, its G x T
// queries normed and rotated, their attention, the output rounded into `out`. One token (a decode
// step) attends the cache's first M slots as the cache holds them (the decode head); several (a
// prefill, start 0) attend their own T keys as the compute dtype has them (the whole-sequence
// attention's forward), as `lm.model.decoder_layer` does there.
template <typename T, bool B>
void AttentionBlockUnit(const AttentionBlock& p, int64_t i, T* kc, T* vc) {
  const int64_t r = i / p.heads, kh = i % p.heads, h = p.h, g = p.g, n = p.heads * g, t = p.t;
  std::vector<float> q(t * g * h), keys(t * h), values(t * h), tmp(h);
  for (int64_t j = 0; j < t; ++j) {
    float* key = keys.data() + j * h;
    float* value = values.data() + j * h;
    T* krow = kc + (i * p.s + p.start + j) * h;
    T* vrow = vc + (i * p.s + p.start + j) * h;
    p.Head<B>(r, j, n + kh, key);
    p.NormRope<B>(r, j, p.k_norm.data(), key, tmp.data());
    p.Head<B>(r, j, n + p.heads + kh, value);
#pragma omp simd
    for (int64_t e = 0; e < h; ++e) StoreAs(key[e], krow + e);
#pragma omp simd
    for (int64_t e = 0; e < h; ++e) StoreAs(value[e], vrow + e);
    for (int64_t a = 0; a < g; ++a) {
      float* qa = q.data() + (j * g + a) * h;
      p.Head<B>(r, j, kh * g + a, qa);
      p.NormRope<B>(r, j, p.q_norm.data(), qa, tmp.data());
    }
  }
  // The output straight into a float32 `out` (token j's G heads: g * h contiguous values), then
  // rounded there; for a bfloat16 `out` into a scratch, then rounded into it.
  std::vector<float> scratch(p.out_bf16 ? t * g * h : 0);
  auto at = [&](int64_t j) { return ((r * t + j) * n + kh * g) * h; };
  auto dst = [&](int64_t j) {
    return p.out_bf16 ? scratch.data() + j * g * h : static_cast<float*>(p.out) + at(j);
  };
  if (t == 1) {
    std::vector<float> scores(g * p.m);
    DecodeHeadFor<T>(h)(q.data(), kc + i * p.s * h, vc + i * p.s * h, p.mask + r * p.m, dst(0), g, p.m, h,
                        p.scale, scores.data());
  } else {
    AttentionUnit u{t, g, t, h, p.heads, p.scale, p.mask + r * t * t, {}, {}, {}};
    u.Ranges();
    std::vector<const float*> qr(t * g), kr(t), vr(t);
    std::vector<float*> outr(t * g);
    for (int64_t a = 0; a < t * g; ++a) qr[a] = q.data() + a * h, outr[a] = dst(a / g) + a % g * h;
    for (int64_t j = 0; j < t; ++j) kr[j] = keys.data() + j * h, vr[j] = values.data() + j * h;
    AttentionForwardRows(qr.data(), kr.data(), vr.data(), outr.data(), nullptr, 0, u);
  }
  if (p.out_bf16) {
    for (int64_t j = 0; j < t; ++j) {
      const float* o = dst(j);
      uint16_t* to = static_cast<uint16_t*>(p.out) + at(j);
#pragma omp simd
      for (int64_t e = 0; e < g * h; ++e) StoreAs(o[e], to + e);
    }
  } else if (B) {
    for (int64_t j = 0; j < t; ++j) {
      float* o = dst(j);
#pragma omp simd
      for (int64_t e = 0; e < g * h; ++e) o[e] = RoundBF16(o[e]);
    }
  }
}

// qkv [B, T, (N + 2K) * H] float32 or bfloat16 (the fused product's output; a bf16 prefill's product
// writes bf16, rounded as this kernel would round it, and half the bytes read here), bias [N + 2K, H], q_norm and
// k_norm [H] (either may be empty without `bias` / `norm`), cos and sin [B, T, H] (the model's
// compute dtype: float32 or bfloat16; sin unsigned, rotate-half's sign applied here), the caches k
// and v [B, K, S, H] (float32 or bfloat16, both alike), index (the first slot written, clamped as
// XLA's dynamic-update-slice), mask [B, T, M] -> out [B, T, N * H] float32 or bfloat16 (values of
// the compute dtype; a bf16 prefill's output projection reads bf16 rows), and the caches with the new keys and values (aliasing k and v's buffers). T = 1: a decode
// step, attending the first M <= S slots; T > 1: a prefill (index 0, M = T), attending its own keys.
ffi::Error AttentionBlockImpl(ffi::ThreadPool pool, ffi::AnyBuffer qkv, ffi::AnyBuffer bias,
                              ffi::AnyBuffer q_norm, ffi::AnyBuffer k_norm, ffi::AnyBuffer cos, ffi::AnyBuffer sin,
                              ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Buffer<ffi::S32> index,
                              ffi::Buffer<ffi::PRED> mask, ffi::Result<ffi::AnyBuffer> out,
                              ffi::Result<ffi::AnyBuffer> k_out, ffi::Result<ffi::AnyBuffer> v_out, float scale,
                              float eps, bool bf16, bool norm, bool has_bias, int64_t threads) {
  const auto xd = qkv.dimensions(), kd = k.dimensions(), md = mask.dimensions(), od = out->dimensions();
  const auto cache_type = k.element_type();
  const bool cache_ok = (cache_type == ffi::DataType::F32 || cache_type == ffi::DataType::BF16) &&
                        v.element_type() == cache_type && k_out->element_type() == cache_type &&
                        v_out->element_type() == cache_type;
  const auto floats = [](ffi::DataType d) { return d == ffi::DataType::F32 || d == ffi::DataType::BF16; };
  if (xd.size() != 3 || kd.size() != 4 || md.size() != 3 || od.size() != 3 || !cache_ok ||
      v.dimensions().size() != 4 || index.element_count() != 1 || !floats(qkv.element_type()) ||
      !floats(out->element_type()))
    return ffi::Error::InvalidArgument(
        "lm_cpu_attention_block: qkv must be [B, T, (N + 2K) * H] float32 or bfloat16, k and v [B, K, S, H] "
        "caches of one dtype (float32 or bfloat16), mask [B, T, M], index a scalar, out [B, T, N * H] float32 "
        "or bfloat16");
  const int64_t b = kd[0], heads = kd[1], s = kd[2], h = kd[3], t = xd[1], m = md[2];
  const int64_t n = od[2] / std::max<int64_t>(h, 1);
  for (int a = 0; a < 4; ++a)
    if (v.dimensions()[a] != kd[a])
      return ffi::Error::InvalidArgument("lm_cpu_attention_block: k and v differ in shape");
  const size_t table = static_cast<size_t>(b * t * h);
  if (h == 0 || h % 2 || heads == 0 || n % heads || od[0] != b || od[1] != t || od[2] != n * h || xd[0] != b ||
      xd[2] != (n + 2 * heads) * h || md[0] != b || md[1] != t || t == 0 || t > s || m == 0 || m > s ||
      (has_bias && bias.element_count() != static_cast<size_t>((n + 2 * heads) * h)) ||
      (norm && (q_norm.element_count() != static_cast<size_t>(h) || k_norm.element_count() != static_cast<size_t>(h))) ||
      cos.element_count() != table || sin.element_count() != table)
    return ffi::Error::InvalidArgument(
        "lm_cpu_attention_block: shapes disagree (qkv [B, T, (N + 2K) * H], bias [N + 2K, H], norms [H], cos "
        "and sin [B, T, H], caches [B, K, S, H] with 0 < T <= S and H even, mask [B, T, M] with 0 < M <= S, "
        "out [B, T, N * H])");
  const int64_t start = std::clamp<int64_t>(index.typed_data()[0], 0, s - t);
  if (t > 1 && (start != 0 || m != t))
    return ffi::Error::InvalidArgument(
        "lm_cpu_attention_block: several tokens a row only as a prefill (index 0, mask [B, T, T])");
  // (shared with the units: a pool task that starts after the last unit finds it alive)
  auto p = std::make_shared<const AttentionBlock>(AttentionBlock{
      b, t, heads, n / heads, h, s, m, start, scale, eps, norm, has_bias, qkv.untyped_data(),
      qkv.element_type() == ffi::DataType::BF16, Widened(bias), Widened(q_norm), Widened(k_norm), Widened(cos),
      Widened(sin), mask.typed_data(), out->untyped_data(), out->element_type() == ffi::DataType::BF16});
  char* kc = static_cast<char*>(k_out->untyped_data());
  char* vc = static_cast<char*>(v_out->untyped_data());
  if (kc != k.untyped_data()) std::memcpy(kc, k.untyped_data(), k.size_bytes());
  if (vc != v.untyped_data()) std::memcpy(vc, v.untyped_data(), v.size_bytes());
  auto run = [&](auto* kt, auto* vt) {
    using T = std::remove_pointer_t<decltype(kt)>;
    if (bf16)
      EachUnit(pool, threads, b * heads, [p, kt, vt](int64_t i) { AttentionBlockUnit<T, true>(*p, i, kt, vt); });
    else
      EachUnit(pool, threads, b * heads, [p, kt, vt](int64_t i) { AttentionBlockUnit<T, false>(*p, i, kt, vt); });
  };
  if (cache_type == ffi::DataType::BF16)
    run(reinterpret_cast<uint16_t*>(kc), reinterpret_cast<uint16_t*>(vc));
  else
    run(reinterpret_cast<float*>(kc), reinterpret_cast<float*>(vc));
  return ffi::Error::Success();
}

}  // namespace

// The packed layout's block width this build multiplies by (`lm/cpu_gemm.py` packs to it).
extern "C" int64_t LmCpuGemmBlock() { return kBlock; }

// Whether this build has the prefill's bfloat16 products by VDPBF16PS (`LmCpuGemmPackedBF16Dot`).
extern "C" int64_t LmCpuGemmBF16Dot() {
#if defined(LM_GEMM_BF16_DOT)
  return 1;
#else
  return 0;
#endif
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(LmCpuGemmPackedF32, PackedGemmImpl<ffi::F32>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LmCpuGemmPackedBF16, PackedGemmImpl<ffi::BF16>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("threads"));

// The VDPBF16PS kernels' binding: the pool, bfloat16 rows and packed bfloat16 blocks, an output of
// float32 or bfloat16, the threads.
static auto BF16DotBinding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::BF16>>()
      .Arg<ffi::Buffer<ffi::BF16>>()
      .Ret<ffi::AnyBuffer>()
      .Attr<int64_t>("threads");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(LmCpuGemmPackedBF16Dot, PackedDotBF16Impl, BF16DotBinding());

XLA_FFI_DEFINE_HANDLER_SYMBOL(LmCpuSwiGLUBF16, PackedSwiGLUBF16Impl, BF16DotBinding());

// The attention kernels' shared leading arguments: the pool, then q (float32), k and v (float32,
// or a decode step's bfloat16 cache: E) and the mask.
template <ffi::DataType E = ffi::F32>
static auto AttentionBinding() {
  return ffi::Ffi::Bind()
      .template Ctx<ffi::ThreadPool>()
      .template Arg<ffi::Buffer<ffi::F32>>()
      .template Arg<ffi::Buffer<E>>()
      .template Arg<ffi::Buffer<E>>()
      .template Arg<ffi::Buffer<ffi::PRED>>();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(LmCpuDecodeAttention, DecodeAttentionImpl<ffi::F32>,
                              AttentionBinding()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("threads"));

// The same over a bfloat16 cache: q float32, k and v bfloat16.
XLA_FFI_DEFINE_HANDLER_SYMBOL(LmCpuDecodeAttentionBF16, DecodeAttentionImpl<ffi::BF16>,
                              AttentionBinding<ffi::BF16>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LmCpuCacheWrite, CacheWriteImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(LmCpuAttentionBlock, AttentionBlockImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("scale")
                                  .Attr<float>("eps")
                                  .Attr<bool>("bf16")
                                  .Attr<bool>("norm")
                                  .Attr<bool>("bias")
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LmCpuAttention, AttentionImpl,
                              AttentionBinding()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LmCpuAttentionBackward, AttentionBackwardImpl,
                              AttentionBinding()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("threads"));
