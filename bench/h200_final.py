"""One process on the H200: correctness of every mode/evaluator through the public API
(fwd + bwd, the first case of tests/test_api_gpu.py), then bench/gqa_4096.py, so each
kernel compiles once. Usage: python bench/h200_final.py --json OUT/gqa_4096.json"""
import os
import sys
import traceback

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "tests"))

import gqa_4096  # noqa: E402
import test_api_gpu as api  # noqa: E402


def correctness() -> int:
    failures = 0
    for mode, evaluator in api.MODES:
        try:
            api.test_forward_and_backward(mode, evaluator, api.CASES[0])
            print(f"PASS {mode}/{evaluator}")
        except Exception:  # noqa: BLE001 - report every mode, then go on to timing
            failures += 1
            print(f"FAIL {mode}/{evaluator}\n{traceback.format_exc()[-1500:]}")
    return failures


if __name__ == "__main__":
    bad = correctness()
    print(f"correctness: {len(api.MODES) - bad} passed, {bad} failed")
    gqa_4096.main(sys.argv[1:])
