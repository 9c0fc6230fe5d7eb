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
#include <functional>
#include <memory>
#include <thread>

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
constexpr int64_t kChunkRows = 128;        // k-chunk when the rows need more than one tile
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

// One decode step's attention for one (row, kv head): the G queries sharing that kv head over its
// S cached keys and values, scores and softmax in float32. Each key and value is read once for all
// G queries, so the step streams the cache once (XLA:CPU's fused multiply-reduce over
// [B, K, G, S, H] ran at ~5x the bytes' time: 12 + 6 ms of a 76 ms bf16 step at Qwen3-0.6B's
// shape, docs/results/2026-12-05-bf16-first-token.md).
void DecodeHead(const float* q, const float* k, const float* v, const bool* mask, float* out,
                int64_t g, int64_t s, int64_t h, float scale, float* scores) {
  for (int64_t j = 0; j < g; ++j) {
    float* row = scores + j * s;
    const float* qj = q + j * h;
    for (int64_t t = 0; t < s; ++t) {
      const float* kt = k + t * h;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t e = 0; e < h; ++e) dot += qj[e] * kt[e];
      row[t] = mask[t] ? dot * scale : kNegInf;
    }
    float top = row[0];
    for (int64_t t = 1; t < s; ++t) top = std::max(top, row[t]);
    float total = 0.f;
    for (int64_t t = 0; t < s; ++t) total += (row[t] = std::exp(row[t] - top));
    const float inv = 1.f / total;
    for (int64_t t = 0; t < s; ++t) row[t] *= inv;  // the probabilities, as the model's softmax
  }
  std::fill(out, out + g * h, 0.f);
  for (int64_t t = 0; t < s; ++t) {
    const float* vt = v + t * h;
    for (int64_t j = 0; j < g; ++j) {
      const float p = scores[j * s + t];
      float* oj = out + j * h;
#pragma omp simd
      for (int64_t e = 0; e < h; ++e) oj[e] += p * vt[e];
    }
  }
}

// q [B, K, G, H], k and v [B, K, S, H] (the cache), mask [B, S] -> out [B, K, G, H], all float32
// but the mask; (row, kv head) pairs split over the threads.
ffi::Error DecodeAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                               ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask,
                               ffi::ResultBuffer<ffi::F32> out, float scale, int64_t threads) {
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
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  const bool* mp = mask.typed_data();
  float* op = out->typed_data();
  auto pair = [=](int64_t i) {  // i = row * heads + head
    std::unique_ptr<float[]> scores(new float[g * s]);
    DecodeHead(qp + i * g * h, kp + i * s * h, vp + i * s * h, mp + (i / heads) * s, op + i * g * h, g, s, h,
               scale, scores.get());
  };
  const int64_t helpers = TotalThreads(pool, threads, b * heads) - 1;
  if (helpers <= 0) {
    for (int64_t i = 0; i < b * heads; ++i) pair(i);
  } else {
    ParallelChunks(pool, helpers, b * heads, pair);
  }
  return ffi::Error::Success();
}

}  // namespace

// The packed layout's block width this build multiplies by (`lm/cpu_gemm.py` packs to it).
extern "C" int64_t LmCpuGemmBlock() { return kBlock; }

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

XLA_FFI_DEFINE_HANDLER_SYMBOL(LmCpuDecodeAttention, DecodeAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("threads"));
