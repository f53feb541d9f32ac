#!/usr/bin/env bash
# One device call's worth of GPU work (~9 of the 10 minutes a call may take, limits included), results under $OUT.
# Run from the repository root on the device machine (torch + triton image, no network):
#   run(command="ROUND_COMMIT=<sha> bash benchmarks/device_round.sh", carry=[".devwheels"])
# .devwheels: pydantic + pyyaml for tests/gpu/test_engine_gpu.py, fetched here beforehand with
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .devwheels pydantic pyyaml
# Each step has its own time limit and writes its own file, so a step that fails or overruns leaves
# the others' results.  The device copy's .git metadata can be stale: ROUND_COMMIT names the tree.
set -u
: "${OUT:?set by the device tool}"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".devwheels/*.whl" > /dev/null; then
  python3 -c "import glob, zipfile; [zipfile.ZipFile(w).extractall('/tmp/pyd') for w in glob.glob('.devwheels/*.whl')]"
  export PYTHONPATH=$PYTHONPATH:/tmp/pyd
fi
{ echo "commit: ${ROUND_COMMIT:-unknown}"; date -u; nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv; } > "$OUT/round.txt"
step() {  # step NAME SECONDS CMD...: stdout+stderr to $OUT/NAME.log, exit status appended
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? ${secs}s limit, $((SECONDS - t0))s" | tee -a "$OUT/round.txt"
}
# 1. correctness on the hardware (~80-130 s)
step tests_gpu 200 python3 -m pytest -q tests/gpu
# 2. the cp.async ring against the register path (check at pipe 4 first, then times)
step pipe_sweep 170 python3 benchmarks/decode_cuda_sweep.py --pipe 4 --out "$OUT/pipe.md" \
  --shapes 8x131072 8x65536 32x131072 1x16384 \
  --configs 4:0:0:1:0 4:0:0:1:4 4:0:5:1:4 4:0:4:1:3 2:0:8:1:4 2:0:10:1:4
# 3. the decode table (no extend) at both settings, writes included
step decode_pipe0 95 python3 benchmarks/decode_attention.py --cuda-pipe 0 --extend-contexts --out "$OUT/decode_pipe0.md"
step decode_pipe4 95 python3 benchmarks/decode_attention.py --cuda-pipe 4 --extend-contexts --out "$OUT/decode_pipe4.md"
