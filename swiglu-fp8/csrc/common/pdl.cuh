// generated from common/csrc/pdl.cuh by `fused-llm sync`, do not edit
// Programmatic dependent launch (PDL), the primary kernel's side (CUDA sm90+; nothing on sm80
// code or under HIP).
//
// A kernel launched after this one with cudaLaunchAttributeProgrammaticStreamSerialization (the
// small-M kernel of machete-w4a16) may start once every block of this one has executed
// griddepcontrol.launch_dependents, instead of once they have all exited. Such a dependent reads
// this kernel's outputs only after its own griddepcontrol.wait (which waits for this whole grid
// and its memory), so signalling at the very start is safe for it, and means nothing to a
// dependent launched the ordinary way. What the dependent gains is the time this kernel runs:
// it launches its blocks and, where its inputs allow, starts reading them (a layer's weights) in
// that time. The blocks of a later wave of this kernel have not signalled yet, so a dependent
// never takes the place of this kernel's own unlaunched blocks.
#pragma once

namespace fused_llm {

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace fused_llm
