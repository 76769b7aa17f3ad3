// pack_vnm: the condensed 2:4 matrix and the B gather table of a V:N:M weight, round trip and rejections.
#include <gtest/gtest.h>

#include "nmkit/error.hpp"
#include "nmkit/gpu/vnm_spmm.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "test_util.hpp"

namespace nmkit::gpu {
namespace {

VnmMatrix random_vnm(int64_t r, int64_t k, int v, int n, int m, DType dtype, uint32_t seed) {
  const DenseMatrix w = test::random_matrix(r, k, dtype, seed);
  return compress_vnm(w, prune_vnm_magnitude(w, v, n, m), v, n, m);
}

TEST(VnmPack, RoundTripsWithTails) {
  for (DType dtype : {DType::f16, DType::bf16})
    for (int v : {32, 64, 128, 256})
      for (int n : {1, 2})
        for (int m : {4, 5, 8, 10, 16, 100})
          for (auto [r, k] : {std::pair<int64_t, int64_t>{1, 5}, {70, 64}, {130, 333}}) {
            const VnmMatrix a = random_vnm(r, k, v, n, m, dtype, static_cast<uint32_t>(r * k + v + m));
            for (VnmForm form : {VnmForm::automatic, VnmForm::condensed, VnmForm::full_2_4}) {
              if (form == VnmForm::full_2_4 && m % 4 != 0) continue;  // rejected, tested below
              const Layout b_layout = (r + m) % 2 ? Layout::row_major : Layout::col_major;
              const PackedVnm p = pack_vnm(a, form, b_layout);
              if (form == VnmForm::automatic)
                EXPECT_NE(p.form, VnmForm::automatic);  // which one: the explicit table of FormsFollowMVAndTheLayoutOfB
              else
                EXPECT_EQ(p.form, form);
              EXPECT_EQ(p.condensed.cols, p.form == VnmForm::full_2_4 ? k : 4 * ceil_div(k, m));
              EXPECT_EQ(p.gather.empty(), p.form == VnmForm::full_2_4);
              test::expect_same_matrix(decompress(unpack_vnm(p)), decompress(a));
            }
          }
}

TEST(VnmPack, GatherTableNamesTheSelectedRowsOfB) {
  // 2 row blocks of V = 64 in one 128-row tile; K = 10, M = 8: group 1 covers columns 8, 9 only.
  DenseMatrix w = DenseMatrix::zeros(128, 10, DType::f16);
  w.set(0, 1, 1.0f), w.set(0, 6, 2.0f), w.set(70, 9, 3.0f);
  const VnmMatrix a = compress_vnm(w, 64, 2, 8);
  const PackedVnm p = pack_vnm(a, VnmForm::condensed);
  ASSERT_EQ(p.gather_row_blocks(), 2);
  const int64_t stride = p.condensed.cols_padded;
  for (int s = 0; s < 4; ++s) {
    const int32_t first = p.gather[static_cast<std::size_t>(s)];
    EXPECT_EQ(first, int32_t{a.column_loc[static_cast<std::size_t>(s)]}) << s;  // group 0: columns 0..7
  }
  // Row block 1, group 1: column 9 is selected; slots past K = 10 read no row of B.
  int named = 0, none = 0;
  for (int s = 0; s < 4; ++s) {
    const int32_t k = p.gather[static_cast<std::size_t>(stride + 4 + s)];
    named += k == 9, none += k == kNoBRow;
    EXPECT_TRUE(k == kNoBRow || (k >= 8 && k < 10)) << k;
  }
  EXPECT_EQ(named, 1);
  EXPECT_GE(none, 2);
  // The K padding of the condensed matrix reads nothing.
  for (int64_t c = p.condensed.cols; c < stride; ++c) EXPECT_EQ(p.gather[static_cast<std::size_t>(c)], kNoBRow);
}

TEST(VnmPack, FormsFollowMVAndTheLayoutOfB) {
  constexpr Layout kRow = Layout::row_major, kCol = Layout::col_major;
  // B col-major (x[T, K]): the full 2:4 form wherever M allows it.
  for (int m : {4, 8, 16, 100}) EXPECT_EQ(resolve_vnm_form(VnmForm::automatic, 128, m, kCol), VnmForm::full_2_4) << m;
  EXPECT_EQ(resolve_vnm_form(VnmForm::automatic, 128, 10, kCol), VnmForm::condensed);
  // B row-major: the gather wins from M = 8 with V = 128, from M = 16 with V = 64; V = 32 gathers only on
  // the portable kernel.
  EXPECT_EQ(resolve_vnm_form(VnmForm::automatic, 128, 4, kRow), VnmForm::full_2_4);
  EXPECT_EQ(resolve_vnm_form(VnmForm::automatic, 128, 8, kRow), VnmForm::condensed);
  EXPECT_EQ(resolve_vnm_form(VnmForm::automatic, 256, 12, kRow), VnmForm::condensed);
  EXPECT_EQ(resolve_vnm_form(VnmForm::automatic, 64, 8, kRow), VnmForm::full_2_4);
  EXPECT_EQ(resolve_vnm_form(VnmForm::automatic, 64, 16, kRow), VnmForm::condensed);
  EXPECT_EQ(resolve_vnm_form(VnmForm::automatic, 32, 16, kRow), VnmForm::full_2_4);
  EXPECT_EQ(resolve_vnm_form(VnmForm::automatic, 48, 16, kRow), VnmForm::full_2_4);  // no gathering kernel for V = 48
  EXPECT_EQ(resolve_vnm_form(VnmForm::automatic, 64, 7, kRow), VnmForm::condensed);
  // Asked-for forms stay as asked.
  EXPECT_EQ(resolve_vnm_form(VnmForm::condensed, 128, 8, kCol), VnmForm::condensed);
  EXPECT_EQ(resolve_vnm_form(VnmForm::full_2_4, 128, 16, kRow), VnmForm::full_2_4);
  EXPECT_NMKIT_ERROR(resolve_vnm_form(VnmForm::full_2_4, 128, 10), ErrorCode::invalid_argument, "M % 4 == 0");
  EXPECT_NMKIT_ERROR(pack_vnm(random_vnm(64, 40, 64, 2, 10, DType::f16, 2), VnmForm::full_2_4),
                     ErrorCode::invalid_argument, "M=10");
}

TEST(VnmPack, RejectsMalformedColumnLocAndUnsupportedV) {
  const VnmMatrix good = random_vnm(64, 32, 64, 2, 8, DType::f16, 7);
  VnmMatrix out_of_range = good;
  out_of_range.column_loc[3] = 8;
  EXPECT_NMKIT_ERROR(pack_vnm(out_of_range), ErrorCode::pattern_violation, ">= M=8");
  VnmMatrix unsorted = good;
  std::swap(unsorted.column_loc[0], unsorted.column_loc[1]);
  EXPECT_NMKIT_ERROR(pack_vnm(unsorted), ErrorCode::pattern_violation, "not strictly ascending");
  VnmMatrix duplicate = good;
  duplicate.column_loc[1] = duplicate.column_loc[0];
  EXPECT_NMKIT_ERROR(pack_vnm(duplicate), ErrorCode::pattern_violation, "duplicate");
  EXPECT_NMKIT_ERROR(pack_vnm(random_vnm(64, 40, 48, 2, 10, DType::f16, 8)), ErrorCode::unsupported, "V=48");
  EXPECT_EQ(pack_vnm(random_vnm(64, 32, 48, 2, 8, DType::f16, 8)).form, VnmForm::full_2_4);  // any V as 2:4
  const DenseMatrix w32 = test::random_matrix(64, 32, DType::f32, 9);
  EXPECT_NMKIT_ERROR(pack_vnm(compress_vnm(w32, prune_vnm_magnitude(w32, 64, 2, 8), 64, 2, 8)), ErrorCode::unsupported,
                     "f16 or bf16");
}

}  // namespace
}  // namespace nmkit::gpu
