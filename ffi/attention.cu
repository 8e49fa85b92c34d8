// Decode attention on CUDA (ffi/attention.h has the contract): one kernel per layer and step for
// what a decode step otherwise runs as five to six of XLA's (the rotary embedding, two cache
// updates, the scores' dot, the softmax, the values' dot), each a launch and a round trip to
// memory for a few kilobytes.
//
// Layout. A group of kSplits blocks (a thread-block cluster on sm_90 when kSplits > 1) serves one
// (sequence, KV head): its G = H / KVH query heads read the same keys and values, so each cache
// row is read once for all of them. Without a cluster (short caches, where a block's time is
// latency and not bytes) each query head gets a block of its own instead, G blocks per KV head
// reading the same rows (once from DRAM, then from L2), each with a fraction of the arithmetic.
// The positions 0..pos split evenly over a cluster's blocks (pos is read in the kernel). Inside
// a block, a row of the cache (hd values, 2 hd bytes) is read by L = hd / 8 lanes, 16 bytes
// each, so a warp holds 32 / L rows at a time and the block's 8 warps form kStreams = 8 x 32 / L
// streams over the rows. A row's scores need the L lanes' partial dots added (one reduce-scatter
// per trip over all its rows and heads); the softmax then runs once per row and head over a
// chunk's scores in shared memory, not per lane and row (the kernel's comment says how).
//
// Then the streams' weighted sums meet in shared memory (each (head, dimension) added by one
// thread in stream order), and the blocks' states in rank 0's shared memory through distributed
// shared memory after one cluster barrier, combined in rank order: the same bits on every run.
//
// The new key and value: every block rotates its q itself; every block whose range holds pos
// rotates k and keeps k and v in shared memory for its stream of that row, and one of them (the
// first of the KV head's query-head blocks) writes them into the caches (aliased to the
// results) for the steps to come. No block uses the row at pos as memory holds it, so the cache
// rows' loads need not wait for the write (without a cluster the first trip, issued before pos
// is known, may load that row; it is discarded).
//
// Command-buffer compatible: no allocation, no synchronisation, no host reads of device memory
// (pos stays on the device: the range of rows is decided in the kernel).

#include <cuda_runtime.h>

#include <string>

#include "attention.h"
#include "cluster.cuh"
#include "common.h"
#include "cuda_util.cuh"
#include "handlers.h"
#include "layer.h"

namespace jaxgemv {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kUnroll = 4;  // rows per stream and trip of the row loops
// The cluster kernel's ring (long caches, where the bytes in flight per block set the rate): each
// thread copies its own 16-byte pieces of the trips to come into shared memory with cp.async,
// kRing - 1 trips (of keys or of values, in the order the loops take them) ahead of the trip it
// works on; 16 KB per slot (kUnroll pieces of kThreads threads).
constexpr int kRing = 4;
constexpr int kRingFloats = kRing * kUnroll * kThreads * 4;

struct AttentionArgs {
  const void* qkv;  // [B, (H + 2 KVH) hd]
  void* k;          // [B, KVH, T, hd] (the result; the operand when aliased)
  void* v;
  const int32_t* pos;  // [B]
  void* o;             // [B, H hd]
  int heads, kv_heads, group, max_len;
  int head_blocks;  // blocks per (sequence, KV head) along its query heads, kG heads each (1 with a cluster)
  float rope_theta, scale;
  // Whether pos and the first trip's cache rows may be read before GridDependencyWait: true where
  // the kernel before this one in the stream writes neither (it is launched without programmatic
  // dependent launch, so nothing runs beside it; or decoder_layer's call, where that kernel is the
  // layer's qkv product). False under the JAXGEMV_PDL diagnostic, where the kernel before could
  // be another attention writing the same cache.
  bool early_rows;
  // Whether the next kernel may launch at this one's start instead of once the cache rows are read
  // (cluster.cuh: EarlyTrigger).
  bool early_trigger;
};

template <typename T>
__device__ __forceinline__ void Widen8(const uint4& v, float* f) {
  using T2 = typename Act<T>::T2;
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = Act<T>::ToFloat2(FromU32<T2>(w[i]));
    f[2 * i] = p.x, f[2 * i + 1] = p.y;
  }
}

template <typename T>
__device__ __forceinline__ float Round(float v) {
  return Act<T>::ToFloat(Act<T>::FromFloat(v));
}


// Rows per chunk: the scores of a chunk wait in shared memory between the two passes over it
// (keys, then values), kChunkTrips trips of the row loop.
constexpr int kChunkTrips = 8;
template <int HD>
constexpr int StreamsOf() {
  return kWarps * 32 / (HD / 8);
}
template <int HD>
constexpr int ChunkRows() {
  return kChunkTrips * kUnroll * StreamsOf<HD>();
}

// Shared memory (floats, each region a multiple of 4 so that float4 accesses stay aligned):
//   q [kG][HD] (rotated, rounded); the new key and value [HD] each (the block that owns pos takes
//   its row from here); the chunk's scores, then weights [kG][ChunkRows]; per head the running
//   maximum, sum and the chunk's rescale factor [4][kG]; the streams' weighted sums
//   [kStreams][kG][HD], which with a cluster share their place with the ring (the ring is drained
//   before the sums are written), so that region is the larger of the two; with a cluster, rank
//   0's copy of every block's [splits][kG][HD + 2] (sums, maximum, sum of weights) and the blocks'
//   final weights [splits][kG]. (jaxgemv/attention.py's attention_smem_bytes mirrors this.)
template <int HD, int kG>
constexpr int SlotFloats() {
  return kG * (HD + 2);
}
template <int HD, int kG>
size_t AttentionSmemBytes(int splits) {
  const int cluster = splits > 1 ? splits * (SlotFloats<HD, kG>() + kG) : 0;
  const int sums = StreamsOf<HD>() * kG * HD;
  const int sums_or_ring = splits > 1 && kRingFloats > sums ? kRingFloats : sums;
  return sizeof(float) * (kG * HD + 2 * HD + kG * ChunkRows<HD>() + 4 * kG + sums_or_ring + cluster);
}

// Reduce-scatter over the lanes of a row (lane bits below 2 Off): on entry each lane holds N
// partial values s[0, N); on exit s[0, max(N / (2 Off), 1)) hold complete sums of the values
// first + i. Each level halves the values a lane holds: the lane with bit Off set keeps the
// upper half and sends the lower, its partner the reverse; N shuffles in all (not log2(L) per
// value), and all of a level's are independent.
template <int N, int Off>
__device__ __forceinline__ void ReduceScatter(float* s, int li, int& first) {
  if constexpr (Off > 0) {
    if constexpr (N > 1) {
      constexpr int H = N / 2;
      const bool upper = (li & Off) != 0;
#pragma unroll
      for (int i = 0; i < H; ++i) {
        const float send = upper ? s[i] : s[i + H];
        const float keep = upper ? s[i + H] : s[i];
        s[i] = keep + __shfl_xor_sync(0xffffffffu, send, Off);
      }
      if (upper) first += H;
      ReduceScatter<H, Off / 2>(s, li, first);
    } else {
      s[0] += __shfl_xor_sync(0xffffffffu, s[0], Off);
      ReduceScatter<1, Off / 2>(s, li, first);
    }
  }
}

// Work, per block (rows [r0, r1) of one (sequence, KV head), r1 <= pos + 1), chunk by chunk:
//   A. scores: stream by stream, each row's q.k for every head of the group (the row's L lanes
//      add their partial dots by xor-shuffles), scaled, into shared memory;
//   B. warp g (one per head) takes the chunk's maximum and exp(score - running maximum) of every
//      row: the weights go back over the scores, the sum and the rescale factor of what earlier
//      chunks summed beside them;
//   C. values: each stream adds weight x row into its 8 dimensions per head (no exponentials,
//      no rescaling per row).
// Then the streams' sums meet in shared memory (one thread per (head, dimension), in stream
// order), and with a cluster the blocks' (sum, maximum, weight sum) in rank 0's shared memory,
// combined in rank order: the same bits on every run.
//
// Latency: pos is read first; without a cluster the first trip's keys and values and the new q,
// k and v are requested before anything waits, so that their round trips overlap the rotary
// work, each trip then loads the next one into registers and the last trip of a chunk's value
// pass the next chunk's first keys and values. With a cluster (long caches, where the rate is
// the bytes in flight) each thread keeps kRing - 1 trips of cache rows in flight ahead of the
// one it works on, copied by cp.async into shared memory (the ring).
template <typename T, int HD, int kG, bool kCluster>
__global__ void __launch_bounds__(kThreads) DecodeAttentionKernel(AttentionArgs a) {
  constexpr int L = HD / 8;  // lanes per cache row
  constexpr int kRowsPerWarp = 32 / L;
  constexpr int kStreams = StreamsOf<HD>();
  constexpr int kHalf = HD / 2;
  constexpr int kStep = kUnroll * kStreams;  // rows per trip of the loops
  constexpr int kChunk = ChunkRows<HD>();
  constexpr int kSlot = SlotFloats<HD, kG>();
  extern __shared__ __align__(16) float smem[];  // q and the sums are accessed as float4
  float* qs = smem;                        // [kG][HD]
  float* knew = qs + kG * HD;              // [HD]
  float* vnew = knew + HD;                 // [HD]
  float* scores = vnew + HD;               // [kG][kChunk]
  float* run = scores + kG * kChunk;       // [4][kG]: maximum, sum, rescale
  float* sums = run + 4 * kG;              // [kStreams][kG][HD]; with a cluster the ring before
  // [kRing][kUnroll][kThreads] 16-byte pieces, each thread's own at [.][.][tid]
  uint4* ring = reinterpret_cast<uint4*>(sums);
  constexpr int kSumsOrRing = kCluster && kRingFloats > kStreams * kG * HD ? kRingFloats : kStreams * kG * HD;
  float* cluster_states = sums + kSumsOrRing;  // [splits][kSlot], rank 0's is read
  static_assert(kG <= kWarps, "phase B takes a warp per head");

  if constexpr (kCluster) ClusterArriveRelaxed();
  int rank = 0, nranks = 1;
  if constexpr (kCluster) ClusterRank(&rank, &nranks);
  const int blk = blockIdx.x / nranks;  // (b x KVH + kvh) x head_blocks + hb
  const int pair = blk / a.head_blocks, hb = blk % a.head_blocks;
  const int b = pair / a.kv_heads, kvh = pair % a.kv_heads;
  // This block's query heads: gbase + [0, G) of the KV head's group.
  const int gbase = hb * kG;
  const int G = min(kG, a.group - gbase);
  const int64_t head0 = static_cast<int64_t>(kvh) * a.group + gbase;  // its first query head
  const int64_t width = static_cast<int64_t>(a.heads + 2 * a.kv_heads) * HD;
  const T* row_in = static_cast<const T*>(a.qkv) + b * width;
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int li = lane % L;                            // this lane's dimensions [8 li, 8 li + 8) of a row
  const int stream = warp * kRowsPerWarp + lane / L;  // rows (trip) + stream + u kStreams
  const int wfirst = warp * kRowsPerWarp;             // a trip's first row of this warp
  const int64_t cache_base = static_cast<int64_t>(pair) * a.max_len * HD;
  const uint4* kbase = reinterpret_cast<const uint4*>(static_cast<const T*>(a.k) + cache_base) + li;
  const uint4* vbase = reinterpret_cast<const uint4*>(static_cast<const T*>(a.v) + cache_base) + li;

  // Everything that does not need pos is requested before pos is waited on: pos itself, then
  // (without a cluster, where every block starts at row 0) the first trip's rows, bounded by the
  // cache's length instead of pos (a row past pos is never used: phase A stores no score for it
  // and phase C zeroes its values; the row at pos is replaced from shared memory), the new q, k
  // and v from qkv, and the rotary frequency (a thread's pairs all share dimension pi).
  // Where a.early_rows allows, pos and the first trip are requested before the wait, so that
  // their DRAM round trip overlaps the end of the kernel before (the layer's qkv product); the
  // new q, k and v come from that kernel and are read after it.
  int p = 0;
  uint4 kv[kUnroll], vv[kUnroll];
  auto first_trip = [&] {
    p = a.pos[b];
    if constexpr (!kCluster) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int t = wfirst + lane / L + u * kStreams;
        kv[u] = vv[u] = make_uint4(0, 0, 0, 0);
        if (t < a.max_len) {
          kv[u] = LoadStream16(kbase + static_cast<int64_t>(t) * L);
          vv[u] = LoadStream16(vbase + static_cast<int64_t>(t) * L);
        }
      }
    }
  };
  if (a.early_trigger) LaunchDependents();
  if (a.early_rows) first_trip();
  GridDependencyWait();  // nothing above reads memory but where a.early_rows allows (JAXGEMV_PDL, cuda_util.cuh)
  if (!a.early_rows) first_trip();
  static_assert(kThreads % kHalf == 0, "a thread's rotary pairs share one dimension");
  constexpr int kQIters = (kG * kHalf + kThreads - 1) / kThreads;
  const int pi = tid % kHalf;
  T qraw[kQIters][2];
#pragma unroll
  for (int it = 0; it < kQIters; ++it) {
    const int j = tid + it * kThreads, g = j / kHalf;
    qraw[it][0] = qraw[it][1] = Act<T>::FromFloat(0.0f);
    if (j < kG * kHalf && g < G) {
      const T* q = row_in + (head0 + g) * HD;
      qraw[it][0] = q[pi], qraw[it][1] = q[pi + kHalf];
    }
  }
  const T* kin = row_in + static_cast<int64_t>(a.heads + kvh) * HD;
  const T* vin = row_in + static_cast<int64_t>(a.heads + a.kv_heads + kvh) * HD;
  T kraw[2], vraw = Act<T>::FromFloat(0.0f);
  kraw[0] = kraw[1] = vraw;
  if (tid < kHalf) kraw[0] = kin[pi], kraw[1] = kin[pi + kHalf];
  if (tid < HD) vraw = vin[tid];
  const bool rotate = a.rope_theta > 0.0f;
  const float inv_freq = rotate ? powf(a.rope_theta, -static_cast<float>(pi) / kHalf) : 0.0f;

  const bool valid = p >= 0 && p < a.max_len;
  // Positions 0..p split evenly over the cluster's blocks.
  const int total = valid ? p + 1 : 0;
  const int per_rank = (total + nranks - 1) / nranks;
  const int r0 = min(rank * per_rank, total);
  const int r1 = min(r0 + per_rank, total);
  const bool owner = valid && p >= r0 && p < r1;
  // Rows past r1 (and, in a cluster, the row at pos) load nothing from here on. LoadStream16 is
  // not ordered against this kernel's write of the row at pos, so no block uses what it loads of
  // that row (the first trip without a cluster may load it, and replaces it from shared memory).
  auto load = [&](uint4* dst, const uint4* base, int tw) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = tw + lane / L + u * kStreams;
      dst[u] = make_uint4(0, 0, 0, 0);
      if (t < r1 && t != p) dst[u] = LoadStream16(base + static_cast<int64_t>(t) * L);
    }
  };
  // The ring (cluster kernel): this thread's trips in the order the row loops take them (per
  // chunk its trips of keys, then the same trips of values; a warp whose first row lies past a
  // short last chunk has none there), `ahead` the next one to copy. Every call commits one
  // cp.async group, empty past the last trip, so that group i is trip i's.
  int ahead_c0 = r0, ahead_c1 = min(r0 + kChunk, r1), ahead_tw = r0 + wfirst;
  bool ahead_values = false;
  auto ahead_skip = [&]() {  // past the end of the keys' or values' trips: the next ones
    while (ahead_c0 < r1 && ahead_tw >= ahead_c1) {
      if (ahead_values) ahead_c0 = ahead_c1, ahead_c1 = min(ahead_c0 + kChunk, r1);
      ahead_values = !ahead_values;
      ahead_tw = ahead_c0 + wfirst;
    }
  };
  auto copy_ahead = [&](int slot) {
    if (ahead_c0 < r1) {
      const uint4* base = ahead_values ? vbase : kbase;
      uint4* dst = ring + slot * kUnroll * kThreads + tid;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int t = ahead_tw + lane / L + u * kStreams;
        if (t < ahead_c1 && t != p) CpAsync16(dst + u * kThreads, base + static_cast<int64_t>(t) * L);
      }
      ahead_tw += kStep;
      ahead_skip();
    }
    CpAsyncCommit();
  };
  // A trip's pieces: from the registers loaded a trip before (no cluster), or from the ring after
  // the next trip's copies are issued (into the slot this thread read a trip ago: its reads of it
  // long done) and this trip's group has landed (cp.async.wait_group makes a thread's own copies
  // visible to it: no barrier, as each thread reads only what it copied).
  int taken = 0;
  auto take = [&](uint4* cur, const uint4* regs) {
    if constexpr (kCluster) {
      copy_ahead((taken + kRing - 1) % kRing);
      CpAsyncWait<kRing - 1>();
      const uint4* src = ring + (taken % kRing) * kUnroll * kThreads + tid;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) cur[u] = src[u * kThreads];
      ++taken;
    } else {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) cur[u] = regs[u];
    }
  };
  if constexpr (kCluster) {
    ahead_skip();
#pragma unroll
    for (int i = 0; i < kRing - 1; ++i) copy_ahead(i);
  }

  // q rotated and rounded as the model would round it (unused heads of the template's group are
  // zeros), and the new key (rotated) and value: into the caches for the steps to come and into
  // shared memory for this block's row at pos.
  float sn = 0.0f, cs = 1.0f;
  if (rotate && valid) sincosf(static_cast<float>(p) * inv_freq, &sn, &cs);
  auto rotate_pair = [&](float& x1, float& x2) {  // rotate-half: dimension pi with pi + HD / 2
    const float r1f = x1 * cs - x2 * sn, r2f = x2 * cs + x1 * sn;
    x1 = r1f, x2 = r2f;
  };
#pragma unroll
  for (int it = 0; it < kQIters; ++it) {
    const int j = tid + it * kThreads, g = j / kHalf;
    if (j < kG * kHalf) {
      float x1 = Act<T>::ToFloat(qraw[it][0]), x2 = Act<T>::ToFloat(qraw[it][1]);
      if (rotate && valid) {
        rotate_pair(x1, x2);
        x1 = Round<T>(x1), x2 = Round<T>(x2);
      }
      qs[g * HD + pi] = x1;
      qs[g * HD + pi + kHalf] = x2;
    }
  }
  if (owner) {
    // Every block of the pair keeps the new row in shared memory; the first writes the caches.
    const bool writer = hb == 0;
    T* krow = static_cast<T*>(a.k) + cache_base + static_cast<int64_t>(p) * HD;
    T* vrow = static_cast<T*>(a.v) + cache_base + static_cast<int64_t>(p) * HD;
    if (tid < kHalf) {
      float x1 = Act<T>::ToFloat(kraw[0]), x2 = Act<T>::ToFloat(kraw[1]);
      if (rotate) rotate_pair(x1, x2);
      const T k1 = Act<T>::FromFloat(x1), k2 = Act<T>::FromFloat(x2);
      if (writer) krow[pi] = k1, krow[pi + kHalf] = k2;
      knew[pi] = Act<T>::ToFloat(k1), knew[pi + kHalf] = Act<T>::ToFloat(k2);
    }
    if (tid < HD) {
      if (writer) vrow[tid] = vraw;
      vnew[tid] = Act<T>::ToFloat(vraw);
    }
  }
  if (tid < kG) run[tid] = -INFINITY, run[kG + tid] = 0.0f, run[2 * kG + tid] = 0.0f;
  __syncthreads();

  float acc[kG][8];
#pragma unroll
  for (int g = 0; g < kG; ++g)
#pragma unroll
    for (int d = 0; d < 8; ++d) acc[g][d] = 0.0f;

  for (int c0 = r0; c0 < r1; c0 += kChunk) {
    const int c1 = min(c0 + kChunk, r1);
    // A. Scores of rows [c0, c1). Each lane's partial dots of the trip's rows and heads, then one
    // reduce-scatter over the row's L lanes (no branches: heads past G have zero q and store
    // nothing), after which each lane stores the complete scores it holds.
    for (int tw = c0 + wfirst; tw < c1; tw += kStep) {
      float kf[kUnroll][8];
      uint4 cur[kUnroll];
      take(cur, kv);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        Widen8<T>(cur[u], kf[u]);
        if (owner && tw + lane / L + u * kStreams == p) {
#pragma unroll
          for (int d = 0; d < 8; ++d) kf[u][d] = knew[8 * li + d];
        }
      }
      if constexpr (!kCluster) {
        if (tw + kStep < c1) load(kv, kbase, tw + kStep);  // the next trip's keys, in flight meanwhile
      }
      float part[kUnroll * kG];
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const float4 qa = *reinterpret_cast<const float4*>(qs + g * HD + 8 * li);
        const float4 qb = *reinterpret_cast<const float4*>(qs + g * HD + 8 * li + 4);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          part[u * kG + g] = qa.x * kf[u][0] + qa.y * kf[u][1] + qa.z * kf[u][2] + qa.w * kf[u][3] +
                             qb.x * kf[u][4] + qb.y * kf[u][5] + qb.z * kf[u][6] + qb.w * kf[u][7];
      }
      int first = 0;
      ReduceScatter<kUnroll * kG, L / 2>(part, li, first);
      constexpr int kHeld = kUnroll * kG >= L ? kUnroll * kG / L : 1;
      // With fewer values than lanes, lanes that differ in the low bits hold the same ones.
      constexpr int kCopies = kUnroll * kG >= L ? 1 : L / (kUnroll * kG);
      if (li % kCopies == 0) {
#pragma unroll
        for (int i = 0; i < kHeld; ++i) {
          const int v = first + i, u = v / kG, g = v % kG;
          const int t = tw + lane / L + u * kStreams;
          if (g < G && t < c1) scores[g * kChunk + (t - c0)] = part[i] * a.scale;
        }
      }
    }
    __syncthreads();
    // B. Warp g: the chunk's maximum of head g, the weights exp(score - maximum) over the scores,
    // their sum, and the factor exp(old maximum - new maximum) for what earlier chunks summed.
    if (warp < G) {
      const int g = warp, n = c1 - c0;
      float* sg = scores + g * kChunk;
      float mx = -INFINITY;
      for (int i = lane; i < n; i += 32) mx = fmaxf(mx, sg[i]);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float old = run[g], mn = fmaxf(old, mx);
      float sum = 0.0f;
      for (int i = lane; i < n; i += 32) {
        const float e = __expf(sg[i] - mn);
        sg[i] = e;
        sum += e;
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      __syncwarp();
      if (lane == 0) {
        const float c = __expf(old - mn);  // 0 for the first chunk (old = -inf)
        run[g] = mn, run[kG + g] = run[kG + g] * c + sum, run[2 * kG + g] = c;
      }
    }
    __syncthreads();
    // C. Values of rows [c0, c1), weighted.
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      const float c = g < G ? run[2 * kG + g] : 0.0f;
#pragma unroll
      for (int d = 0; d < 8; ++d) acc[g][d] *= c;
    }
    for (int tw = c0 + wfirst; tw < c1; tw += kStep) {
      float vf[kUnroll][8];
      uint4 cur[kUnroll];
      take(cur, vv);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int t = tw + lane / L + u * kStreams;
        Widen8<T>(cur[u], vf[u]);
        if (owner && t == p) {
#pragma unroll
          for (int d = 0; d < 8; ++d) vf[u][d] = vnew[8 * li + d];
        }
        // A row past c1 weighs 0, but its values may be anything (the first trip's rows are
        // loaded before pos is known): zero them so that no 0 x NaN reaches the sums.
#pragma unroll
        for (int d = 0; d < 8; ++d) vf[u][d] = t < c1 ? vf[u][d] : 0.0f;
      }
      if constexpr (!kCluster) {
        if (tw + kStep < c1) {
          load(vv, vbase, tw + kStep);  // the next trip's values
        } else if (c1 < r1) {
          load(kv, kbase, c1 + wfirst);  // the next chunk's first keys and values
          load(vv, vbase, c1 + wfirst);
        }
      }
      // Rows past c1 weigh 0 (their slots still lie inside the chunk's scores).
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int t = tw + lane / L + u * kStreams;
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          const float w = g < G && t < c1 ? scores[g * kChunk + (t - c0)] : 0.0f;
#pragma unroll
          for (int d = 0; d < 8; ++d) acc[g][d] += w * vf[u][d];
        }
      }
    }
    __syncthreads();  // the next chunk's scores overwrite these
  }
  if (!a.early_trigger) LaunchDependents();  // the cache rows are read: the next kernel may start launching

  // Every stream's sums into shared memory (with a cluster over the ring: every group this thread
  // committed since its last trip is empty, and the loop's last barrier is behind every thread's
  // reads of the ring).
  if constexpr (kCluster) CpAsyncWait<0>();
  {
    float* mine = sums + stream * kG * HD + 8 * li;
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      *reinterpret_cast<float4*>(mine + g * HD) = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
      *reinterpret_cast<float4*>(mine + g * HD + 4) = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
    }
  }
  __syncthreads();
  // The block's sum of (head g, dimension d): the streams' added in stream order.
  auto block_sum = [&](int g, int d) {
    float v = 0.0f;
#pragma unroll
    for (int s = 0; s < kStreams; ++s) v += sums[s * kG * HD + g * HD + d];
    return v;
  };
  T* out = static_cast<T*>(a.o) + (static_cast<int64_t>(b) * a.heads + head0) * HD;
  if constexpr (!kCluster) {
    for (int j = tid; j < G * HD; j += kThreads) {
      const int g = j / HD, d = j % HD;
      out[j] = Act<T>::FromFloat(valid ? block_sum(g, d) * __frcp_rn(run[kG + g]) : NAN);
    }
  } else {
    // Each block's (sums, maximum, weight sum) into rank 0's shared memory, after the first
    // barrier phase says every block of the cluster runs; then rank 0 weighs them in rank order.
    // (The barriers are .aligned: each warp reconverges first.) A block without rows sends
    // maximum -inf and weighs nothing.
    __syncwarp();
    ClusterWait();
    for (int j = tid; j < G * HD; j += kThreads) {
      const int g = j / HD, d = j % HD;
      float* slot = cluster_states + rank * kSlot + g * (HD + 2);
      StoreToRank0(slot + d, block_sum(g, d));
      if (d == 0) StoreToRank0(slot + HD, run[g]), StoreToRank0(slot + HD + 1, run[kG + g]);
    }
    __syncwarp();
    ClusterArriveRelease();
    ClusterWaitAcquire();
    if (rank != 0) return;
    float* weights = cluster_states + nranks * kSlot;  // [nranks][kG]
    if (tid < G) {
      const int g = tid;
      float mx = -INFINITY;
      for (int r = 0; r < nranks; ++r) mx = fmaxf(mx, cluster_states[r * kSlot + g * (HD + 2) + HD]);
      float l = 0.0f;
      for (int r = 0; r < nranks; ++r) {
        const float m = cluster_states[r * kSlot + g * (HD + 2) + HD];
        const float w = m == -INFINITY ? 0.0f : __expf(m - mx);
        weights[r * kG + g] = w;
        l += cluster_states[r * kSlot + g * (HD + 2) + HD + 1] * w;
      }
      const float inv = __frcp_rn(l);
      for (int r = 0; r < nranks; ++r) weights[r * kG + g] *= inv;
    }
    __syncthreads();
    for (int j = tid; j < G * HD; j += kThreads) {
      const int g = j / HD, d = j % HD;
      float v = 0.0f;
      for (int r = 0; r < nranks; ++r) v += cluster_states[r * kSlot + g * (HD + 2) + d] * weights[r * kG + g];
      out[j] = Act<T>::FromFloat(valid ? v : NAN);
    }
  }
}

template <typename T, int HD, int kG, bool kCluster>
cudaError_t LaunchAttention(cudaStream_t stream, const AttentionArgs& a, int splits, int blocks) {
  auto* kernel = DecodeAttentionKernel<T, HD, kG, kCluster>;
  const size_t smem = AttentionSmemBytes<HD, kG>(splits);
  // The opt-in is the kernel's largest need (16 splits), not this call's: a function attribute is
  // shared by every call, and one captured into a command buffer must not see it lowered later.
  const size_t most = AttentionSmemBytes<HD, kG>(kCluster ? 16 : 1);
  if (most > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(most));
    if (err != cudaSuccess) return err;
  }
  if constexpr (kCluster) {
    // The cluster kernel needs sm_90 machine code: a build without it would run the compute_80
    // PTX, where the cluster instructions trap.
    cudaFuncAttributes attrs;
    const cudaError_t err = cudaFuncGetAttributes(&attrs, kernel);
    if (err != cudaSuccess) return err;
    if (attrs.binaryVersion < 90) return cudaErrorInvalidDeviceFunction;
  }
  return LaunchClustered(kernel, kCluster ? splits : 1, static_cast<unsigned>(blocks), kThreads, smem, stream,
                         PdlLaunch(), a);
}

}  // namespace

// (Outside the anonymous namespace: ffi/layer.cu launches it too; ffi/layer.h.)
ffi::Error DecodeAttentionCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer qkv, ffi::AnyBuffer k_cache,
                               ffi::AnyBuffer v_cache, ffi::AnyBuffer pos, ffi::Result<ffi::AnyBuffer> o,
                               ffi::Result<ffi::AnyBuffer> k_out, ffi::Result<ffi::AnyBuffer> v_out, int64_t heads,
                               int64_t kv_heads, float rope_theta, float scale, int64_t splits) {
  AttentionShape s;
  if (auto err = CheckDecodeAttention(qkv, k_cache, v_cache, pos, *o, *k_out, *v_out, heads, kv_heads, &s);
      err.failure())
    return err;
  if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256)
    return Invalid("decode_attention's kernel takes head_dim 64, 128 or 256");
  if (s.group() > 8) return Invalid("decode_attention's kernel takes at most 8 query heads per KV head");
  if (!(splits == 1 || splits == 2 || splits == 4 || splits == 8 || splits == 16))
    return Invalid("decode_attention: splits must be 1, 2, 4, 8 or 16");
  if (s.batch * heads * splits >= (int64_t{1} << 31) || s.max_len >= (int64_t{1} << 30))
    return Invalid("decode_attention: too many blocks or positions");
  if (!Aligned16(qkv.untyped_data()) || !Aligned16(k_out->untyped_data()) || !Aligned16(v_out->untyped_data()))
    return Invalid("decode_attention: qkv and the caches must be 16-byte aligned");
  if (splits > 1) {
    if (auto err = RequireSm90(device, false, "decode_attention: splits > 1 (clusters)"); err.failure()) return err;
  }
  if (s.batch == 0) return ffi::Error::Success();
  // Under jit the results alias the caches; where they do not, the caches are copied first.
  const size_t bytes = static_cast<size_t>(k_cache.element_count()) * 2;
  cudaError_t err = cudaSuccess;
  if (k_out->untyped_data() != k_cache.untyped_data())
    err = cudaMemcpyAsync(k_out->untyped_data(), k_cache.untyped_data(), bytes, cudaMemcpyDeviceToDevice, stream);
  if (err == cudaSuccess && v_out->untyped_data() != v_cache.untyped_data())
    err = cudaMemcpyAsync(v_out->untyped_data(), v_cache.untyped_data(), bytes, cudaMemcpyDeviceToDevice, stream);
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string("jaxgemv: decode_attention: copying the caches: ") + cudaGetErrorString(err));

  // Without a cluster (short caches: a block's time is latency, so the more SMs the better)
  // each query head has a block of its own, kNoClusterG = 1 head each, the KV head's rows read
  // once from DRAM and again from L2; a cluster of `splits` blocks serves all of a KV head's.
  constexpr int kNoClusterG = 1;
  const int head_blocks =
      splits > 1 ? 1 : static_cast<int>((s.group() + kNoClusterG - 1) / kNoClusterG);
  const AttentionArgs a{qkv.untyped_data(), k_out->untyped_data(), v_out->untyped_data(),
                        static_cast<const int32_t*>(pos.untyped_data()), o->untyped_data(),
                        static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(s.group()),
                        static_cast<int>(s.max_len), head_blocks, rope_theta, scale,
                        /*early_rows=*/EarlyReads(), /*early_trigger=*/EarlyTrigger()};
  const int pairs = static_cast<int>(s.batch * kv_heads);
  const int g_max = s.group() <= 1 ? 1 : s.group() <= 2 ? 2 : s.group() <= 4 ? 4 : 8;
  Switch<64, 128, 256>(s.head_dim, [&](auto hd) {
    constexpr int kHD = decltype(hd)::value;
    auto launch = [&](auto t) {
      using T = decltype(t);
      if (splits == 1) {
        err = LaunchAttention<T, kHD, kNoClusterG, false>(stream, a, 1, pairs * head_blocks);
        return;
      }
      Switch<1, 2, 4, 8>(g_max, [&](auto gm) {
        constexpr int kG = decltype(gm)::value;
        err = LaunchAttention<T, kHD, kG, true>(stream, a, static_cast<int>(splits), pairs * static_cast<int>(splits));
      });
    };
    if (s.dtype == ffi::DataType::F16) launch(__half{});
    else launch(__nv_bfloat16{});
  });
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string("jaxgemv: launching DecodeAttentionKernel (splits > 1 needs the "
                                            "extension built with sm_90 code): ") + cudaGetErrorString(err));
  return ffi::Error::Success();
}

int64_t DecodeAttentionSmemBytes(int64_t head_dim, int64_t g, int64_t splits) {
  int64_t bytes = -1;
  if (splits < 1) return bytes;
  Switch<64, 128, 256>(head_dim, [&](auto hd) {
    Switch<1, 2, 4, 8>(g, [&](auto gm) {
      bytes = static_cast<int64_t>(AttentionSmemBytes<decltype(hd)::value, decltype(gm)::value>(static_cast<int>(splits)));
    });
  });
  return bytes;
}

}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvDecodeAttentionCuda, jaxgemv::DecodeAttentionCuda,
                              jaxgemv::BindDecodeAttention(xla::ffi::Ffi::Bind()
                                                               .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                                               .Ctx<xla::ffi::DeviceOrdinal>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
