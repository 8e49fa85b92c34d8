// What do the boundaries between a decode step's kernels cost, and what does programmatic
// dependent launch (PDL) give back, in a graph and out of one?
//
// The 8B decode step (examples/decode.py --config 8b, NVFP4, batch 1) is five kernels per layer
// over 36 layers, each reading its own weight once: qkv 14.2 MB, the attention ~1 MB, o 9.4 MB,
// gate_up 56.6 MB, down 28.3 MB. This probe stands the streaming-read kernel in for each (every
// layer its own buffers, 3.9 GB in all, so every read is cold), and times one step's reads back
// to back, the kernels launched
//   stream       one after another on a stream;
//   stream+pdl   the same with the programmatic-serialization attribute, each kernel waiting
//                (griddepcontrol.wait) before its loads and letting the next one launch once its
//                loads are issued;
//   graph        captured into one CUDA graph, replayed;
//   graph+pdl    captured with the attribute: consecutive kernel nodes joined by programmatic
//                edges;
//   nested+pdl   each kernel captured into a graph of its own, the step a chain of those as child
//                nodes, the way XLA's command buffers record custom calls: no kernel-to-kernel
//                edge is left for the attribute;
//   layer(+pdl)  each layer's five kernels captured into one child graph (programmatic edges
//                inside it with the attribute), the step a chain of 36 children: what one custom
//                call launching a layer's kernels would be under XLA's command buffers.
// Reported against "graph" (what XLA's command buffers do for kernels of its own), beside each
// size's read time in a graph of reads of that size alone.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iffi -Itools tools/pdl_probe.cu -o /tmp/pdlprobe
//   /tmp/pdlprobe [layers] [blocks per SM]      (default 36 layers, 2 blocks of 512 threads per SM)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_util.cuh"
#include "stream_read.cuh"

namespace {

using jaxgemv::kReadThreads;

struct Read {
  const uint4* p;
  int64_t n16;
};

// The extension's streaming-read kernel (ffi/stream_read.cuh), with the wait and the trigger where
// `pdl` says; `salt` and `out` as it takes them.
const uint32_t* salt = nullptr;
void Launch(const Read& r, bool pdl, int blocks, uint32_t* out, cudaStream_t s) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(kReadThreads);
  cfg.stream = s;
  cfg.attrs = pdl ? attr : nullptr;
  cfg.numAttrs = pdl ? 1 : 0;
  if (pdl) {
    CK(cudaLaunchKernelEx(&cfg, jaxgemv::StreamReadKernel<true>, r.p, r.n16, salt, out));
  } else {
    CK(cudaLaunchKernelEx(&cfg, jaxgemv::StreamReadKernel<false>, r.p, r.n16, salt, out));
  }
}

cudaGraphExec_t Capture(const std::vector<Read>& reads, bool pdl, int blocks, uint32_t* out, cudaStream_t s,
                        cudaGraph_t* graph) {
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (const Read& r : reads) Launch(r, pdl, blocks, out, s);
  CK(cudaStreamEndCapture(s, graph));
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, *graph, 0));
  return exec;
}

// Every `group` consecutive reads captured into a graph of their own (1: each read alone, the way
// XLA records a custom call; 5: a layer's reads, the way it would record one call launching them
// all), chained as child nodes of one graph.
cudaGraphExec_t Nested(const std::vector<Read>& reads, bool pdl, int blocks, uint32_t* out, cudaStream_t s,
                       cudaGraph_t* parent, std::vector<cudaGraph_t>* children, size_t group) {
  CK(cudaGraphCreate(parent, 0));
  cudaGraphNode_t prev = nullptr;
  for (size_t i = 0; i < reads.size(); i += group) {
    cudaGraph_t child;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (size_t j = i; j < std::min(reads.size(), i + group); ++j) Launch(reads[j], pdl, blocks, out, s);
    CK(cudaStreamEndCapture(s, &child));
    children->push_back(child);
    cudaGraphNode_t node;
    CK(cudaGraphAddChildGraphNode(&node, *parent, prev ? &prev : nullptr, prev ? 1 : 0, child));
    prev = node;
  }
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, *parent, 0));
  return exec;
}

double StreamMicros(const std::vector<Read>& reads, bool pdl, int blocks, uint32_t* out, cudaStream_t s) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> us;
  for (int rep = 0; rep < 8; ++rep) {
    CK(cudaEventRecord(a, s));
    for (const Read& r : reads) Launch(r, pdl, blocks, out, s);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (rep > 0) us.push_back(ms * 1e3);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int layers = argc > 1 ? std::atoi(argv[1]) : 36;
  const int per_sm = argc > 2 ? std::atoi(argv[2]) : 2;
  const ProbeDevice d = CurrentProbeDevice();
  const int sms = d.sms;
  const int blocks = per_sm * sms;
  // NVFP4 bytes of an [N, K] weight: K / 2 of codes and K / 16 of scales per row.
  auto nvfp4 = [](int64_t n, int64_t k) { return n * (k / 2 + k / 16); };
  const int64_t layer_bytes[] = {nvfp4(6144, 4096), int64_t{1} << 20, nvfp4(4096, 4096), nvfp4(24576, 4096),
                                 nvfp4(4096, 12288)};
  const char* names[] = {"qkv", "attention", "o", "gate_up", "down"};
  int64_t step_bytes = 0;
  for (int64_t b : layer_bytes) step_bytes += (b + 255) / 256 * 256;
  char* pool;
  CK(cudaMalloc(&pool, step_bytes * layers));
  CK(cudaMemset(pool, 1, step_bytes * layers));
  uint32_t *out, *salt_buf;
  CK(cudaMalloc(&out, sizeof(uint32_t)));
  CK(cudaMalloc(&salt_buf, sizeof(uint32_t)));
  CK(cudaMemset(salt_buf, 0, sizeof(uint32_t)));
  salt = salt_buf;
  std::vector<Read> reads;
  int64_t at = 0;
  for (int l = 0; l < layers; ++l)
    for (int64_t b : layer_bytes) {
      reads.push_back({reinterpret_cast<const uint4*>(pool + at), b / 16});
      at += (b + 255) / 256 * 256;
    }
  std::printf("%s, %d SMs; %d layers x 5 reads (%.1f MB per layer), %d blocks of %d threads per read\n", d.name,
              sms, layers, step_bytes / 1e6, blocks, kReadThreads);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // Each size on its own: a graph of that read over every layer's buffer, per read (cold, but for
  // the attention's 1 MB copies, 36 MB together, which L2 may keep).
  double alone = 0;
  std::printf("%-10s %8s %12s\n", "read", "MB", "us (graph)");
  for (int i = 0; i < 5; ++i) {
    cudaGraph_t g;
    std::vector<Read> rot;
    for (int l = 0; l < layers; ++l) rot.push_back(reads[l * 5 + i]);
    cudaGraphExec_t exec = Capture(rot, false, blocks, out, s, &g);
    CK(cudaGraphLaunch(exec, s));
    const double us = MedianReplayMicros(exec, s, layers, 5, [] {});
    std::printf("%-10s %8.2f %12.2f\n", names[i], layer_bytes[i] / 1e6, us);
    alone += us;
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(g));
  }
  std::printf("a layer's five sizes, each timed among its own: %.2f us (the step %.1f us)\n\n", alone,
              alone * layers);

  // Printed as they come (a launch mode the driver refused would end the run with its error).
  std::printf("%-12s %10s %10s %10s %10s\n", "launches", "us/step", "us/layer", "vs graph", "TB/s");
  double base = 0;
  auto row = [&](const char* name, double us) {
    if (base == 0) base = us;
    std::printf("%-12s %10.1f %10.2f %+9.1f%% %10.2f\n", name, us, us / layers, 100.0 * (us / base - 1),
                step_bytes * layers / us / 1e6);
    std::fflush(stdout);
  };
  for (int pdl = 0; pdl < 2; ++pdl) {
    cudaGraph_t g;
    cudaGraphExec_t exec = Capture(reads, pdl, blocks, out, s, &g);
    CK(cudaGraphLaunch(exec, s));
    row(pdl ? "graph+pdl" : "graph", MedianReplayMicros(exec, s, 1, 7, [] {}));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(g));
  }
  row("stream", StreamMicros(reads, false, blocks, out, s));
  row("stream+pdl", StreamMicros(reads, true, blocks, out, s));
  for (int layer = 0; layer < 2; ++layer) {
    for (int pdl = 0; pdl < 2; ++pdl) {
      cudaGraph_t parent;
      std::vector<cudaGraph_t> children;
      cudaGraphExec_t exec = Nested(reads, pdl, blocks, out, s, &parent, &children, layer ? 5 : 1);
      CK(cudaGraphLaunch(exec, s));
      const char* labels[2][2] = {{"nested", "nested+pdl"}, {"layer", "layer+pdl"}};
      row(labels[layer][pdl], MedianReplayMicros(exec, s, 1, 7, [] {}));
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(parent));
      for (cudaGraph_t c : children) CK(cudaGraphDestroy(c));
    }
  }
  CK(cudaFree(pool));
  CK(cudaFree(out));
  CK(cudaFree(salt_buf));
  CK(cudaStreamDestroy(s));
  return 0;
}
