// Skinny GEMM (decode-shaped "GEMV") for XLA:CPU via the typed FFI.
//   y[M,N] = x[M,K] @ W[K,N], float32 row-major, M small (1..16).
// Design: split N into column blocks of width BW floats; each thread owns a
// contiguous range of blocks; per block, loop over k accumulating MT x (NV*16)
// outputs in zmm registers, software-prefetching W rows `pf` rows ahead.
// M > mt: row groups of mt rows, k chunked (kc) so the W tile is re-read from
// L1/L2, not DRAM.
//
// Handlers:
//   gemv_f32        : W row-major [K,N]
//   gemv_packed_f32 : W pre-packed [N/nb, K, nb] (each column block contiguous)
// Attributes (int64): mode  0=single thread, 1=own persistent pool,
//                           2=XLA intra-op thread pool (ffi::ThreadPool),
//                           3=std::thread spawned per call
//                     kern  0=AVX-512 intrinsics, 1=plain C++ (auto-vectorised)
//                     nv    zmm vectors per row per block (1..4) (0 = auto)
//                     skc   >0: row-major streaming order with k-chunks of skc rows
//                           (-1 = auto: 8 for M<=4, else 16; 0 = block order)
//                     cw    column super-chunk / work-chunk width (floats)
//                     mt    max rows per register tile (0 = auto)
//                     pf    software prefetch distance (0 = none). Block/packed order:
//                           k rows ahead. Streaming order: >0 floats ahead in the
//                           same row, <0: -pf rows ahead (next k-chunk), default -16
//                     nthr  threads to use (>=1)
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// ---------------------------------------------------------------------------
// micro kernels
// ---------------------------------------------------------------------------
// prefetch hint for software prefetch: 0=T0 1=T1 (default) 2=T2 3=NTA (env GEMV_PF_HINT)
static int g_pf_hint = [] {
  const char* s = getenv("GEMV_PF_HINT");
  return s ? atoi(s) : 1;  // default T1 (won in measurements)
}();

using MicroFn = void (*)(const float* x, int64_t ldx, const float* w,
                         int64_t ldw, float* y, int64_t ldy, int64_t kn,
                         bool accum, int64_t pfo);

template <int MT, int NV>
static void micro_avx512(const float* __restrict x, int64_t ldx,
                         const float* __restrict w, int64_t ldw,
                         float* __restrict y, int64_t ldy, int64_t kn,
                         bool accum, int64_t pfo) {
  __m512 acc[MT][NV];
#pragma GCC unroll 16
  for (int m = 0; m < MT; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      acc[m][v] = accum ? _mm512_loadu_ps(y + m * ldy + v * 16)
                        : _mm512_setzero_ps();
  const float* wp = w;
  for (int64_t k = 0; k < kn; ++k, wp += ldw) {
    if (pfo) {
      const char* pa = (const char*)(wp + pfo);
      switch (g_pf_hint) {  // runtime-selected hint (experiment); predictable branch
        case 1:
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) _mm_prefetch(pa + v * 64, _MM_HINT_T1);
          break;
        case 2:
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) _mm_prefetch(pa + v * 64, _MM_HINT_T2);
          break;
        case 3:
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) _mm_prefetch(pa + v * 64, _MM_HINT_NTA);
          break;
        default:
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) _mm_prefetch(pa + v * 64, _MM_HINT_T0);
      }
    }
    __m512 wv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_ps(wp + v * 16);
#pragma GCC unroll 16
    for (int m = 0; m < MT; ++m) {
      __m512 b = _mm512_set1_ps(x[m * ldx + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        acc[m][v] = _mm512_fmadd_ps(b, wv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < MT; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      _mm512_storeu_ps(y + m * ldy + v * 16, acc[m][v]);
}

// Fixed k-count variant (KU rows fully unrolled): every W row in the chunk gets
// its own load instructions, so per-IP stride prefetchers see a clean +bytes
// stride across successive calls (used by the row-major streaming order).
template <int MT, int NV, int KU>
static void micro_avx512_ku(const float* __restrict x, int64_t ldx,
                            const float* __restrict w, int64_t ldw,
                            float* __restrict y, int64_t ldy, int64_t kn,
                            bool accum, int64_t pfo) {
  __m512 acc[MT][NV];
#pragma GCC unroll 16
  for (int m = 0; m < MT; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      acc[m][v] = accum ? _mm512_loadu_ps(y + m * ldy + v * 16)
                        : _mm512_setzero_ps();
#pragma GCC unroll 32
  for (int k = 0; k < KU; ++k) {
    const float* wp = w + k * ldw;
    if (pfo) {
      const char* pa = (const char*)(wp + pfo);
      switch (g_pf_hint) {  // runtime-selected hint (experiment); predictable branch
        case 1:
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) _mm_prefetch(pa + v * 64, _MM_HINT_T1);
          break;
        case 2:
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) _mm_prefetch(pa + v * 64, _MM_HINT_T2);
          break;
        case 3:
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) _mm_prefetch(pa + v * 64, _MM_HINT_NTA);
          break;
        default:
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) _mm_prefetch(pa + v * 64, _MM_HINT_T0);
      }
    }
    __m512 wv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_ps(wp + v * 16);
#pragma GCC unroll 16
    for (int m = 0; m < MT; ++m) {
      __m512 b = _mm512_set1_ps(x[m * ldx + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        acc[m][v] = _mm512_fmadd_ps(b, wv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < MT; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      _mm512_storeu_ps(y + m * ldy + v * 16, acc[m][v]);
}

// Same thing in plain C++; relies on -O3 -march=native vectorisation.
template <int MT, int NV>
static void micro_plain(const float* __restrict x, int64_t ldx,
                        const float* __restrict w, int64_t ldw,
                        float* __restrict y, int64_t ldy, int64_t kn,
                        bool accum, int64_t pfo) {
  constexpr int NB = NV * 16;
  float acc[MT][NB];
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = accum ? y[m * ldy + j] : 0.f;
  const float* wp = w;
  for (int64_t k = 0; k < kn; ++k, wp += ldw) {
    if (pfo)
      for (int v = 0; v < NV; ++v)
        __builtin_prefetch(wp + pfo + v * 16, 0, 3);
    for (int m = 0; m < MT; ++m) {
      const float b = x[m * ldx + k];
#pragma omp simd
      for (int j = 0; j < NB; ++j) acc[m][j] += b * wp[j];
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NB; ++j) y[m * ldy + j] = acc[m][j];
}


#define ROW(F, MT) {nullptr, F<MT, 1>, F<MT, 2>, F<MT, 3>, F<MT, 4>}
static const MicroFn kAvx[17][5] = {
    {nullptr, nullptr, nullptr, nullptr, nullptr},
    ROW(micro_avx512, 1),  ROW(micro_avx512, 2),  ROW(micro_avx512, 3),
    ROW(micro_avx512, 4),  ROW(micro_avx512, 5),  ROW(micro_avx512, 6),
    ROW(micro_avx512, 7),  ROW(micro_avx512, 8),  ROW(micro_avx512, 9),
    ROW(micro_avx512, 10), ROW(micro_avx512, 11), ROW(micro_avx512, 12),
    ROW(micro_avx512, 13), ROW(micro_avx512, 14), ROW(micro_avx512, 15),
    ROW(micro_avx512, 16)};
static const MicroFn kPlain[17][5] = {
    {nullptr, nullptr, nullptr, nullptr, nullptr},
    ROW(micro_plain, 1),  ROW(micro_plain, 2),  ROW(micro_plain, 3),
    ROW(micro_plain, 4),  ROW(micro_plain, 5),  ROW(micro_plain, 6),
    ROW(micro_plain, 7),  ROW(micro_plain, 8),  ROW(micro_plain, 9),
    ROW(micro_plain, 10), ROW(micro_plain, 11), ROW(micro_plain, 12),
    ROW(micro_plain, 13), ROW(micro_plain, 14), ROW(micro_plain, 15),
    ROW(micro_plain, 16)};

#define ROWK(MT, KU) {nullptr, micro_avx512_ku<MT, 1, KU>, micro_avx512_ku<MT, 2, KU>, \
                    micro_avx512_ku<MT, 3, KU>, micro_avx512_ku<MT, 4, KU>}
#define TABK(KU) {{nullptr, nullptr, nullptr, nullptr, nullptr}, ROWK(1, KU), ROWK(2, KU), \
    ROWK(3, KU), ROWK(4, KU), ROWK(5, KU), ROWK(6, KU), ROWK(7, KU), ROWK(8, KU), \
    ROWK(9, KU), ROWK(10, KU), ROWK(11, KU), ROWK(12, KU), ROWK(13, KU), ROWK(14, KU), \
    ROWK(15, KU), ROWK(16, KU)}
static const MicroFn kAvxK4[17][5] = TABK(4);
static const MicroFn kAvxK8[17][5] = TABK(8);
static const MicroFn kAvxK16[17][5] = TABK(16);

struct Cfg {
  int nv, mt, pf, kern;
  int64_t kc;
  int64_t skc;  // >0: row-major streaming order, k-chunk of skc rows
  int64_t cw;   // super-chunk width (floats) for streaming order
};

// Streaming order for row-major W: y[:, c0:c1] over super-chunks of cw columns;
// inside, k-chunks of skc rows; inside, all register blocks of the super-chunk.
// W is then read as skc concurrent sequential streams of cw*4 bytes each.
static void do_stream(const Cfg& c, const float* x, int64_t M, int64_t K,
                      const float* w, int64_t N, int64_t c0, int64_t c1,
                      float* y);

static void scalar_cols(const float* x, int64_t ldx, int64_t M, int64_t K,
                        const float* w, int64_t ldw, int64_t ncols, float* y,
                        int64_t ldy) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < ncols; ++j) {
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += x[m * ldx + k] * w[k * ldw + j];
      y[m * ldy + j] = s;
    }
}

// y[0:M, 0:ncols] = x[0:M, 0:K] @ w[0:K, 0:ncols]  (w has row stride ldw)
static void do_block(const Cfg& c, const float* x, int64_t M, int64_t K,
                     const float* w, int64_t ldw, int64_t ncols, float* y,
                     int64_t ldy) {
  const MicroFn(*tab)[5] = c.kern == 1 ? kPlain : kAvx;
  const int64_t KC = (M <= c.mt) ? K : c.kc;
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t kn = std::min(KC, K - k0);
    for (int64_t m0 = 0; m0 < M; m0 += c.mt) {
      const int mt = (int)std::min<int64_t>(c.mt, M - m0);
      int64_t c0 = 0;
      while (c0 < ncols) {
        int nv = (int)std::min<int64_t>(c.nv, (ncols - c0) / 16);
        if (nv == 0) {  // < 16 columns left (not used for our shapes)
          if (k0 == 0 && m0 == 0)
            scalar_cols(x, K, M, K, w + c0, ldw, ncols - c0, y + c0, ldy);
          break;
        }
        tab[mt][nv](x + m0 * K + k0, K, w + k0 * ldw + c0, ldw,
                    y + m0 * ldy + c0, ldy, kn, k0 > 0, (int64_t)c.pf * ldw);
        c0 += nv * 16;
      }
    }
  }
}

static void do_stream(const Cfg& c, const float* x, int64_t M, int64_t K,
                      const float* w, int64_t N, int64_t c0, int64_t c1,
                      float* y) {
  const MicroFn(*tab0)[5] = c.kern ? kPlain : kAvx;
  const MicroFn(*tabk)[5] = nullptr;
  if (c.kern == 2) tabk = c.skc == 4 ? kAvxK4 : c.skc == 8 ? kAvxK8 : c.skc == 16 ? kAvxK16 : nullptr;
  for (int64_t s0 = c0; s0 < c1; s0 += c.cw) {
    const int64_t s1 = std::min(c1, s0 + c.cw);
    for (int64_t k0 = 0; k0 < K; k0 += c.skc) {
      const int64_t kn = std::min(c.skc, K - k0);
      const MicroFn(*tab)[5] = (tabk && kn == c.skc) ? tabk : tab0;
      for (int64_t m0 = 0; m0 < M; m0 += c.mt) {
        const int mt = (int)std::min<int64_t>(c.mt, M - m0);
        int64_t cc = s0;
        while (cc < s1) {
          int nv = (int)std::min<int64_t>(c.nv, (s1 - cc) / 16);
          if (nv == 0) {
            if (k0 == 0 && m0 == 0)
              scalar_cols(x, K, M, K, w + cc, N, s1 - cc, y + cc, N);
            break;
          }
          tab[mt][nv](x + m0 * K + k0, K, w + k0 * N + cc, N, y + m0 * N + cc,
                      N, kn, k0 > 0, c.pf < 0 ? (int64_t)(-c.pf) * N : (int64_t)c.pf);
          cc += nv * 16;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// persistent pool with dynamic chunk claiming.
// ticket = [gen:24 | n:20 | idx:20]; chunks are claimed by CAS, so a worker
// that wakes late (e.g. preempted by another process) just finds no work and
// the caller never waits for a thread that has not started; it only waits for
// chunks already in flight.
// ---------------------------------------------------------------------------
class Pool {
 public:
  explicit Pool(int nworkers) {
    const char* s = getenv("GEMV_SPIN");
    spin_ = s ? atol(s) : 20000;
    for (int i = 0; i < nworkers; ++i) threads_.emplace_back([this] { Loop(); });
  }
  int nworkers() const { return (int)threads_.size(); }
  // Runs fn(ctx, chunk) for chunk in [0, n) on the caller + workers.
  void Run(void (*fn)(void*, int64_t), void* ctx, int64_t n) {
    fn_ = fn;
    ctx_ = ctx;
    gen_id_ = (gen_id_ + 1) & 0xffffff;
    ticket_.store((gen_id_ << 40) | ((uint64_t)n << 20), std::memory_order_release);
    Kick();
    Work();
    for (long i = 0; inflight_.load(std::memory_order_seq_cst) != 0; ++i)
      if (i > 20000) std::this_thread::yield(); else _mm_pause();
  }

 private:
  static constexpr uint64_t kMask = (1u << 20) - 1;
  bool Claim(int64_t* idx) {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    for (;;) {
      uint64_t i = t & kMask, n = (t >> 20) & kMask;
      if (i >= n) return false;
      if (ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) {
        *idx = (int64_t)i;
        return true;
      }
    }
  }
  void Work() {
    int64_t idx;
    while (Claim(&idx)) fn_(ctx_, idx);
  }
  void WorkerWork() {
    inflight_.fetch_add(1, std::memory_order_seq_cst);
    int64_t idx;
    while (Claim(&idx)) fn_(ctx_, idx);
    inflight_.fetch_sub(1, std::memory_order_seq_cst);
  }
  void Kick() {
    gen_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> l(mu_); }
      cv_.notify_all();
    }
  }
  void Loop() {
    uint64_t last = 0;
    for (;;) {
      uint64_t g;
      long i = 0;
      while ((g = gen_.load(std::memory_order_acquire)) == last && i < spin_) {
        _mm_pause();
        ++i;
      }
      if (g == last) {
        std::unique_lock<std::mutex> l(mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(l, [&] { return gen_.load(std::memory_order_seq_cst) != last; });
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        g = gen_.load(std::memory_order_acquire);
      }
      last = g;
      WorkerWork();
    }
  }
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<uint64_t> ticket_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<int> inflight_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  void (*volatile fn_)(void*, int64_t) = nullptr;
  void* volatile ctx_ = nullptr;
  uint64_t gen_id_ = 0;
  long spin_;
};

static Pool& GetPool() {
  static Pool* p = [] {
    const char* s = getenv("GEMV_POOL_WORKERS");
    int n = s ? atoi(s) : (int)std::max(1u, std::thread::hardware_concurrency()) - 1;
    return new Pool(std::max(n, 1));
  }();
  return *p;
}

// ---------------------------------------------------------------------------
// work split
// ---------------------------------------------------------------------------
struct Job {
  Cfg c;
  const float* x;
  const float* w;
  float* y;
  int64_t M, K, N;
  int64_t bw;       // block width (floats)
  bool packed;      // w is [N/bw, K, bw]
  int nthr;
};

static void RunPart(void* p, int tid) {
  const Job& j = *static_cast<const Job*>(p);
  const int64_t nblk = (j.N + j.bw - 1) / j.bw;
  const int64_t b0 = nblk * tid / j.nthr, b1 = nblk * (tid + 1) / j.nthr;
  if (!j.packed && j.c.skc > 0) {
    do_stream(j.c, j.x, j.M, j.K, j.w, j.N, std::min(b0 * j.bw, j.N),
              std::min(b1 * j.bw, j.N), j.y);
    return;
  }
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t c0 = b * j.bw;
    const int64_t nc = std::min(j.bw, j.N - c0);
    if (j.packed)
      do_block(j.c, j.x, j.M, j.K, j.w + b * j.K * j.bw, j.bw, nc, j.y + c0, j.N);
    else
      do_block(j.c, j.x, j.M, j.K, j.w + c0, j.N, nc, j.y + c0, j.N);
  }
}

// dynamic chunks of cw columns (rounded to whole blocks)
static int64_t ChunkCols(const Job& j) {
  // at least ~4 chunks so two threads can balance dynamically
  int64_t quarter = ((j.N + 3) / 4 + j.bw - 1) / j.bw * j.bw;
  int64_t cw = std::max<int64_t>(std::min<int64_t>(j.c.cw, quarter), j.bw);
  return (cw / j.bw) * j.bw;
}
static void RunChunk(void* p, int64_t ci) {
  const Job& j = *static_cast<const Job*>(p);
  const int64_t cc = ChunkCols(j);
  const int64_t c0 = ci * cc, c1 = std::min(j.N, c0 + cc);
  if (!j.packed && j.c.skc > 0) {
    do_stream(j.c, j.x, j.M, j.K, j.w, j.N, c0, c1, j.y);
    return;
  }
  for (int64_t c = c0; c < c1; c += j.bw) {
    const int64_t nc = std::min(j.bw, j.N - c);
    if (j.packed)
      do_block(j.c, j.x, j.M, j.K, j.w + (c / j.bw) * j.K * j.bw, j.bw, nc, j.y + c, j.N);
    else
      do_block(j.c, j.x, j.M, j.K, j.w + c, j.N, nc, j.y + c, j.N);
  }
}

static void Dispatch(Job& j, int mode, ffi::ThreadPool& tp) {
  if (j.nthr <= 1 || mode == 0) {
    j.nthr = 1;
    RunPart(&j, 0);
    return;
  }
  if (mode == 1) {
    const int64_t cc = ChunkCols(j);
    GetPool().Run(RunChunk, &j, (j.N + cc - 1) / cc);
    return;
  }
  if (mode == 2) {
    static bool printed = false;
    int64_t nt = tp.num_threads();
    if (!printed && getenv("GEMV_VERBOSE")) {
      fprintf(stderr, "[gemv] XLA intra-op pool num_threads=%ld\n", (long)nt);
      printed = true;
    }
    if (nt <= 0) {
      j.nthr = 1;
      RunPart(&j, 0);
      return;
    }
    std::atomic<int> done{0};
    const int extra = j.nthr - 1;
    for (int t = 1; t <= extra; ++t)
      tp.Schedule([&j, &done, t] {
        RunPart(&j, t);
        done.fetch_add(1, std::memory_order_release);
      });
    RunPart(&j, 0);
    for (long i = 0; done.load(std::memory_order_acquire) != extra; ++i)
      if (i > 100000) std::this_thread::yield(); else _mm_pause();
    return;
  }
  // mode 3: spawn threads per call
  std::vector<std::thread> ts;
  for (int t = 1; t < j.nthr; ++t) ts.emplace_back(RunPart, &j, t);
  RunPart(&j, 0);
  for (auto& t : ts) t.join();
}

static Cfg MakeCfg(int64_t M, int64_t nv, int64_t mt, int64_t pf, int64_t kern,
                   int64_t skc = 0, int64_t cw = 1024) {
  Cfg c;
  if (skc < 0) skc = M <= 4 ? 8 : 16;  // auto: measured best
  c.skc = skc;
  c.cw = cw > 0 ? cw : 1024;
  c.kern = (int)kern;
  c.pf = (int)pf;
  if (mt <= 0) mt = M <= 8 ? M : 8;
  mt = std::min<int64_t>(std::min<int64_t>(mt, 16), M);
  // register tile MT x NV*16 (<= 24 accumulators); NV=3 for 5..8 rows
  if (nv <= 0) nv = mt <= 4 ? 4 : (mt <= 8 ? 3 : 1);
  c.nv = (int)std::max<int64_t>(1, std::min<int64_t>(nv, 4));
  c.mt = (int)mt;
  c.kc = 256;
  return c;
}

static ffi::Error GemvImpl(ffi::ThreadPool tp, ffi::Buffer<ffi::F32> x,
                           ffi::Buffer<ffi::F32> w,
                           ffi::ResultBuffer<ffi::F32> y, int64_t mode,
                           int64_t kern, int64_t nv, int64_t mt, int64_t pf,
                           int64_t nthr, int64_t skc, int64_t cw) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0])
    return ffi::Error::InvalidArgument("gemv: bad shapes");
  Job j;
  j.M = xd[0];
  j.K = xd[1];
  j.N = wd[1];
  j.c = MakeCfg(j.M, nv, mt, pf, kern, skc, cw);
  j.bw = j.c.nv * 16;
  j.x = x.typed_data();
  j.w = w.typed_data();
  j.y = y->typed_data();
  j.packed = false;
  j.nthr = (int)std::max<int64_t>(1, nthr);
  Dispatch(j, (int)mode, tp);
  return ffi::Error::Success();
}

// W packed as [NB, K, bw] ; N = NB*bw (N must be a multiple of bw).
static ffi::Error GemvPackedImpl(ffi::ThreadPool tp, ffi::Buffer<ffi::F32> x,
                                 ffi::Buffer<ffi::F32> w,
                                 ffi::ResultBuffer<ffi::F32> y, int64_t mode,
                                 int64_t kern, int64_t nv, int64_t mt,
                                 int64_t pf, int64_t nthr, int64_t skc,
                                 int64_t cw) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 3 || xd[1] != wd[1])
    return ffi::Error::InvalidArgument("gemv_packed: bad shapes");
  Job j;
  j.M = xd[0];
  j.K = xd[1];
  j.bw = wd[2];
  j.N = wd[0] * wd[2];
  j.c = MakeCfg(j.M, nv, mt, pf, kern);
  if (j.bw % 16 != 0) return ffi::Error::InvalidArgument("bw % 16 != 0");
  j.c.nv = (int)std::min<int64_t>(j.c.nv, j.bw / 16);
  j.x = x.typed_data();
  j.w = w.typed_data();
  j.y = y->typed_data();
  j.packed = true;
  j.nthr = (int)std::max<int64_t>(1, nthr);
  Dispatch(j, (int)mode, tp);
  return ffi::Error::Success();
}

#define BIND_ATTRS                                                    \
  .Attr<int64_t>("mode").Attr<int64_t>("kern").Attr<int64_t>("nv")    \
      .Attr<int64_t>("mt").Attr<int64_t>("pf").Attr<int64_t>("nthr")      \
      .Attr<int64_t>("skc").Attr<int64_t>("cw")

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemvF32, GemvImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>() BIND_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(GemvPackedF32, GemvPackedImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>() BIND_ATTRS);

// ---------------------------------------------------------------------------
// reference: raw read bandwidth with nthr threads (sum of floats, AVX-512)
// ---------------------------------------------------------------------------
extern "C" double read_bw_sum(const float* p, int64_t n, int nthr) {
  std::vector<double> part(nthr, 0.0);
  auto body = [&](int t) {
    int64_t a = n * t / nthr, b = n * (t + 1) / nthr;
    a = (a + 63) & ~int64_t(63);
    b = t == nthr - 1 ? b : ((b + 63) & ~int64_t(63));
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = a;
    for (; i + 64 <= b; i += 64) {
      s0 = _mm512_add_ps(s0, _mm512_loadu_ps(p + i));
      s1 = _mm512_add_ps(s1, _mm512_loadu_ps(p + i + 16));
      s2 = _mm512_add_ps(s2, _mm512_loadu_ps(p + i + 32));
      s3 = _mm512_add_ps(s3, _mm512_loadu_ps(p + i + 48));
    }
    float r = _mm512_reduce_add_ps(
        _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
    for (; i < b; ++i) r += p[i];
    part[t] = r;
  };
  std::vector<std::thread> ts;
  for (int t = 1; t < nthr; ++t) ts.emplace_back(body, t);
  body(0);
  for (auto& t : ts) t.join();
  double s = 0;
  for (double v : part) s += v;
  return s;
}

// Direct entry (no XLA) for standalone measurements. mode: 0 single, 1 own pool, 3 spawn.
extern "C" void gemv_direct(const float* x, const float* w, float* y, int64_t M,
                            int64_t K, int64_t N, int64_t nv, int64_t mt,
                            int64_t pf, int64_t kern, int64_t packed_bw,
                            int nthr, int mode, int64_t skc, int64_t cw) {
  Job j;
  j.M = M; j.K = K; j.N = N;
  j.c = MakeCfg(M, nv, mt, pf, kern, skc, cw);
  j.packed = packed_bw > 0;
  if (j.packed) j.c.nv = (int)std::min<int64_t>(j.c.nv, packed_bw / 16);
  j.bw = j.packed ? packed_bw : j.c.nv * 16;
  j.x = x; j.w = w; j.y = y; j.nthr = nthr;
  if (nthr <= 1 || mode == 0) { j.nthr = 1; RunPart(&j, 0); }
  else if (mode == 1) {
    const int64_t cc = ChunkCols(j);
    GetPool().Run(RunChunk, &j, (j.N + cc - 1) / cc);
  }
  else {
    std::vector<std::thread> ts;
    for (int t = 1; t < nthr; ++t) ts.emplace_back(RunPart, &j, t);
    RunPart(&j, 0);
    for (auto& t : ts) t.join();
  }
}
