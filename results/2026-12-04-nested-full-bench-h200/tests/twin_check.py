"""The widest-ladder launch test against the fold at one block of 128 pairs (the code before the
pair blocks): expected to be refused for shared memory on an H200. Run at ff6a761, where the test
took no argument (it takes ``counts`` since: call it with ``"ladder"``)."""
import optimized.nested.reads_bwd as reads_bwd
from tests.test_nested_widest_ladder import test_full_ladder_launches_at_the_widest_firings as test

reads_bwd.SNAP_BLOCK_N = 128
try:
    test()
    print("twin: PASSED (the refusal did not happen)")
except Exception as e:
    print(f"twin: FAILED as expected: {type(e).__name__}: {str(e)[:200]}")
