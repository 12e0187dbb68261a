// Launch-shape sweep for swiglu-fp8's elementwise kernel at decode sizes (static e4m3fn, bf16,
// silu). Includes the package's kernel source, so it times exactly the shipped kernel with
// launch configs the dispatcher would not choose. Not part of any package.
//   nvcc -O3 -std=c++17 -arch=sm_90a -I swiglu-fp8/csrc tools/swiglu_decode_tune.cu -o /tmp/tune
// Method as fused_llm.bench: CUDA-graph replay of N launches; "cold": each launch reads its own
// input slot, slots spanning 256 MiB (> 4x L2); "hot": one slot, resident in L2 (the decode case
// where x was just written by the gate_up GEMM).
#include <algorithm>
#include <string>
#include <cstdio>
#include <vector>

#include "swiglu_fp8_gpu.cu"

using namespace fused_llm::swiglu_fp8;

#define CK(x)                                                                     \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));      \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

__global__ void null_kernel(float* p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) p[0] += 1.0f;
}

// The memory pattern of the static-fp8 kernel (ITEMS = 1) without its math: the floor its
// loads and stores set, to tell how much of a decode call the activation chain costs.
__global__ void pattern_kernel(const KernelArgs a) {
  const int vi = blockIdx.y * blockDim.x + threadIdx.x;
  if (vi >= a.nvec) return;
  const uint4* gate = static_cast<const uint4*>(a.x) + blockIdx.x * (a.x_stride / 8);
  const uint4* up = gate + a.d / 8;
  const uint4 g = gate[vi], u = up[vi];
  uint2* out = static_cast<uint2*>(a.out) + blockIdx.x * (a.out_stride / 8);
  out[vi] = make_uint2(g.x ^ u.x ^ g.z ^ u.z, g.y ^ u.y ^ g.w ^ u.w);
}

struct Pool {
  char* x = nullptr;
  char* out = nullptr;
  float* scale = nullptr;
  size_t x_slot = 0, out_slot = 0;
  int slots = 0;
};

template <int ITEMS>
cudaError_t launch(const KernelArgs& a, const EwConfig& c, cudaStream_t s) {
  return launch_ew<Bf16Tag, ITEMS, kQStatic, kFmtFn>(a, c, s);
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

int main(int argc, char** argv) {
  // "scale": only the decode cases, also with a per-call (cold) static-scale tensor, as the
  // Python harness has (every input set owns its scale).
  const bool scale_mode = argc > 1 && std::string(argv[1]) == "scale";
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
  // 16384 cold scales, one per 4 KiB (64 MiB): a different line and often page for each call.
  float* cold_scales;
  CK(cudaMalloc(&cold_scales, size_t(64) << 20));
  {
    std::vector<float> h((size_t(64) << 20) / 4, 1.0f);
    CK(cudaMemcpy(cold_scales, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  }
  float* dummy;
  CK(cudaMalloc(&dummy, 4));
  CK(cudaMemset(dummy, 0, 4));

  const double floor_us = time_graph(4096, [&](int) { null_kernel<<<1, 32, 0, s>>>(dummy); }, s);
  std::printf("null kernel floor: %.3f us\n", floor_us);
  std::printf("%6s %5s %7s %5s %6s %9s %9s %s\n", "d", "rows", "threads", "items", "chunks", "cold_us",
              scale_mode ? "cold_scale_us" : "hot_us", "");

  const int ds[] = {4096, 8192, 14336, 28672};
  const int rowss[] = {1, 4, 16, 64, 128};
  for (int d : ds) {
    for (int rows : rowss) {
      if (scale_mode && rows != 1 && rows != 16) continue;
      const int64_t nvec = d / 8;
      const size_t xb = size_t(rows) * 2 * d * 2, ob = size_t(rows) * d;
      const size_t xslot = (xb + 4095) / 4096 * 4096, oslot = (ob + 4095) / 4096 * 4096;
      const int slots = static_cast<int>(std::min<size_t>(kPool / xslot, 16384));
      const int n = std::max(slots, 2048);
      KernelArgs a{};
      a.x_stride = 2 * d;
      a.out_stride = d;
      a.rows = rows;
      a.d = d;
      a.static_scale = scale;
      a.fp8_max = 448.0f;
      a.min_scale = kMinScaleFactor / 448.0f;
      a.act = kActSilu;
      a.nvec = static_cast<int>(nvec);
      const EwConfig def = choose_ew_config(nvec, rows, num_sms);
      if (scale_mode) {
        const dim3 grid(rows, (nvec + 127) / 128);
        const double pat = time_graph(
            n,
            [&](int i) {
              KernelArgs ai = a;
              ai.x = xbuf + (i % slots) * xslot;
              ai.out = obuf + ((i % slots) * oslot) % (kPool / 4);
              pattern_kernel<<<grid, 128, 0, s>>>(ai);
            },
            s);
        std::printf("%6d %5d pattern (loads + stores only, 128 threads): %.3f us\n", d, rows, pat);
      }
      for (int items = 1; items <= 2; ++items) {
        for (int threads = 32; threads <= 512; threads *= 2) {
          if (scale_mode && (items != 1 || (threads != 32 && threads != 128))) continue;
          EwConfig c;
          c.ok = true;
          c.threads = threads;
          c.items = items;
          c.chunks = (nvec + threads * items - 1) / (threads * items);
          c.rows_per_block = 1;
          auto run = [&](bool cold, bool cold_scale) {
            return time_graph(
                n,
                [&](int i) {
                  KernelArgs ai = a;
                  const int slot = cold ? i % slots : 0;
                  ai.x = xbuf + slot * xslot;
                  ai.out = obuf + (slot * oslot) % (kPool / 4);
                  if (cold_scale) ai.static_scale = cold_scales + size_t(i % 16384) * 1024;
                  CK(items == 1 ? launch<1>(ai, c, s) : launch<2>(ai, c, s));
                },
                s);
          };
          const double cold = run(true, false), hot = scale_mode ? run(true, true) : run(false, false);
          const bool is_def = def.threads == threads && def.items == items;
          std::printf("%6d %5d %7d %5d %6lld %9.3f %9.3f %s\n", d, rows, threads, items,
                      static_cast<long long>(c.chunks), cold, hot, is_def ? "<- default" : "");
        }
      }
    }
  }
  return 0;
}
