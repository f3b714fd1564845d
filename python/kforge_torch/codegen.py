"""Kernel source for the families kforge recognises, in one dialect for OpenCL and CUDA.

A template body is written once against a few macros (KERNEL, GLOBAL, LOCAL, SYNC, the work-item
indices); a prelude per backend defines them. Sizes are `int` kernel arguments (the launch plan's
integer expressions), computed with in `long`; knobs are compile-time defines (-D NAME=value) that
the search tunes. Each generator returns a Seed: source, knobs with their values and constraints,
launches (in the backend's form), and scratch buffers.
"""

import math

OPENCL_PRELUDE = """// kforge template prelude (OpenCL)
#define KERNEL __kernel
#define GLOBAL __global
#define LOCAL_MEM __local
#define SYNC() barrier(CLK_LOCAL_MEM_FENCE)
#define LID0 ((long)get_local_id(0))
#define LSZ0 ((long)get_local_size(0))
#define GRP0 ((long)get_group_id(0))
#define NGRP0 ((long)get_num_groups(0))
#define GID0 ((long)get_global_id(0))
#define GSZ0 ((long)get_global_size(0))
#define LID1 ((long)get_local_id(1))
#define GRP1 ((long)get_group_id(1))
#define GRP2 ((long)get_group_id(2))
#define RESTRICT restrict
"""

CUDA_PRELUDE = """// kforge template prelude (CUDA)
#define KERNEL extern "C" __global__
#define GLOBAL
#define LOCAL_MEM __shared__
#define SYNC() __syncthreads()
#define LID0 ((long)threadIdx.x)
#define LSZ0 ((long)blockDim.x)
#define GRP0 ((long)blockIdx.x)
#define NGRP0 ((long)gridDim.x)
#define GID0 ((long)blockIdx.x * blockDim.x + threadIdx.x)
#define GSZ0 ((long)gridDim.x * blockDim.x)
#define LID1 ((long)threadIdx.y)
#define GRP1 ((long)blockIdx.y)
#define GRP2 ((long)blockIdx.z)
#define RESTRICT __restrict__
"""

CTYPES = {"f32": "float", "f64": "double", "i32": "int", "i64": "long", "u8": "unsigned char"}


def prelude(backend):
    return CUDA_PRELUDE if backend == "cuda" else OPENCL_PRELUDE


def flt(v):
    """A float literal for C."""
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    if math.isnan(v):
        return "NAN"
    return repr(float(v)) + "f" if abs(v) < 3e38 else repr(float(v))


class Seed:
    def __init__(self, family, source, kernels, params, constraints, launches, scratch=None, note=""):
        self.family = family
        self.source = source
        self.kernels = kernels
        self.params = params            # name -> [values]
        self.constraints = constraints  # boolean expressions over params and sizes
        self.launches = launches        # [{kernel, global/local | grid/block, args}]
        self.scratch = scratch or []    # [{name, dtype, shape}]
        self.note = note


def launch(backend, kernel, items, group, args, items1=None):
    """A 1-D (or 2-D) launch of `items` work-items (expression) in groups of `group` (a knob)."""
    if backend == "cuda":
        grid = [f"ceil_div({items}, {group})"] + ([items1] if items1 else [])
        block = [group] + (["1"] if items1 else [])
        return {"kernel": kernel, "grid": grid, "block": block, "args": args}
    glob = [f"ceil_div({items}, {group}) * {group}"] + ([items1] if items1 else [])
    loc = [group] + (["1"] if items1 else [])
    return {"kernel": kernel, "global": glob, "local": loc, "args": args}


def prod_expr(exprs):
    exprs = [e for e in exprs if e != "1"]
    if not exprs:
        return "1"
    return " * ".join(f"({e})" if any(c in e for c in "+-/%") else e for e in exprs)
