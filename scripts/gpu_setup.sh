# Sourced by the scripts/gpu_*.sh runs on the device machine, from the repo root (the .whl folder
# carried): makes $OUT, installs the carried fla-core wheel into /tmp/site, puts it and the repo on
# PYTHONPATH, sets the error log ($OUT/errors.jsonl) and a Triton cache of its own, and writes the machine and package versions to $OUT/env.txt (and the terminal); defines `step` and `pack` (below).
OUT=${OUT:-/tmp/ngdn-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NGDN_ERROR_LOG=$OUT/errors.jsonl
# A Triton cache of our own, so "cold" means cold even on a machine that ran Triton before.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ngdn-triton-cache}
rm -f "$OUT/errors.jsonl"
{
  date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  echo "CPU cores: $(nproc); CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}"
  python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)"
  python3 -c "import xdist, hypothesis; print('pytest-xdist', xdist.__version__, 'hypothesis', hypothesis.__version__)" 2>/dev/null
  python3 -c "import matplotlib; print('matplotlib', matplotlib.__version__)" 2>/dev/null || echo "matplotlib: absent"
} | tee "$OUT/env.txt"

# For a call script of several steps: the logs go under $W (default /tmp/w, a copy of env.txt in it);
# `step NAME LIMIT_S CMD...` runs CMD under a time limit into $W/NAME.log and appends its exit status
# and the seconds since setup to $W/steps.log; `pack` puts $W (and the error log) into $OUT/all.tgz,
# so what a step wrote comes back even if a later step runs past the call's limit.
W=${W:-/tmp/w}
mkdir -p "$W"
cp "$OUT/env.txt" "$W/"
SETUP_DONE=$(date +%s)
step() {
  local name=$1 lim=$2; shift 2
  timeout -k 5 "$lim" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc at $(( $(date +%s) - SETUP_DONE )) s" | tee -a "$W/steps.log"
}
pack() { cp "$OUT/errors.jsonl" "$W/" 2>/dev/null; tar -czf "$OUT/all.tgz" -C "$(dirname "$W")" "$(basename "$W")"; }
