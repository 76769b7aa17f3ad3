#pragma once
// Programmatic dependent launch (PTX ISA, parallel synchronization instructions: griddepcontrol), sm_90.
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while the kernel before it in
// the stream still runs; it must wait before it touches anything that kernel writes or reads. Both are no-ops
// where the launch made no such dependence (and below sm_90, where the instruction does not exist).

namespace nmkit::ptx {

// Waits until the grids this one depends on have completed and their memory operations are visible.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the dependent grid be scheduled once every CTA of this one has said so (or exited). It says nothing about
// this grid's writes: the dependent's grid_dependency_wait still waits for this grid to complete.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

}  // namespace nmkit::ptx
