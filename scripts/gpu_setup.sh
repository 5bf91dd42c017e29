# Sourced by the scripts/gpu_*.sh runs on the device machine, from the repo root (the .whl folder
# carried): makes $OUT, installs the carried fla-core wheel into /tmp/site, puts it and the repo on
# PYTHONPATH, sets the error log ($OUT/errors.jsonl) and a Triton cache of its own, and writes the machine and package versions to $OUT/env.txt (and the terminal).
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
