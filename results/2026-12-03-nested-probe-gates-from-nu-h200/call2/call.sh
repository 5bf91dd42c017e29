# one call: the gates that make z themselves (default "triton-nu", reads_ab variant "triton") beside the
# op before (variant "gates-triton"): a compile check of the new kernels in TF32, CUDA tests of them, a
# bf16 agreement check of the two gate paths in the op, then the op at L = 4 and 2 (K = 128) and at
# head dim 64 (L = 4)
source scripts/gpu_setup.sh
W=/tmp/w; mkdir -p $W; cp $OUT/env.txt $W/
s=$(date +%s)
step() { local name=$1 lim=$2; shift 2; timeout -k 5 $lim "$@" > $W/$name.log 2>&1; local rc=$?; echo "$name rc=$rc at $(( $(date +%s)-s )) s" | tee -a $W/steps.log; }
pack() { cp $OUT/errors.jsonl $W/ 2>/dev/null; tar -czf $OUT/all.tgz -C /tmp w; }
V="triton gates-triton"
step compile 60 python3 -c "
import torch
from optimized.nested.probe_gates_nu import probe_gates_nu_fwd, probe_gates_nu_bwd
for K, n, Bt in ((128, 16, 512), (128, 64, 128), (64, 16, 512)):
    H = 16; C = 4 * K
    nu = torch.randn(Bt, H, n, K, device='cuda'); W = torch.randn(H, K, C, device='cuda') / K ** 0.5
    outs = [torch.empty(Bt, H, n, K, device='cuda') for _ in range(3)] + [torch.empty(Bt, H, K, device='cuda')]
    probe_gates_nu_fwd('learned', nu, W, Bt, H, n, K, K, 'mean', *outs, precision='tf32')
    dz = probe_gates_nu_bwd('learned', nu, W, Bt, H, n, K, K, 'mean', *[torch.randn_like(o) for o in outs], precision='tf32')
    z = torch.bmm(nu.transpose(0, 1).reshape(H, Bt * n, K), W)
    print(K, n, 'fwd ok', float(outs[1].mean()), 'dz', tuple(dz.shape), 'z err beta', float((torch.sigmoid(z[..., K:2 * K]).view(H, Bt, n, K).transpose(0, 1) - outs[1]).abs().max()))
"
if ! grep -q "64 16 fwd ok" $W/compile.log; then pack; cat $W/compile.log | tail -20; exit 1; fi
step warm-k128 420 python3 -m bench.reads_ab --out $W/warm-k128 --levels 4 2 --variants $V --warmup-only &
step warm-k64 420 python3 -m bench.reads_ab --out $W/warm-k64 -K 64 --levels 4 --variants $V --warmup-only &
step tests 200 python3 -m pytest -q -p no:cacheprovider property_tests/test_probe_fused.py -k "from_nu or fixed_draws" tests/test_nested_hot_path.py::test_triton_probe_gates_in_the_op_agree tests/test_nested_fused_probe.py
step agree 200 python3 .scratch/agree.py
wait
pack
step l42 100 python3 -m bench.reads_ab --out $W/l42 --levels 4 2 --variants $V --profile
pack
step k64 60 python3 -m bench.reads_ab --out $W/k64 -K 64 --levels 4 --variants $V
pack
tail -3 $W/tests.log; cat $W/agree.log; cat $W/l42/reads_ab.md $W/k64/reads_ab.md 2>/dev/null
