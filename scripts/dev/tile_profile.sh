B=build/gpu/bench/nmkit_bench
T="--suite tile --dtype f16 --tile-sides 64 --iters 10"
NMKIT_GPU_TESTS='TileGpu.Hopper*:TileGpu.Skewed*' NMKIT_GPU_TEST_TIMEOUT=120 NMKIT_BENCH_SKIP=1 NMKIT_BENCH_TIMEOUT=60 \
NMKIT_BENCH_VNM="$T --shape 4096,4096,4096 --tile-densities 0.5,0.1 --tile-block-n 128;$T --shape 4096,4096,32 --tile-densities 0.5,0.1 --tile-split 1;$T --shape 4096,4096,32 --tile-densities 0.5,0.1 --tile-split 2;$T --shape 4096,4096,32 --tile-densities 0.5,0.1 --tile-split 8;$T --shape 4096,4096,32 --tile-densities 0.5,0.1 --tile-block-n 128 --tile-split 4" \
timeout 400 bash scripts/gpu_check.sh --quick 2>&1 | grep -E "^tile|gpu tests|FAILED|Failure" | grep -v skewed
for shape in 4096,4096,32:0.5 4096,4096,4096:0.1; do
  timeout 60 ncu --kernel-name regex:sm90_tile --launch-skip 4 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
    $B --suite tile --dtype f16 --tile-sides 64 --shape ${shape%:*} --tile-densities ${shape#*:} --iters 2 --warmup 1 2>&1 | grep -vE "^tile|^suite|^==PROF==|^$" | grep -E "Throughput|Duration|Stall|Warp Cycles|Issued|Busy|Bandwidth|Hit Rate|Grid|Registers|Cluster|Achieved|Elapsed|Block Size|Shared" | head -40
done
