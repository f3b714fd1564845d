"""kforge's PyTorch front end: KernelBench-style modules as kforge problems.

- modfile: a module file's constants, run with some of them changed
- describe: what `kforge import` learns from a file (run in a jail: the file is the tenant's)
- recognize: which operator family a forward is, from its traced aten ops
- templates, generate: the tunable seed kernels for those families, and the problem folder
- runner: the worker's reference process (jailed): the module's outputs and its eager timings
"""
