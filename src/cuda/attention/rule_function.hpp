#pragma once
// The GPU pruning rules' qualifier: inlined host-and-device functions under nvcc, plain inline ones for the host
// compiler alone, so that the CPU tests hold the GPU rules against the oracle's (keep_two_of_four.cuh,
// keep_two_of_four_x2.cuh).
#if defined(__CUDACC__)
#define NMKIT_RULE_FUNCTION __host__ __device__ __forceinline__
#else
#define NMKIT_RULE_FUNCTION inline
#endif
