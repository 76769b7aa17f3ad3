// The summary of a tile kernel's timeline (summarize_tile_timeline) on hand-built CTA records: every mean against
// values worked out by hand, units whose end-of-unit step fell past the recorded steps left out, malformed input.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/tile_timeline.hpp"
#include "nmkit/gpu/tile_spmm.hpp"
#include "test_util.hpp"

namespace nmkit::gpu {
namespace {

using T = TileTimeline;
constexpr double kUsPerCycle = 0.001;  // 1 GHz: 1000 cycles = 1 us
constexpr double kClose = 1e-9;        // microseconds from cycle counts: a few ulps apart

// CTA 0: two units. Unit 0: steps 0 and 1 carry data, step 2 ends it; unit 1: step 3 carries data, step 4 ends it.
// Clock marks are offsets from the CTA's start (cycle 1000).
void fill_two_units(uint64_t* w) {
  w[T::kStartNs] = 50'000, w[T::kStart] = 1000, w[T::kEndNs] = 60'000;
  const uint64_t posted[] = {2000, 2500, 3000, 6000, 6600}, issued[] = {2100, 2600, 0, 6100, 0},
                 arrived[] = {4000, 4400, 4800, 8000, 8500};
  for (int i = 0; i < 5; ++i) {
    w[T::kPosted + i] = 1000 + posted[i], w[T::kArrived + i] = 1000 + arrived[i];
    if (issued[i]) w[T::kIssued + i] = 1000 + issued[i];
  }
  w[T::kMathDone + 0] = 1000 + 5000, w[T::kFirstPartStaged + 0] = 1000 + 5600, w[T::kUnitDone + 0] = 1000 + 7000;
  w[T::kMathDone + 1] = 1000 + 8700, w[T::kFirstPartStaged + 1] = 1000 + 9300, w[T::kUnitDone + 1] = 1000 + 10'500;
}

TEST(TileTimeline, SummaryOfHandBuiltRecords) {
  std::vector<uint64_t> words(3 * T::kWords, 0);  // CTA 2 never started (a grid smaller than the buffer)
  fill_two_units(words.data());
  // CTA 1: one unit whose steps run past the record: every recorded step is a data step of unit 0, so the unit
  // must not be counted (its "epilogue" from step 127 would include the unrecorded steps).
  uint64_t* w = words.data() + T::kWords;
  w[T::kStartNs] = 51'000, w[T::kStart] = 5000, w[T::kEndNs] = 70'000;
  for (int i = 0; i < T::kSteps; ++i)
    w[T::kPosted + i] = 5000 + 1000 + 100 * i, w[T::kArrived + i] = 5000 + 2000 + 100 * i;
  w[T::kUnitDone + 0] = 5000 + 2000 + 100 * T::kSteps + 50'000;

  const TileTimelineSummary s = summarize_tile_timeline(words, kUsPerCycle);
  EXPECT_EQ(s.ctas, 2);
  EXPECT_EQ(s.units_counted, 2);  // CTA 0's two; CTA 1's unit left out
  EXPECT_NEAR(s.start_spread_us, 1.0, kClose);
  EXPECT_NEAR(s.units_per_cta, 1.5, kClose);
  EXPECT_NEAR(s.steps_per_unit, 1.5, kClose);            // 2 and 1 data steps
  EXPECT_NEAR(s.prologue_us, (2.0 + 1.0) / 2, kClose);   // first posts of CTA 0 and CTA 1
  EXPECT_NEAR(s.main_loop_us, (0.8 + 0.5) / 2, kClose);  // landed 4.0 -> 4.8, 8.0 -> 8.5
  EXPECT_NEAR(s.epilogue_us, (2.2 + 2.0) / 2, kClose);   // end-of-unit steps 4.8 and 8.5 -> done 7.0 and 10.5
  EXPECT_NEAR(s.math_drain_us, (0.2 + 0.2) / 2, kClose);
  EXPECT_NEAR(s.first_part_us, 0.6, kClose);
  EXPECT_NEAR(s.other_parts_us, (1.4 + 1.2) / 2, kClose);
  EXPECT_NEAR(s.next_unit_wait_us, 1.0, kClose);  // unit 0 done 7.0 -> step 3 landed 8.0
  EXPECT_NEAR(s.copy_issue_us, 0.1, kClose);      // CTA 0's three data steps
  EXPECT_NEAR(s.post_gap_us, (0.4 + 0.4 + 0.5) / 3, kClose);
  // Step times: CTA 0 within its units (0.4, 0.4, 0.5), CTA 1's 127 steps 0.1 apart.
  EXPECT_NEAR(s.step_us, (0.4 + 0.4 + 0.5 + 127 * 0.1) / 130, kClose);
  // Copy latency: every recorded step that belongs to a unit of either CTA.
  EXPECT_NEAR(s.copy_latency_us, (2.0 + 1.9 + 1.8 + 2.0 + 1.9 + T::kSteps * 1.0) / (5 + T::kSteps), kClose);
  EXPECT_NEAR(s.end_first_us, 10.0, kClose);
  EXPECT_NEAR(s.end_last_us, 20.0, kClose);
  EXPECT_NEAR(s.end_mean_us, 15.0, kClose);
}

TEST(TileTimeline, CyclesBecomeTimeAtEachCtasMeasuredClock) {
  // CTA 0 as above, but it ran at 1.25 GHz: its life of 10 us (global timer) is 12500 cycles, so every interval
  // of the summary is 0.8 times what the nominal 1 GHz says. CTA 1 recorded no end in cycles: the nominal clock.
  std::vector<uint64_t> words(2 * T::kWords, 0);
  fill_two_units(words.data());
  words[T::kEnd] = 1000 + 12'500;
  uint64_t* w = words.data() + T::kWords;
  w[T::kStartNs] = 50'000, w[T::kStart] = 7000, w[T::kEndNs] = 52'000;
  w[T::kPosted] = 7000 + 500, w[T::kIssued] = 7000 + 600, w[T::kArrived] = 7000 + 1500;
  w[T::kPosted + 1] = 7000 + 1600, w[T::kArrived + 1] = 7000 + 1800;  // its end-of-unit step
  w[T::kUnitDone] = 7000 + 2000;
  const TileTimelineSummary s = summarize_tile_timeline(words, kUsPerCycle);
  EXPECT_NEAR(s.clock_ghz, 1.25, kClose);  // only CTA 0's
  EXPECT_NEAR(s.prologue_us, (0.8 * 2.0 + 0.5) / 2, kClose);
  EXPECT_NEAR(s.main_loop_us, (0.8 * 0.8 + 0.8 * 0.5 + 0.3) / 3, kClose);
  EXPECT_NEAR(s.epilogue_us, (0.8 * 2.2 + 0.8 * 2.0 + 0.2) / 3, kClose);
  EXPECT_NEAR(s.end_last_us, 10.0, kClose);  // the global timer's, unscaled
  // Without ends in cycles the nominal clock stands, and no clock is reported.
  words[T::kEnd] = 0;
  EXPECT_DOUBLE_EQ(summarize_tile_timeline(words, kUsPerCycle).clock_ghz, 0.0);
  EXPECT_NEAR(summarize_tile_timeline(words, kUsPerCycle).prologue_us, (2.0 + 0.5) / 2, kClose);
}

TEST(TileTimeline, EmptyAndMalformedRecords) {
  const TileTimelineSummary none = summarize_tile_timeline(std::vector<uint64_t>(2 * T::kWords, 0), kUsPerCycle);
  EXPECT_EQ(none.ctas, 0);
  EXPECT_EQ(none.units_counted, 0);
  EXPECT_DOUBLE_EQ(none.epilogue_us, 0.0);
  EXPECT_NMKIT_ERROR(summarize_tile_timeline(std::vector<uint64_t>(T::kWords + 1, 0), kUsPerCycle),
                     ErrorCode::invalid_argument, "whole CTAs");
  EXPECT_NMKIT_ERROR(summarize_tile_timeline(std::vector<uint64_t>(T::kWords, 0), 0.0), ErrorCode::invalid_argument,
                     "us_per_cycle");
}

}  // namespace
}  // namespace nmkit::gpu
