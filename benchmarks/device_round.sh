#!/usr/bin/env bash
# One device call's worth of GPU work (~9 of the 10 minutes a call may take, limits included), results under $OUT.
# Run from the repository root on the device machine (torch + triton image, no network):
#   run(command="ROUND_COMMIT=<sha> [ROUND_STEPS=...] bash benchmarks/device_round.sh", carry=[".devwheels"])
# .devwheels: pydantic + pyyaml for tests/gpu/test_engine_gpu.py, fetched here beforehand with
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .devwheels pydantic pyyaml
# Each step has its own time limit and writes its own file, so a step that fails or overruns leaves
# the others' results.  The device copy's .git metadata can be stale: ROUND_COMMIT names the tree, and must
# be the literal sha from this side (a $(git rev-parse) in the command runs there and prints the stale one).
# An H100 runs tests/gpu slower than the H200 (53 tests in 220 s on 2026-12-06): give it a call of its own.
set -u
: "${OUT:?set by the device tool}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".devwheels/*.whl" > /dev/null; then
  python3 -c "import glob, zipfile; [zipfile.ZipFile(w).extractall('/tmp/pyd') for w in glob.glob('.devwheels/*.whl')]"
  export PYTHONPATH=$PYTHONPATH:/tmp/pyd
fi
{ echo "commit: ${ROUND_COMMIT:-unknown}"; date -u; nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv; } > "$OUT/round.txt"
# the % column's HBM peak: the issue's 4.6 TB/s on an H200, 3.35 TB/s on an H100 SXM (a call may get either)
PEAK=4600; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && PEAK=3350
echo "peak for %: $PEAK GB/s" >> "$OUT/round.txt"
step() {  # step NAME SECONDS CMD...: stdout+stderr to $OUT/NAME.log, exit status appended
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? ${secs}s limit, $((SECONDS - t0))s" | tee -a "$OUT/round.txt"
}
# ROUND_STEPS picks the steps (they run in this file's order); each call must fit the device's 600 s (the steps' limits add up):
#   call 1 (default) "ringtest sweep ncu ncuhead": 80 + 340 + 2 x 75 s, the load-path question
#   (the ring variants checked on the card first; ceiling, bulk, layouts; the sweep prints rows as
#   they come, most important shape first, so a cut loses bs 1 x 16K); "ncuceil" profiles the ceiling;
#   call 2 "tests": tests/gpu (ring variants first), 220 s, more on an H100;
#   call 3 "append decode": 130 + 170 s, the decode table and the sglang writer-program write.
#   "decode8": bs 8 at page 8 beside the page-64 table; "ncukern": per-kernel durations at bs 8 (ncu);
#   "ncustall" / "ncusrc": stall reasons / per-instruction stall samples, default ring vs lookahead;
#   "bf16s": bs 8 decode rows at the default and at 8 BF16-tier splits
STEPS=" ${ROUND_STEPS:-ringtest sweep ncu ncuhead} "
has() { [[ "$STEPS" == *" $1 "* ]]; }
# 0. the ring variants the sweep times (half_rows, bulk, the ceiling's checksum) against the register path
has ringtest && step ring_gpu 80 python3 -m pytest -q tests/gpu/test_decode_cuda_ring_gpu.py tests/gpu/test_side_stream_gpu.py tests/gpu/test_rotate_gpu.py tests/gpu/test_write_copy_gpu.py
# 1. correctness on the hardware (~80-130 s)
has tests && step tests_gpu 220 python3 -m pytest -q tests/gpu --durations=15
# 2. what the step's new-row write costs, by form: inside the attention launch, separate, on a side stream (~80-130 s)
has append && step append_cost "${APPEND_LIMIT:-160}" python3 benchmarks/append_cost.py --out "$OUT/append.md" ${APPEND_FORMS:+--forms $APPEND_FORMS}
# 3. the decode table (no extend) at the default cp.async ring, writes included (~95-150 s)
has decode && step decode_pipe4 170 python3 benchmarks/decode_attention.py --cuda-pipe 4 --extend-contexts --peak-gbs "$PEAK" --out "$OUT/decode_pipe4.md"
# 3a. bs 8 at the default BF16-tier splits (3) and at 8: that tier's launch took ~10 µs at bs 8 under ncu (H100, 2026-12-07)
has bf16s && for s in default 8; do step "decode_bf16s_$s" 90 python3 benchmarks/decode_attention.py --batches 8 --contexts 32768 131072 \
  --extend-contexts $([[ $s == default ]] || echo "--bf16-splits $s") --peak-gbs "$PEAK" --out "$OUT/decode_bf16s_$s.md"; done
# 3b. the same at page 8, the page every decode table before the H200 round of 2026-12-07 used (the serving default is 64), bs 8
has decode8 && step decode_page8 60 python3 benchmarks/decode_attention.py --page 8 --batches 8 --contexts 32768 131072 \
  --extend-contexts --peak-gbs "$PEAK" --out "$OUT/decode_page8.md"
# 4. A/B of the INT2 tier in one run: ring copies one token per lane (copies 0), whole sectors
#    (1: half_rows) or one cp.async.bulk per page run (2: bulk, head-major pages only); the pools'
#    token-major pages against codes and (s, z) stored head-major (one KV head's rows of a page one
#    256-B run); and each config's copies alone (--ceiling: read_only, no attention), which says
#    whether the load path or the compute holds the kernel at ~1.8 TB/s (30 rows, ~300-400 s;
#    SWEEP_LIMIT / SWEEP_CONFIGS / SWEEP_SHAPES / SWEEP_LAYOUTS narrow it to fit beside other steps;
#    SWEEP_CEILING=0 leaves the copies-alone rows out, half the rows)
CEILING=(--ceiling); [[ "${SWEEP_CEILING:-1}" == 0 ]] && CEILING=()
has sweep && step cuda_sweep "${SWEEP_LIMIT:-340}" python3 benchmarks/decode_cuda_sweep.py --no-triton --skip-check \
  "${CEILING[@]}" --layouts ${SWEEP_LAYOUTS:-token head-pages} --configs ${SWEEP_CONFIGS:-4:0:0:2:4:0 4:0:0:2:4:1 4:0:0:2:4:2} \
  --shapes ${SWEEP_SHAPES:-8x131072 8x65536 1x16384} --out "$OUT/cuda.md"
# 5. (after the sweep, so a call cut short keeps the sweep's rows) the ring's issue rate, stalls and memory traffic at bs 8 x 128K (16 splits: the pipe-4 default),
#    beside its copy ceiling (read_only, "ncuceil") and bulk refills on head-major pages (no per-lane
#    L1TEX line lookups: the line-lookup question), if ncu is there
if command -v ncu > /dev/null; then
  NCU=(ncu -k regex:oscar_int2 -c 1 --clock-control none --section SpeedOfLight --section Occupancy
       --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis
       --section MemoryWorkloadAnalysis_Tables)  # L1TEX requests, sectors, wavefronts per access kind
  NCU_ARGS=(python3 benchmarks/ncu_decode.py 8 131072 128 4 3 16 --calls 1 --layout "${NCU_LAYOUT:-head-pages}")  # the default pages (token: NCU_LAYOUT=token)
  has ncu && step ncu_ring 75 "${NCU[@]}" "${NCU_ARGS[@]}"
  has ncuceil && step ncu_ceiling 75 "${NCU[@]}" "${NCU_ARGS[@]}" --read-only
  # each kernel of a decode call at the defaults (page 64, head-major, the launcher's splits): where the time
  # outside the INT2 tier goes at bs 8 (the BF16 tier, the merge); ncu serialises the launches
  has ncukern && step ncu_kernels 150 bash -c 'for s in "8 32768" "8 65536" "8 131072" "1 16384"; do echo "== bs ctx: $s"
    ncu -k "regex:oscar|_decode" --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size \
      python3 benchmarks/ncu_decode.py $s 128 4 3 0 --layout head-pages --calls 2; done'
  has ncuhead && step ncu_head_bulk 75 "${NCU[@]}" "${NCU_ARGS[@]}" --copies 2
  # why the warps wait (per issue-active cycle, by reason) on the default ring and on the lookahead
  # loop (pipe 5: the same 3 steps in flight); ~25 s each.  STALL_VARIANTS: ncu_decode.py flag sets
  STALLS=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' long_scoreboard short_scoreboard wait \
    math_pipe_throttle mio_throttle lg_throttle barrier membar not_selected selected dispatch_stall no_instruction \
    branch_resolving drain misc sleeping tex_throttle imc_miss)smsp__issue_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active,smsp__warps_active.avg.per_cycle_active,gpu__time_duration.sum
  has ncustall && step ncu_stalls 150 bash -c 'IFS=";"; for v in ${STALL_VARIANTS:-;--lookahead --pipe 5}; do echo "== variant: $v"
    IFS=" "; ncu -k regex:oscar_int2 -c 1 --clock-control none --metrics "$0" python3 benchmarks/ncu_decode.py 8 131072 128 4 3 16 \
      --calls 1 --layout head-pages $v; done' "$STALLS"
  # per-SASS-instruction stall samples of the same two (the source page, as text): where in the loop they wait
  has ncusrc && step ncu_source 150 bash -c 'IFS=";"; for v in ${STALL_VARIANTS:-;--lookahead --pipe 5}; do echo "== variant: $v"
    IFS=" "; ncu -k regex:oscar_int2 -c 1 --clock-control none --section SourceCounters --section WarpStateStats \
      --page source --print-source sass python3 benchmarks/ncu_decode.py 8 131072 128 4 3 16 --calls 1 --layout head-pages $v; done'
fi
exit 0
