#pragma once
// The hardware named barriers (bar.sync id, threads) of the Hopper kernels, one id per role; id 0 is
// __syncthreads'. Kernels that share epilogue code share these ids, so they are defined once here.
namespace nmkit::cuda {

enum class NamedBarrier : int {
  consumers = 1,       // the consumer warpgroups together (epilogue: the staged tile is complete)
  stages_drained = 2,  // the whole CTA: a gathering producer's copies have landed, the stages may be reused
  warpgroup = 3,       // + w: consumer warpgroup w alone (its epilogue's output buffers)
  gemm_turn = 6,       // + w: attention, consumer warpgroup w may issue its wgmma groups (Turns)
};

template <NamedBarrier kBarrier, int kThreads>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(static_cast<int>(kBarrier)), "n"(kThreads) : "memory");
}

template <NamedBarrier kBarrier, int kThreads>
__device__ __forceinline__ void named_barrier_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(static_cast<int>(kBarrier)), "n"(kThreads) : "memory");
}

// Consumer warpgroup `warpgroup`'s own barrier (128 threads).
__device__ __forceinline__ void warpgroup_barrier_sync(int warpgroup) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(static_cast<int>(NamedBarrier::warpgroup) + warpgroup) : "memory");
}

// Two consumer warpgroups taking turns at a section (256 threads): warpgroup w waits on barrier kFirst + w, which
// the other warpgroup's 128 threads arrive on as they leave the section. Warpgroup 1 passes once before the first
// turn (warpgroup 0 goes first), each passes after each of its turns, and warpgroup 0 takes one wait more after the
// last (finish), so that every arrival is waited for and none is pending at exit.
template <NamedBarrier kFirst>
struct Turns {
  static __device__ __forceinline__ void wait(int warpgroup) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(static_cast<int>(kFirst) + warpgroup) : "memory");
  }
  static __device__ __forceinline__ void pass(int warpgroup) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(static_cast<int>(kFirst) + 1 - warpgroup) : "memory");
  }
  static __device__ __forceinline__ void start(int warpgroup) {
    if (warpgroup == 1) pass(warpgroup);
  }
  static __device__ __forceinline__ void finish(int warpgroup) {
    if (warpgroup == 0) wait(warpgroup);
  }
};

// Turns' interface for warpgroups that issue whenever they are ready.
struct NoTurns {
  static __device__ __forceinline__ void wait(int) {}
  static __device__ __forceinline__ void pass(int) {}
  static __device__ __forceinline__ void start(int) {}
  static __device__ __forceinline__ void finish(int) {}
};

}  // namespace nmkit::cuda
