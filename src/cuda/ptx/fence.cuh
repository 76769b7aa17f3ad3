#pragma once
// Memory fences (PTX ISA §9.7.13.4, "Parallel Synchronization and Communication Instructions: membar / fence").
namespace nmkit::ptx {

// fence.acq_rel.gpu: with a relaxed atomic after it, a release of this thread's earlier writes (and, through a
// barrier before it, its CTA's or warp's); after an atomic, an acquire of what that atomic observed. Lighter than
// __threadfence(), which is fence.sc.gpu (a sequentially consistent fence, MEMBAR.SC in SASS). sm_70 and later.
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }

}  // namespace nmkit::ptx
