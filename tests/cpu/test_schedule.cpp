// The gradual structure-decay schedule: the steps, and the invariant that what was pruned stays pruned.
#include <gtest/gtest.h>

#include "nmkit/error.hpp"
#include "nmkit/prune/schedule.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

std::vector<std::string> names(const std::vector<ScheduleStep>& steps) {
  std::vector<std::string> out;
  for (const auto& s : steps) out.push_back(to_string(s));
  return out;
}

TEST(Schedule, StepsFallTowardsTheTarget) {
  EXPECT_EQ(names(structure_decay_schedule(parse_format_spec("vnm:64:2:8"), 4)),
            (std::vector<std::string>{"vnm:64:*:8/7cols", "vnm:64:*:8/6cols", "vnm:64:*:8/4cols", "vnm:64:2:8"}));
  EXPECT_EQ(names(structure_decay_schedule(parse_format_spec("vnm:64:2:8"), 1)),
            (std::vector<std::string>{"vnm:64:2:8"}));
  EXPECT_EQ(names(structure_decay_schedule(parse_format_spec("2:8"), 4)),
            (std::vector<std::string>{"7:8", "5:8", "4:8", "2:8"}));
  EXPECT_EQ(names(structure_decay_schedule(parse_format_spec("tile:16x16:0.25"), 3)),
            (std::vector<std::string>{"tile:16x16:0.75", "tile:16x16:0.5", "tile:16x16:0.25"}));
  EXPECT_NMKIT_ERROR(structure_decay_schedule(parse_format_spec("2:4"), 0), ErrorCode::invalid_argument,
                     "at least one step");
  EXPECT_NMKIT_ERROR(structure_decay_schedule(parse_format_spec("2:4"), 3, 4), ErrorCode::invalid_argument, "N0");
}

TEST(Schedule, WhatWasPrunedStaysPruned) {
  const DenseMatrix w = test::random_matrix(64, 96, DType::f32, 9);
  LayerStatistics stats{96, 200, std::vector<double>(96 * 96, 0.0)};
  const std::vector<float> x = test::random_nonzero(200 * 96, 10);
  for (int t = 0; t < 200; ++t)
    for (int i = 0; i < 96; ++i)
      for (int j = 0; j < 96; ++j) stats.xtx[i * 96 + j] += double{x[t * 96 + i]} * x[t * 96 + j];
  for (const char* target : {"vnm:16:2:8", "2:8", "tile:8x8:0.3"})
    for (PruneMethod method : {PruneMethod::magnitude, PruneMethod::wanda, PruneMethod::obs}) {
      const auto schedule = structure_decay_schedule(parse_format_spec(target), 4);
      const GradualResult g = prune_gradual(w, schedule, method, &stats);
      ASSERT_EQ(g.masks.size(), schedule.size());
      for (std::size_t s = 0; s + 1 < schedule.size(); ++s)
        if (schedule[s].block_columns > 0)  // every row of a V x M block keeps the same columns
          for (int64_t r = 0; r < w.rows; ++r)
            for (int64_t c = 0; c < w.cols; ++c)
              ASSERT_EQ(g.masks[s].at(r, c), g.masks[s].at(r / 16 * 16, c)) << target << " step " << s;
      for (std::size_t s = 1; s < g.masks.size(); ++s)
        for (std::size_t i = 0; i < g.masks[s].keep.size(); ++i)
          ASSERT_LE(g.masks[s].keep[i], g.masks[s - 1].keep[i])
              << target << " " << prune_method_name(method) << ": step " << s << " revived entry " << i;
      EXPECT_NO_THROW(validate(g.final.compressed));
      EXPECT_LE(g.masks.back().count(), g.masks.front().count());
    }
}

}  // namespace
}  // namespace nmkit
