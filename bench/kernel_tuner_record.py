"""Records a random sample of an OpenCL example's tuning space with Kernel Tuner, as a Kernel Tuner
cache file that `kforge-bench-search --cache` scores searches against (replay: the file's optimum
is the reference, its other configurations the space).

    PYTHONPATH=<Kernel Tuner> python3 bench/kernel_tuner_record.py examples/opencl/sgemm SIZE FEVALS OUT.json

Only sgemm's launch shape (global ceil(N / (WGN*TN*VW)) * WGN by ceil(M / (WGM*TM)) * WGM, local
WGN x WGM, square SIZE^3) is mapped. Every configuration is verified against A*B in float64 and
timed as the mean of 5 runs (Kernel Tuner's way). Install Kernel Tuner as bench/README.md says
("kforge against Kernel Tuner"); PYOPENCL_NO_CACHE=1 makes compiles faster.
"""
import sys
from collections import OrderedDict

import kernel_tuner
import numpy as np
import yaml


def main():
    folder, size, fevals, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    prob = yaml.safe_load(open(folder + "/problem.yaml"))
    source = open(folder + "/seed.cl").read()
    m = n = k = size
    a = np.random.uniform(-1, 1, (m, k)).astype(np.float32)
    b = np.random.uniform(-1, 1, (k, n)).astype(np.float32)
    args = [a, b, np.zeros((m, n), np.float32), np.int32(m), np.int32(n), np.int32(k)]
    answer = [None, None, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32), None, None, None]
    params = OrderedDict((name, list(values)) for name, values in prob["seed"]["params"].items())
    # kforge's constraint language spells "or" and "and" as C does.
    restrictions = [c.replace("||", " or ").replace("&&", " and ") for c in prob["seed"]["constraints"]]
    results, _ = kernel_tuner.tune_kernel(
        "matmul", source, (n, m), args, params, lang="OpenCL", answer=answer, atol=1e-2,
        compiler_options=["-cl-std=CL1.2"], block_size_names=["WGN", "WGM"],
        grid_div_x=["WGN", "TN", "VW"], grid_div_y=["WGM", "TM"], restrictions=restrictions,
        strategy="random_sample", strategy_options=dict(max_fevals=fevals), cache=out, iterations=5,
        verbose=False, quiet=True)
    times = [r["time"] for r in results if isinstance(r["time"], float)]
    print(f"{len(results)} configurations recorded in {out}; best {min(times):.4f} ms")


if __name__ == "__main__":
    main()
