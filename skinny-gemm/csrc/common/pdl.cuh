// generated from common/csrc/pdl.cuh by `fused-llm sync`, do not edit
// Programmatic dependent launch (PDL), both sides of it (CUDA sm90+; nothing on sm80 code or
// under HIP).
//
// The primary's side, pdl_launch_dependents: a kernel launched after this one with
// cudaLaunchAttributeProgrammaticStreamSerialization (the small-M kernel of machete-w4a16) may
// start once every block of this one has executed griddepcontrol.launch_dependents, instead of
// once they have all exited. Such a dependent reads this kernel's outputs only after its own
// griddepcontrol.wait (which waits for this whole grid and its memory), so signalling at the very
// start is safe for it, and means nothing to a dependent launched the ordinary way. What the
// dependent gains is the time this kernel runs: it launches its blocks and, where its inputs
// allow, starts reading them (a layer's weights) in that time. The blocks of a later wave of this
// kernel have not signalled yet, so a dependent never takes the place of this kernel's own
// unlaunched blocks.
//
// The dependent's side, pdl_wait_primaries: griddepcontrol.wait, which returns once the kernel
// this one was launched after has completed and its writes are visible; before it a dependent
// reads nothing that kernel may have written.
//
// Measured (H100, 2026-11-25): a 32-layer chain of the 8B 4-bit GEMMs with these norms and
// activation between them, the same chain built with and without the signal (one process each,
// one after the other: not an alternated A/B), 1-3% faster with it: 1878 -> 1858 us at M = 1
// (TMA ring), 2265 -> 2204 (register kernel), 2348 -> 2284 at M = 4. With it, in a norm -> GEMM pair
// the GEMM's kernel record starts 0.6 us before the norm's ends (the profiler's timeline).
#pragma once

namespace fused_llm {

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait_primaries() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace fused_llm
