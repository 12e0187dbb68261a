// Launch-shape sweep for swiglu-fp8's elementwise kernel at decode and small-prefill sizes
// (static e4m3fn, bf16, silu). Includes the package's kernel source, so it times exactly the
// shipped kernel with launch configs the dispatcher would not choose. Not part of any package.
//   nvcc -O3 -std=c++17 -arch=sm_90a -I swiglu-fp8/csrc tools/swiglu_decode_tune.cu -o /tmp/tune
// Method as fused_llm.bench: CUDA-graph replay of N launches, each reading its own input slot,
// the slots spanning 256 MiB (> 4x L2).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "swiglu_fp8_gpu.cu"

using namespace fused_llm;  // the helpers stamped from common/ (csrc/common/)
using namespace fused_llm::swiglu_fp8;

#define CK(x)                                                                \
  do {                                                                       \
    cudaError_t e_ = (x);                                                    \
    if (e_ != cudaSuccess) {                                                 \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

__global__ void null_kernel(float* p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) p[0] += 1.0f;
}

// Median us per launch over 7 replays of a graph of n launches.
template <class F>
double time_graph(int n, F enqueue, cudaStream_t s) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < n; ++i) enqueue(i);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(ge, s));  // warm-up
  std::vector<float> t;
  for (int r = 0; r < 7; ++r) {
    CK(cudaEventRecord(e0, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1000.0f / n);
  }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return t[t.size() / 2];
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int num_sms = 0;
  CK(sm_count(&num_sms));
  const size_t kPool = size_t(256) << 20;
  char* xbuf;
  char* obuf;
  float* scale;
  CK(cudaMalloc(&xbuf, kPool));
  CK(cudaMalloc(&obuf, kPool / 4 + (1 << 20)));
  CK(cudaMalloc(&scale, 4));
  CK(cudaMemset(xbuf, 0x3c, kPool));
  const float one = 1.0f;
  CK(cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice));
  float* dummy;
  CK(cudaMalloc(&dummy, 4));
  CK(cudaMemset(dummy, 0, 4));

  const double floor_us = time_graph(4096, [&](int) { null_kernel<<<1, 32, 0, s>>>(dummy); }, s);
  std::printf("null kernel floor: %.3f us\n", floor_us);
  std::printf("%6s %5s %3s %7s %6s %9s\n", "d", "rows", "VB", "threads", "chunks", "us");

  const int ds[] = {4096, 8192, 14336, 28672};
  const int rowss[] = {1, 4, 16, 32, 64, 128, 256};
  for (int d : ds) {
    for (int rows : rowss) {
      const size_t xb = size_t(rows) * 2 * d * 2, ob = size_t(rows) * d;
      const size_t xslot = (xb + 4095) / 4096 * 4096, oslot = (ob + 4095) / 4096 * 4096;
      const int slots = static_cast<int>(std::min<size_t>(kPool / xslot, 16384));
      const int n = std::max(slots, 2048);
      const int64_t nvec16 = d / 8;
      if (rows * nvec16 > int64_t(num_sms) * kEwSmallVectorsPerSm) continue;
      const bool def_half = rows * nvec16 <= int64_t(num_sms) * kEwHalfVectorsPerSm;
      for (int vb : {16, 8}) {
        const int64_t nvec = d / (vb / 2);
        const EwConfig def = choose_ew_config(nvec, rows, num_sms, true);
        for (int threads : {64, 128, 256}) {
          EwConfig c;
          c.ok = true;
          c.threads = threads;
          c.items = 1;
          c.chunks = (nvec + threads - 1) / threads;
          c.rows_per_block = 1;
          KernelArgs a{};
          a.x_stride = 2 * d;
          a.out_stride = d;
          a.rows = rows;
          a.d = d;
          a.static_scale = scale;
          a.fp8_max = 448.0f;
          a.min_scale = kMinScaleFactor / 448.0f;
          a.act = kActSilu;
          a.gated = 1;
          a.nvec = static_cast<int>(nvec);
          const double us = time_graph(
              n,
              [&](int i) {
                KernelArgs ai = a;
                const int slot = i % slots;
                ai.x = xbuf + slot * xslot;
                ai.out = obuf + (slot * oslot) % (kPool / 4);
                const cudaError_t e = vb == 16 ? launch_ew<Bf16Tag, 1, kQStatic, kFmtFn, true, 16>(ai, c, s)
                                               : launch_ew<Bf16Tag, 1, kQStatic, kFmtFn, true, 8>(ai, c, s);
                CK(e);
              },
              s);
          const bool is_def = (vb == 8) == def_half && def.threads == threads;
          std::printf("%6d %5d %3d %7d %6lld %9.3f %s\n", d, rows, vb, threads,
                      static_cast<long long>(c.chunks), us, is_def ? "<- default" : "");
        }
      }
    }
  }
  return 0;
}
