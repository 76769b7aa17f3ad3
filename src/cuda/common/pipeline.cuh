#pragma once
// The stage ring of the Hopper kernels: kStages shared-memory stages, each guarded by two mbarriers. full(s)
// completes when stage s holds its step (the copy engine's transaction bytes and any producer arrivals); empty(s)
// completes when every consumer thread has released it. Producer and consumers walk the ring in the same order,
// each with its own position (ProducerRing, RingPosition).
#include <cstdint>

#include "../ptx/mbarrier.cuh"
#include "ring.cuh"

namespace nmkit::cuda {

template <int kStages>
class StagePipeline {
 public:
  static constexpr int kBarrierBytes = 2 * kStages * static_cast<int>(sizeof(uint64_t));

  // The barriers live in shared memory at `barriers`: kStages full ones, then kStages empty ones.
  __device__ explicit StagePipeline(uint64_t* barriers) : full_(barriers), empty_(barriers + kStages) {}

  // One thread, before the CTA's first barrier: the arrivals that complete a stage's full and empty phases.
  __device__ void init(uint32_t full_arrivals, uint32_t empty_arrivals) const {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&full_[s], full_arrivals);
      ptx::mbarrier_init(&empty_[s], empty_arrivals);
    }
  }

  __device__ uint64_t* full(int stage) const { return &full_[stage]; }
  __device__ uint64_t* empty(int stage) const { return &empty_[stage]; }

  // Consumers: wait until the stage at `at` holds its step.
  __device__ void wait_full(const RingPosition<kStages>& at) const { ptx::mbarrier_wait(&full_[at.stage], at.phase); }
  // Producer: wait until the consumers released the stage at `at` from its previous pass.
  __device__ void wait_empty(const RingPosition<kStages>& at) const {
    ptx::mbarrier_wait(&empty_[at.stage], at.phase ^ 1u);
  }
  // Producer: the stage's copies will deliver `bytes` (this thread's arrival included).
  __device__ void expect_bytes(int stage, uint32_t bytes) const {
    ptx::mbarrier_arrive_expect_tx(&full_[stage], bytes);
  }
  // Producer thread: its own writes of the stage are done.
  __device__ void post(int stage) const { ptx::mbarrier_arrive(&full_[stage]); }
  // Consumer thread: its reads of the stage are done.
  __device__ void release(int stage) const { ptx::mbarrier_arrive(&empty_[stage]); }

 private:
  uint64_t* full_;
  uint64_t* empty_;
};

// The producer's walk over the ring: the first kStages steps find their stages free, every later one waits for
// the consumers to release its stage. The position runs on across a persistent CTA's tiles.
template <int kStages>
struct ProducerRing {
  RingPosition<kStages> at;
  int posted = 0;  // saturates at kStages

  __device__ __forceinline__ void acquire(const StagePipeline<kStages>& pipeline) {
    if (posted < kStages) {
      ++posted;
      return;
    }
    pipeline.wait_empty(at);
  }
  __device__ __forceinline__ void advance() { at.advance(); }
};

}  // namespace nmkit::cuda
