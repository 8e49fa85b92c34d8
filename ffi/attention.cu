// Decode attention on CUDA (ffi/attention.h has the contract): one kernel per layer and step for
// what a decode step otherwise runs as five to six of XLA's (the rotary embedding, two cache
// updates, the scores' dot, the softmax, the values' dot), each a launch and a round trip to
// memory for a few kilobytes.
//
// Layout. A group of kSplits blocks (a thread-block cluster on sm_90 when kSplits > 1) serves one
// (sequence, KV head): its G = H / KVH query heads read the same keys and values, so each cache
// row is read once for all of them. Rank r of the group takes the positions [r tc, (r + 1) tc)
// up to pos. Inside a block, a row of the cache (hd values, 2 hd bytes) is read by L = hd / 8
// lanes, 16 bytes each, so a warp holds 32 / L rows at a time and the block's 8 warps form
// kStreams = 8 x 32 / L streams over the rows; each stream keeps an online softmax per query head
// (running maximum, running sum, the weighted sum of its lanes' 8 value dimensions). A row's
// score needs the L lanes' partial dots added: log2(L) xor-shuffles per head.
//
// Then the streams' states meet in shared memory (each (head, dimension) combined by one thread
// in stream order), and the blocks' states in rank 0's shared memory through distributed shared
// memory after one cluster barrier, combined in rank order: the same bits on every run.
//
// The new key and value: every block rotates q itself (cheap: G x hd / 2 pairs); the block whose
// range holds pos rotates k and writes k and v into the caches (aliased to the results) for the
// steps to come, and its stream of that row takes them from shared memory: no block reads the
// row at pos from memory, so the cache rows' loads need not wait for the write.
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

namespace jaxgemv {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kUnroll = 4;  // rows per stream in flight: the loop keeps the next trip's loads in flight

struct AttentionArgs {
  const void* qkv;  // [B, (H + 2 KVH) hd]
  void* k;          // [B, KVH, T, hd] (the result; the operand when aliased)
  void* v;
  const int32_t* pos;  // [B]
  void* o;             // [B, H hd]
  int heads, kv_heads, group, max_len, rows_per_rank;
  float rope_theta, scale;
};

// A 16-byte load of a cache row that skips L1 allocation (the rows are read once). Neither
// volatile nor ordered against memory: correct only because no block loads the row at pos, the
// one this kernel writes (load_rows in the kernel skips it); keep it so.
__device__ __forceinline__ uint4 LoadRow16(const void* p) {
  uint4 v;
  asm("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

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


// Shared memory (floats): q [kG][HD] (rotated, rounded); the new key and value [HD] each (the
// block that owns pos reads them from here for that row); the streams' states [kStreams][kG] x
// (HD + 2) (the weighted sums, then the maximum and the sum); with a cluster, rank 0's copy of
// every block's state [splits][kG] x (HD + 2).
template <int HD, int kG>
constexpr int StateFloats() {
  return kG * (HD + 2);
}
template <int HD, int kG>
size_t AttentionSmemBytes(int splits) {
  constexpr int kStreams = kWarps * 32 / (HD / 8);
  return sizeof(float) * (kG * HD + 2 * HD + (kStreams + (splits > 1 ? splits : 0)) * StateFloats<HD, kG>());
}

// The rotary pair (x1, x2) of dimension i < half at position p: float32, as the model computes it.
__device__ __forceinline__ float2 Rotate(float x1, float x2, int p, int i, int half, float theta) {
  float sn, cs;
  sincosf(static_cast<float>(p) * powf(theta, -static_cast<float>(i) / half), &sn, &cs);
  return make_float2(x1 * cs - x2 * sn, x2 * cs + x1 * sn);
}

// Order of work, for latency: pos first (everything depends on it); then, before anything waits,
// the first rows of the cache this block reads and the new q, k and v from qkv, so that the
// DRAM round trip of the rows, the L2 round trip of qkv and the rotary angles overlap. The row at
// pos is not loaded (it is being written): the block that owns it reads the new key and value
// from shared memory instead. Then the loop keeps the next rows' loads in flight while it uses
// the current ones.
template <typename T, int HD, int kG, bool kCluster>
__global__ void __launch_bounds__(kThreads) DecodeAttentionKernel(AttentionArgs a) {
  constexpr int L = HD / 8;  // lanes per cache row
  constexpr int kRowsPerWarp = 32 / L;
  constexpr int kStreams = kWarps * kRowsPerWarp;
  constexpr int kHalf = HD / 2;
  constexpr int kSlot = StateFloats<HD, kG>();
  constexpr int kStep = kUnroll * kStreams;  // rows per trip of the loop
  extern __shared__ __align__(16) float smem[];  // q is read as float4
  float* qs = smem;                                   // [kG][HD]
  float* knew = qs + kG * HD;                         // [HD]
  float* vnew = knew + HD;                            // [HD]
  float* states = vnew + HD;                          // [kStreams][kSlot]
  float* cluster_states = states + kStreams * kSlot;  // [splits][kSlot], rank 0's is read

  if constexpr (kCluster) ClusterArriveRelaxed();
  int rank = 0, nranks = 1;
  if constexpr (kCluster) ClusterRank(&rank, &nranks);
  const int pair = blockIdx.x / nranks;  // b x KVH + kvh
  const int b = pair / a.kv_heads, kvh = pair % a.kv_heads;
  const int G = a.group;
  const int64_t width = static_cast<int64_t>(a.heads + 2 * a.kv_heads) * HD;
  const T* row_in = static_cast<const T*>(a.qkv) + b * width;
  const int p = a.pos[b];
  const bool valid = p >= 0 && p < a.max_len;
  const bool rotate = a.rope_theta > 0.0f;
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int li = lane % L;                           // this lane's dimensions [8 li, 8 li + 8) of a row
  const int stream = warp * kRowsPerWarp + lane / L;  // rows r0 + stream, + kStreams, ...

  // The rows this block reads; whether it owns pos.
  const int r0 = rank * a.rows_per_rank;
  const int r1 = valid ? min(r0 + a.rows_per_rank, p + 1) : r0;
  const bool owner = valid && p >= r0 && p < r1;
  const int64_t cache_base = static_cast<int64_t>(pair) * a.max_len * HD;
  const uint4* kbase = reinterpret_cast<const uint4*>(static_cast<const T*>(a.k) + cache_base) + li;
  const uint4* vbase = reinterpret_cast<const uint4*>(static_cast<const T*>(a.v) + cache_base) + li;
  // The loop runs over the warp's first row, so that its lanes (several streams) take the same
  // number of trips: the shuffles need every lane. Rows past r1 (and the row at pos) load nothing.
  const int first = r0 + warp * kRowsPerWarp;
  uint4 kv[kUnroll], vv[kUnroll];
  auto load_rows = [&](int tw) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = tw + lane / L + u * kStreams;
      kv[u] = vv[u] = make_uint4(0, 0, 0, 0);
      if (t < r1 && t != p) {
        kv[u] = LoadRow16(kbase + static_cast<int64_t>(t) * L);
        vv[u] = LoadRow16(vbase + static_cast<int64_t>(t) * L);
      }
    }
  };
  if (first < r1) load_rows(first);

  // q (each thread some rotary pairs of the group's heads), rotated and rounded as the model
  // would round it; unused heads of the template's group are zeros.
  for (int j = tid; j < kG * kHalf; j += kThreads) {
    const int g = j / kHalf, i = j % kHalf;
    float2 x = make_float2(0.0f, 0.0f);
    if (g < G) {
      const T* q = row_in + static_cast<int64_t>(kvh * G + g) * HD;
      x = make_float2(Act<T>::ToFloat(q[i]), Act<T>::ToFloat(q[i + kHalf]));
      if (rotate && valid) {
        x = Rotate(x.x, x.y, p, i, kHalf, a.rope_theta);
        x = make_float2(Round<T>(x.x), Round<T>(x.y));
      }
    }
    qs[g * HD + i] = x.x;
    qs[g * HD + i + kHalf] = x.y;
  }
  // The new key (rotated) and value: into the caches for the steps to come, and into shared
  // memory for this block's row at pos.
  if (owner) {
    T* krow = static_cast<T*>(a.k) + cache_base + static_cast<int64_t>(p) * HD;
    T* vrow = static_cast<T*>(a.v) + cache_base + static_cast<int64_t>(p) * HD;
    const T* kin = row_in + static_cast<int64_t>(a.heads + kvh) * HD;
    const T* vin = row_in + static_cast<int64_t>(a.heads + a.kv_heads + kvh) * HD;
    for (int i = tid; i < kHalf; i += kThreads) {
      float2 x = make_float2(Act<T>::ToFloat(kin[i]), Act<T>::ToFloat(kin[i + kHalf]));
      if (rotate) x = Rotate(x.x, x.y, p, i, kHalf, a.rope_theta);
      const T k1 = Act<T>::FromFloat(x.x), k2 = Act<T>::FromFloat(x.y);
      krow[i] = k1, krow[i + kHalf] = k2;
      knew[i] = Act<T>::ToFloat(k1), knew[i + kHalf] = Act<T>::ToFloat(k2);
    }
    for (int i = tid; i < HD; i += kThreads) {
      const T v = vin[i];
      vrow[i] = v;
      vnew[i] = Act<T>::ToFloat(v);
    }
  }
  __syncthreads();

  float m[kG], l[kG], acc[kG][8];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
    for (int d = 0; d < 8; ++d) acc[g][d] = 0.0f;
  }
  for (int tw = first; tw < r1; tw += kStep) {
    float kf[kUnroll][8], vf[kUnroll][8];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      Widen8<T>(kv[u], kf[u]);
      Widen8<T>(vv[u], vf[u]);
      if (owner && tw + lane / L + u * kStreams == p) {
#pragma unroll
        for (int d = 0; d < 8; ++d) kf[u][d] = knew[8 * li + d], vf[u][d] = vnew[8 * li + d];
      }
    }
    if (tw + kStep < r1) load_rows(tw + kStep);  // the next trip's rows, in flight meanwhile
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool ok = tw + lane / L + u * kStreams < r1;
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        if (g >= G) break;
        const float4 qa = *reinterpret_cast<const float4*>(qs + g * HD + 8 * li);
        const float4 qb = *reinterpret_cast<const float4*>(qs + g * HD + 8 * li + 4);
        float s = qa.x * kf[u][0] + qa.y * kf[u][1] + qa.z * kf[u][2] + qa.w * kf[u][3] + qb.x * kf[u][4] +
                  qb.y * kf[u][5] + qb.z * kf[u][6] + qb.w * kf[u][7];
#pragma unroll
        for (int off = L / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (!ok) continue;
        s *= a.scale;
        const float mn = fmaxf(m[g], s);
        const float c = __expf(m[g] - mn), e = __expf(s - mn);
        m[g] = mn;
        l[g] = l[g] * c + e;
#pragma unroll
        for (int d = 0; d < 8; ++d) acc[g][d] = acc[g][d] * c + e * vf[u][d];
      }
    }
  }
  // Every stream's state into shared memory (the lanes of a row share m and l: lane li = 0 writes
  // them).
  float* mine = states + stream * kSlot;
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int d = 0; d < 8; ++d) mine[g * (HD + 2) + 8 * li + d] = acc[g][d];
    if (li == 0) mine[g * (HD + 2) + HD] = m[g], mine[g * (HD + 2) + HD + 1] = l[g];
  }
  __syncthreads();

  // Combine `count` states [count][kSlot] at `src` into (m, l, acc) of (g, d) for every (g, d) of
  // this thread; the states whose maximum is -inf (no rows) weigh nothing.
  auto combine = [&](const float* src, int count, int g, int d, float* mo, float* lo, float* ao) {
    float mx = -INFINITY;
    for (int s = 0; s < count; ++s) mx = fmaxf(mx, src[s * kSlot + g * (HD + 2) + HD]);
    float sum = 0.0f, val = 0.0f;
    if (mx != -INFINITY) {
      for (int s = 0; s < count; ++s) {
        const float* st = src + s * kSlot + g * (HD + 2);
        const float w = st[HD] == -INFINITY ? 0.0f : __expf(st[HD] - mx);
        sum += st[HD + 1] * w;
        val += st[d] * w;
      }
    }
    *mo = mx, *lo = sum, *ao = val;
  };
  T* out = static_cast<T*>(a.o) + (static_cast<int64_t>(b) * a.heads + static_cast<int64_t>(kvh) * G) * HD;
  if constexpr (!kCluster) {
    for (int j = tid; j < G * HD; j += kThreads) {
      const int g = j / HD, d = j % HD;
      float mo, lo, ao;
      combine(states, kStreams, g, d, &mo, &lo, &ao);
      out[j] = Act<T>::FromFloat(valid ? ao / lo : NAN);
    }
  } else {
    // Each block's state into rank 0's shared memory, after the first barrier phase says every
    // block of the cluster runs; then rank 0 combines them in rank order. (The barriers are
    // .aligned: each warp reconverges first.)
    __syncwarp();
    ClusterWait();
    for (int j = tid; j < G * HD; j += kThreads) {
      const int g = j / HD, d = j % HD;
      float mo, lo, ao;
      combine(states, kStreams, g, d, &mo, &lo, &ao);
      float* slot = cluster_states + rank * kSlot + g * (HD + 2);
      StoreToRank0(slot + d, ao);
      if (d == 0) StoreToRank0(slot + HD, mo), StoreToRank0(slot + HD + 1, lo);
    }
    __syncwarp();
    ClusterArriveRelease();
    ClusterWaitAcquire();
    if (rank != 0) return;
    for (int j = tid; j < G * HD; j += kThreads) {
      const int g = j / HD, d = j % HD;
      float mo, lo, ao;
      combine(cluster_states, nranks, g, d, &mo, &lo, &ao);
      out[j] = Act<T>::FromFloat(valid ? ao / lo : NAN);
    }
  }
}

template <typename T, int HD, int kG, bool kCluster>
cudaError_t LaunchAttention(cudaStream_t stream, const AttentionArgs& a, int splits, int pairs) {
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
  return LaunchClustered(kernel, kCluster ? splits : 1, static_cast<unsigned>(pairs * splits), kThreads, smem, stream,
                         a);
}

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
  if (s.batch * kv_heads * splits >= (int64_t{1} << 31) || s.max_len >= (int64_t{1} << 30))
    return Invalid("decode_attention: too many blocks or positions");
  if (!Aligned16(qkv.untyped_data()) || !Aligned16(k_out->untyped_data()) || !Aligned16(v_out->untyped_data()))
    return Invalid("decode_attention: qkv and the caches must be 16-byte aligned");
  if (splits > 1) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      return ffi::Error::Internal("jaxgemv: decode_attention: cannot read the device's compute capability");
    if (major < 9) return Invalid("decode_attention: splits > 1 needs compute capability 9.0 (clusters)");
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

  const int rows_per_rank = static_cast<int>((s.max_len + splits - 1) / splits);
  const AttentionArgs a{qkv.untyped_data(), k_out->untyped_data(), v_out->untyped_data(),
                        static_cast<const int32_t*>(pos.untyped_data()), o->untyped_data(),
                        static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(s.group()),
                        static_cast<int>(s.max_len), rows_per_rank, rope_theta, scale};
  const int pairs = static_cast<int>(s.batch * kv_heads);
  const int g_max = s.group() <= 1 ? 1 : s.group() <= 2 ? 2 : s.group() <= 4 ? 4 : 8;
  Switch<64, 128, 256>(s.head_dim, [&](auto hd) {
    Switch<1, 2, 4, 8>(g_max, [&](auto gm) {
      constexpr int kHD = decltype(hd)::value, kG = decltype(gm)::value;
      auto launch = [&](auto t) {
        using T = decltype(t);
        err = splits > 1 ? LaunchAttention<T, kHD, kG, true>(stream, a, static_cast<int>(splits), pairs)
                         : LaunchAttention<T, kHD, kG, false>(stream, a, 1, pairs);
      };
      if (s.dtype == ffi::DataType::F16) launch(__half{});
      else launch(__nv_bfloat16{});
    });
  });
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string("jaxgemv: launching DecodeAttentionKernel (splits > 1 needs the "
                                            "extension built with sm_90 code): ") + cudaGetErrorString(err));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvDecodeAttentionCuda, jaxgemv::DecodeAttentionCuda,
                              jaxgemv::BindDecodeAttention(xla::ffi::Ffi::Bind()
                                                               .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                                               .Ctx<xla::ffi::DeviceOrdinal>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
