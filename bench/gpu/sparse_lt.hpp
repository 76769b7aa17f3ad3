#pragma once
// The cuSPARSELt 2:4 baseline of the GPU benchmark suites (built where cuSPARSELt was found: NMKIT_HAVE_CUSPARSELT).
#if defined(NMKIT_HAVE_CUSPARSELT)
#include <cusparseLt.h>

#include <algorithm>
#include <vector>

#include "bench_common.hpp"

namespace nmkit::bench {

struct SparseLtTypes {
  cudaDataType ab;  // A and B
  cudaDataType d;   // C and D
  cusparseComputeType compute;
};

#define CHECK_CUSPARSELT(x) nmkit_bench_check_status(static_cast<int>(x), #x)
// cuSPARSELt 2:4: A structured row-major, B and D col-major; compressed A per set, then optionally searched. The
// operand types: 16-bit A, B and D (`dtype`), or 8-bit A and B with a 16-bit D (SparseLtTypes).
// The compressed weights are made once, before any search: compressing again after cusparseLtMatmulSearch made
// the next cusparseLtMatmul fault (H200, cuSPARSELt 0.8), so the plan is not to be separated from them.
class SparseLt {
 public:
  SparseLt(cusparseLtHandle_t* h, const Shape& s, DType dtype, const std::vector<const void*>& dense_w,
           cudaStream_t stream)
      : SparseLt(h, s, {cuda_type(dtype), cuda_type(dtype), CUSPARSE_COMPUTE_32F}, dense_w, stream) {}
  SparseLt(cusparseLtHandle_t* h, const Shape& s, const SparseLtTypes& types, const std::vector<const void*>& dense_w,
           cudaStream_t stream)
      : h_(h), stream_(stream) {
    CHECK_CUSPARSELT(cusparseLtStructuredDescriptorInit(h_, &a_, s.r, s.k, s.k, 16, types.ab, CUSPARSE_ORDER_ROW,
                                                        CUSPARSELT_SPARSITY_50_PERCENT));
    CHECK_CUSPARSELT(cusparseLtDenseDescriptorInit(h_, &b_, s.k, s.c, s.k, 16, types.ab, CUSPARSE_ORDER_COL));
    CHECK_CUSPARSELT(cusparseLtDenseDescriptorInit(h_, &d_, s.r, s.c, s.r, 16, types.d, CUSPARSE_ORDER_COL));
    CHECK_CUSPARSELT(cusparseLtMatmulDescriptorInit(h_, &mm_, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                                    CUSPARSE_OPERATION_NON_TRANSPOSE, &a_, &b_, &d_, &d_,
                                                    types.compute));
    CHECK_CUSPARSELT(cusparseLtMatmulAlgSelectionInit(h_, &alg_, &mm_, CUSPARSELT_MATMUL_ALG_DEFAULT));
    CHECK_CUSPARSELT(cusparseLtMatmulPlanInit(h_, &plan_, &mm_, &alg_));
    std::size_t compressed = 0, buffer = 0;
    CHECK_CUSPARSELT(cusparseLtSpMMACompressedSize(h_, &plan_, &compressed, &buffer));
    DeviceArray scratch(buffer);
    for (const void* w : dense_w) {
      compressed_.emplace_back(compressed);
      CHECK_CUSPARSELT(cusparseLtSpMMACompress(h_, &plan_, w, compressed_.back().ptr, scratch.ptr, stream_));
    }
    NMKIT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    size_workspace();
    // Split-K configurations tried by the search need workspace of their own: offer one that holds a few fp32
    // partial outputs, searching again if the chosen configuration asks for more than the search had.
    search_workspace_bytes_ = std::max(workspace_bytes_, std::size_t{4} * sizeof(float) * s.r * s.c);
  }
  void search(const void* b, void* d) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      DeviceArray workspace(search_workspace_bytes_);
      const float alpha = 1.0f, beta = 0.0f;
      CHECK_CUSPARSELT(
          cusparseLtMatmulSearch(h_, &plan_, &alpha, compressed_[0].ptr, b, &beta, d, d, workspace.ptr, &stream_, 1));
      NMKIT_CUDA_CHECK(cudaStreamSynchronize(stream_));
      size_workspace();
      if (workspace_bytes_ <= search_workspace_bytes_) return;
      search_workspace_bytes_ = workspace_bytes_;
    }
  }
  void run(int set, const void* b, void* d) {
    const float alpha = 1.0f, beta = 0.0f;
    CHECK_CUSPARSELT(
        cusparseLtMatmul(h_, &plan_, &alpha, compressed_[set].ptr, b, &beta, d, d, workspace_.ptr, &stream_, 1));
  }
  int config_id() {
    int id = -1;
    CHECK_CUSPARSELT(cusparseLtMatmulAlgGetAttribute(h_, &alg_, CUSPARSELT_MATMUL_ALG_CONFIG_ID, &id, sizeof id));
    return id;
  }
  ~SparseLt() {
    cusparseLtMatmulPlanDestroy(&plan_);
    cusparseLtMatmulAlgSelectionDestroy(&alg_);
    cusparseLtMatDescriptorDestroy(&a_), cusparseLtMatDescriptorDestroy(&b_), cusparseLtMatDescriptorDestroy(&d_);
  }

 private:
  void size_workspace() {
    CHECK_CUSPARSELT(cusparseLtMatmulGetWorkspace(h_, &plan_, &workspace_bytes_));
    workspace_ = DeviceArray(workspace_bytes_);
  }
  cusparseLtHandle_t* h_;
  cudaStream_t stream_{};
  cusparseLtMatDescriptor_t a_{}, b_{}, d_{};
  cusparseLtMatmulDescriptor_t mm_{};
  cusparseLtMatmulAlgSelection_t alg_{};
  cusparseLtMatmulPlan_t plan_{};
  std::vector<DeviceArray> compressed_;
  std::size_t workspace_bytes_ = 0, search_workspace_bytes_ = 0;
  DeviceArray workspace_;
};

}  // namespace nmkit::bench
#endif
