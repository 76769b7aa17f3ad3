// The summary of the Hopper tile kernel's timeline (run_tile_plan_with_timeline): host code, tested without a GPU.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/tile_timeline.hpp"
#include "nmkit/gpu/tile_spmm.hpp"

namespace nmkit::gpu {
namespace {

struct Mean {
  double sum = 0;
  int64_t n = 0;
  void add(double v) { sum += v, ++n; }
  double get() const { return n ? sum / static_cast<double>(n) : 0.0; }
};

}  // namespace

TileTimelineSummary summarize_tile_timeline(const std::vector<uint64_t>& words, double us_per_cycle) {
  using T = TileTimeline;
  require(words.size() % T::kWords == 0, ErrorCode::invalid_argument,
          "summarize_tile_timeline: " + std::to_string(words.size()) + " words are not whole CTAs of " +
              std::to_string(T::kWords));
  require(us_per_cycle > 0, ErrorCode::invalid_argument, "summarize_tile_timeline: us_per_cycle must be positive");
  TileTimelineSummary out;
  Mean prologue, latency, issue, post_gap, step_time, main_loop, epilogue, drain, first_part, other_parts, next_wait,
      units_per_cta, steps_per_unit, clock_ghz;
  uint64_t first_start_ns = UINT64_MAX, last_start_ns = 0;
  std::vector<uint64_t> ends_ns;
  for (std::size_t c = 0; c < words.size() / T::kWords; ++c) {
    const uint64_t* w = words.data() + c * T::kWords;
    if (w[T::kStart] == 0) continue;  // no such CTA in the grid
    ++out.ctas;
    first_start_ns = std::min(first_start_ns, w[T::kStartNs]), last_start_ns = std::max(last_start_ns, w[T::kStartNs]);
    if (w[T::kEndNs] != 0) ends_ns.push_back(w[T::kEndNs]);
    // This CTA's clock over its life, where it recorded its end in both clocks (one SM: clock64 is that SM's).
    const bool clocked = w[T::kEnd] > w[T::kStart] && w[T::kEndNs] > w[T::kStartNs];
    const double cta_us_per_cycle = clocked ? static_cast<double>(w[T::kEndNs] - w[T::kStartNs]) * 1e-3 /
                                                  static_cast<double>(w[T::kEnd] - w[T::kStart])
                                            : us_per_cycle;
    if (clocked) clock_ghz.add(1e-3 / cta_us_per_cycle);
    const auto at = [&](int slot) {
      return (static_cast<double>(w[slot]) - static_cast<double>(w[T::kStart])) * cta_us_per_cycle;
    };
    int steps = 0;
    while (steps < T::kSteps && w[T::kArrived + steps] != 0 && w[T::kPosted + steps] != 0) ++steps;
    int done = 0;
    while (done < T::kUnits && w[T::kUnitDone + done] != 0) ++done;
    units_per_cta.add(done);
    if (steps > 0) prologue.add(at(T::kPosted));
    for (int i = 0; i < steps; ++i) {        // a step's copies: their issue, and the gap to the next step's post
      if (w[T::kIssued + i] == 0) continue;  // an end-of-unit step issues no copy
      issue.add(at(T::kIssued + i) - at(T::kPosted + i));
      if (i + 1 < steps) post_gap.add(at(T::kPosted + i + 1) - at(T::kIssued + i));
    }
    // Unit u's steps: those that landed before it was written (the last of them is its end-of-unit step).
    int step = 0;
    for (int u = 0; u < done; ++u) {
      const int first = step;
      while (step < steps && w[T::kArrived + step] <= w[T::kUnitDone + u]) {
        latency.add(at(T::kArrived + step) - at(T::kPosted + step));
        if (step > first) step_time.add(at(T::kArrived + step) - at(T::kArrived + step - 1));
        ++step;
      }
      if (step == first || (step == steps && steps == T::kSteps)) break;  // its end-of-unit step was not recorded
      ++out.units_counted;
      const int end_step = step - 1;
      steps_per_unit.add(end_step - first);
      main_loop.add(at(T::kArrived + end_step) - at(T::kArrived + first));
      epilogue.add(at(T::kUnitDone + u) - at(T::kArrived + end_step));
      if (w[T::kMathDone + u] != 0) drain.add(at(T::kMathDone + u) - at(T::kArrived + end_step));
      if (w[T::kFirstPartStaged + u] != 0) {
        first_part.add(at(T::kFirstPartStaged + u) - at(T::kMathDone + u));
        other_parts.add(at(T::kUnitDone + u) - at(T::kFirstPartStaged + u));
      }
      if (step < steps) next_wait.add(at(T::kArrived + step) - at(T::kUnitDone + u));
    }
  }
  if (out.ctas == 0) return out;
  out.start_spread_us = static_cast<double>(last_start_ns - first_start_ns) * 1e-3;
  out.units_per_cta = units_per_cta.get(), out.steps_per_unit = steps_per_unit.get();
  out.prologue_us = prologue.get(), out.copy_latency_us = latency.get();
  out.copy_issue_us = issue.get(), out.post_gap_us = post_gap.get(), out.step_us = step_time.get();
  out.main_loop_us = main_loop.get(), out.epilogue_us = epilogue.get(), out.math_drain_us = drain.get();
  out.first_part_us = first_part.get(), out.other_parts_us = other_parts.get(), out.next_unit_wait_us = next_wait.get();
  out.clock_ghz = clock_ghz.get();
  if (!ends_ns.empty()) {  // offsets from the first start: the raw nanosecond counts are too large to average
    Mean end;
    for (uint64_t e : ends_ns) end.add(static_cast<double>(e - first_start_ns) * 1e-3);
    const auto [first, last] = std::minmax_element(ends_ns.begin(), ends_ns.end());
    out.end_first_us = static_cast<double>(*first - first_start_ns) * 1e-3, out.end_mean_us = end.get();
    out.end_last_us = static_cast<double>(*last - first_start_ns) * 1e-3;
  }
  return out;
}

}  // namespace nmkit::gpu
