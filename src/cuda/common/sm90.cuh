#pragma once
// Facts of the sm_90 SM that the Hopper kernels' roles and register budgets are derived from.
namespace nmkit::cuda {

inline constexpr int kWarpgroupThreads = 128;    // four warps: the unit of wgmma and of setmaxnreg
inline constexpr int kRegisterFile = 64 * 1024;  // 32-bit registers per SM

// Registers per thread that a launch of `threads` threads per SM is given (allocated in units of 8). The
// setmaxnreg budgets of a CTA's warpgroups must fit within them, or setmaxnreg.inc waits forever.
constexpr int launch_registers(int threads) { return kRegisterFile / threads / 8 * 8; }

}  // namespace nmkit::cuda
