#pragma once
// The Hopper tile kernel's timeline, for diagnosis (nmkit_bench --tile-timeline): a run that records it, the
// record layout and its summary. Not part of the public API.
#include <cstdint>
#include <vector>

#include "nmkit/gpu/tile_spmm.hpp"

namespace nmkit::gpu {

// One CTA's words of a timeline: clock64() values (globaltimer ns for kStartNs); slots past what a
// CTA reached stay as the caller filled them.
struct TileTimeline {
  static constexpr int kSteps = 128;                   // pipeline steps recorded, counted over all of the CTA's units
  static constexpr int kUnits = 32;                    // work units recorded
  static constexpr int kStartNs = 0;                   // %globaltimer when the CTA started
  static constexpr int kStart = 1;                     // clock64 when the CTA started
  static constexpr int kPosted = 2;                    // [kSteps] the producer issued the step's copies
  static constexpr int kArrived = kPosted + kSteps;    // [kSteps] consumer warpgroup 0 saw the step's data land
  static constexpr int kUnitDone = kArrived + kSteps;  // [kUnits] consumer warpgroup 0 wrote the unit's rows
  static constexpr int kIssued = kUnitDone + kUnits;   // [kSteps] the producer issued the step's last copy
  static constexpr int kEndNs = kIssued + kSteps;      // %globaltimer when the CTA's last write was done
  static constexpr int kMathDone = kEndNs + 1;         // [kUnits] consumer warpgroup 0's last wgmma of the unit done
  static constexpr int kFirstPartStaged = kMathDone + kUnits;  // [kUnits] ... and the unit's first output part staged
  static constexpr int kEnd = kFirstPartStaged + kUnits;       // clock64 when kEndNs was taken
  static constexpr int kWords = kEnd + 1;
};

// Runs `plan` on `a` as TileSpmmPlan::run does, through a build of the Hopper kernel that records each CTA's
// timeline in `timeline` (grid x TileTimeline::kWords words, zero-filled; the grid is at most the plan's units x
// split). Built for f16 A, B and D only; throws unsupported where the plan runs another kernel or dtype for `a`.
void run_tile_plan_with_timeline(const TileSpmmPlan& plan, Stream stream, const DeviceTiles& a, const void* b,
                                 const void* c, void* d, const float* bias, uint64_t* timeline);

// What a timeline recorded, averaged over the CTAs (0 where nothing was recorded). Cycles become
// microseconds at each CTA's own clock, measured over its life (the global timer against clock64 between its start
// and its end), where it recorded both; at `us_per_cycle` otherwise. Under load the SMs hold well below their
// nominal clock (H200: ~1.6 GHz against 1.98), so the nominal one understates every time by as much. A unit
// counts only if its end-of-unit step is among the recorded steps: where the record ran out
// inside a unit, its epilogue would be measured from a mid-unit step.
struct TileTimelineSummary {
  int64_t ctas = 0;                              // CTAs that recorded a start
  int64_t units_counted = 0;                     // units whose main loop and epilogue are in the means below
  double start_spread_us = 0;                    // the last CTA start after the first (global timer)
  double units_per_cta = 0, steps_per_unit = 0;  // steps: those with data
  double prologue_us = 0;                        // CTA start -> its first post
  double copy_latency_us = 0;                    // a step posted -> its data landed for consumer warpgroup 0
  double copy_issue_us = 0;                      // a step posted -> its last copy issued
  double post_gap_us = 0;                        // a step's last copy issued -> the next step posted
  double step_us = 0;                            // between two steps of a unit landing
  double main_loop_us = 0;                       // a unit's first step landed -> its end-of-unit step
  double epilogue_us = 0;                        // the end-of-unit step -> the unit written (or staged)
  double math_drain_us = 0;                      // the end-of-unit step -> the unit's last wgmma done
  double first_part_us = 0;                      // the last wgmma done -> the first part staged (deferred store)
  double other_parts_us = 0;                     // the first part staged -> the unit staged
  double next_unit_wait_us = 0;                  // the unit written -> the next unit's first step landed
  double end_first_us = 0, end_mean_us = 0, end_last_us = 0;  // CTA ends after the first start (global timer)
  double clock_ghz = 0;                                       // the SMs' clock over the CTAs' lives, where measured
};
// `words`: grid x TileTimeline::kWords, as the launch left them (zero-filled before it).
TileTimelineSummary summarize_tile_timeline(const std::vector<uint64_t>& words, double us_per_cycle);

}  // namespace nmkit::gpu
