# the whole GPU suite cold on the new order (ngdn.suite_order), the host changes and the gates summing the scans' partials
SUITE_RUNS=cold SUITE_TIMEOUTS=540 bash scripts/gpu_suite.sh
