"""`kforge import`: a KernelBench-style file in, a kforge problem folder out (as text, for the CLI
to write and load).

Runs in the jailed PyTorch process (the file is the user's code). Steps:
  1. its free constants, with --set applied, and --fit: the largest constants halved until every
     input, output and parameter holds at most `fit` elements (shapes from meta tensors: no memory);
     anything over `max_elements` is refused, naming the tensor;
  2. get_inputs() traced for fills (torch.rand -> uniform(0, 1), randn -> normal(0, 1),
     randint(lo, hi) -> randint(lo, hi - 1); others by the values' range);
  3. shapes as expressions of the constants (probing with changed constants tells M from N when
     both are 1024), and a second size set for validation only, with other values (a kernel
     tuned on one shape must still be right on another);
  4. forward() traced, its family recognised and a tunable seed generated (templates), or none:
     then only a model can write the kernel;
  5. problem.yaml.
"""

import math
import os
import re

import torch

from kforge_torch import fuse, fusegen, modfile, recognize, trace
from kforge_torch.modfile import ModuleError

DTYPE_NAMES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
               torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.bool: "u8"}


def dtype_name(t, what):
    name = DTYPE_NAMES.get(t.dtype)
    if name is None:
        raise ModuleError(f"{what} is a {t.dtype} tensor; kforge's buffers are f32, f64, f16, bf16, i32, i64, "
                          "u8 and bool")
    return name


def identifier(text, fallback):
    s = re.sub(r"[^A-Za-z0-9_]", "_", text)
    if not s or s[0].isdigit():
        s = fallback + "_" + s
    return s[:48]


class Shapes:
    """Shapes of inputs, outputs and state at some constants, without memory when it can."""

    def __init__(self, mf, overrides, seed, real=False):
        self.ns = mf.run(overrides)
        record = {}
        with modfile.patched_factories(not real, record):
            if real:
                torch.manual_seed(seed)
            raw = modfile.call_user("get_inputs()", self.ns["get_inputs"], mf.filename)
        if not isinstance(raw, (list, tuple)):
            raw = [raw]
        self.items = list(raw)          # tensors and scalars, as forward takes them
        self.record = record
        self.inputs = [x for x in raw if isinstance(x, torch.Tensor)]
        for i, x in enumerate(raw):
            if not isinstance(x, (torch.Tensor, int, float)) or isinstance(x, bool):
                raise ModuleError(f"get_inputs() gave a {type(x).__name__} at position {i}; kforge takes tensors "
                                  "and numbers")
        self.model = modfile.build_model(self.ns, mf.filename, seed, meta=not real)
        self.state = modfile.state_of(self.model)
        self.outputs = None
        if not real:
            try:
                with torch.no_grad():
                    out = self.model(*self.items)
                self.outputs = modfile.tensors_of(out, "forward()")
            except Exception:  # noqa: BLE001 - some operators have no meta kernel: learnt later
                self.outputs = None

    def tensors(self):
        out = [("input", i, t) for i, t in enumerate(self.inputs)]
        out += [("parameter", k, t) for k, t in self.state]
        out += [("output", i, t) for i, t in enumerate(self.outputs or [])]
        return out


def fit(mf, overrides, seed, target, cap, fixed):
    """Halves the largest free integer constants (not those the user set) until every tensor holds
    at most `target` elements; refuses (naming it) a tensor over `cap` that halving cannot help."""
    consts = dict(mf.free)
    consts.update(overrides)
    for _ in range(64):
        sh = Shapes(mf, {k: v for k, v in consts.items() if consts[k] != mf.free.get(k) or k in overrides}, seed)
        over = [(what, key, t) for what, key, t in sh.tensors() if t.numel() > (target or cap)]
        if not over:
            return consts, sh
        what, key, t = max(over, key=lambda x: x[2].numel())
        dims = set(t.shape)
        # The constants that may shrink: integers over 1 the user did not set, not "dim"-like
        # small ones (an axis, a kernel size), largest first among those the tensor's shape shows.
        movable = [k for k, v in consts.items() if isinstance(v, int) and movable_size(k, v) and v > 1 and k not in fixed]
        if not movable or not target:
            raise ModuleError(f"the {what} {key} has {t.numel()} elements ({list(t.shape)}), over the limit of "
                              f"{cap if not target else target}; set smaller sizes with --set NAME=VALUE")
        seen = [k for k in movable if consts[k] in dims]
        pick = max(seen or movable, key=lambda k: consts[k])
        consts[pick] = max(1, consts[pick] // 2)
    raise ModuleError("sizes could not be fitted (64 halvings); set them with --set NAME=VALUE")


def changed(mf, consts):
    return {k: v for k, v in consts.items() if v != mf.free.get(k)}


def probes_of(mf, consts, seed):
    """The module at two other settings of its integer constants (each moved by a different
    amount), on the meta device: which dims and fill bounds follow which constant."""
    ints = {k: v for k, v in consts.items() if isinstance(v, int) and movable_size(k, v)}
    out = []
    # Three settings, each constant moved by its own amount: a form that fits all four settings
    # by coincidence is rare.
    for scheme in (lambda v, i: v + 1 + i, lambda v, i: v + 3 + 2 * i, lambda v, i: v + 5 + 3 * i):
        probe = dict(consts)
        for i, k in enumerate(sorted(ints, key=lambda k: -ints[k])):
            probe[k] = scheme(ints[k], i)
        try:
            sh = Shapes(mf, changed(mf, probe), seed)
            if sh.outputs is None:
                # No meta kernel for some operator: the outputs' shapes from a real run.
                sh = Shapes(mf, changed(mf, probe), seed, real=True)
                with torch.no_grad():
                    sh.outputs = modfile.tensors_of(sh.model(*sh.items), "forward()")
            out.append((probe, sh))
        except Exception:  # noqa: BLE001 - a setting the module refuses: one probe fewer
            pass
    return out


# Constants that shape a window or an axis rather than a size: changing them changes the
# operator (or makes it invalid), not its size.
STRUCTURAL = ("kernel", "stride", "pad", "dilation", "group", "dim", "axis", "eps", "margin", "alpha", "beta")


def movable_size(name, value):
    """Whether a constant is a size that probes and the validation set may change."""
    low = name.lower()
    if any(w in low for w in STRUCTURAL) and value < 64:
        return False
    return value >= 2


def shape_exprs(consts, base_shapes, probes):
    """For each tensor's dims, an expression of the constants (a name, a product of two, or a
    number) that gives the dim at the file's constants and at every probe's."""
    others = [(probe, {(w, k): t for w, k, t in sh.tensors()}) for probe, sh in probes]
    out = {}
    for what, key, t in base_shapes.tensors():
        exprs = []
        for j, d in enumerate(t.shape):
            seen = [(consts, d)]
            for probe, tensors in others:
                o = tensors.get((what, key))
                if o is not None and j < len(o.shape):
                    seen.append((probe, o.shape[j]))
            exprs.append(match_dim(seen))
        out[(what, key)] = exprs
    return out


def match_dim(seen):
    """The expression of a dim that takes value v at constants c, for every (c, v) seen."""
    consts, d = seen[0]
    if all(v == 1 for _, v in seen):
        return "1"
    if len(seen) == 1:
        return str(d)
    names = [k for k, v in consts.items() if isinstance(v, int) and v > 1]
    forms = []
    for k in names:
        forms.append((k, lambda c, k=k: c[k]))
    for a in names:
        for b in names:
            if a < b:
                forms.append((f"{a} * {b}", lambda c, a=a, b=b: c[a] * c[b]))
    for k in names:
        for m in (2, 3, 4, 8):
            forms.append((f"{k} / {m}", lambda c, k=k, m=m: c[k] // m))
            forms.append((f"{k} * {m}", lambda c, k=k, m=m: c[k] * m))
        for add in (-4, -3, -2, -1, 1, 2, 3, 4):
            forms.append((f"{k} {'+' if add > 0 else '-'} {abs(add)}", lambda c, k=k, add=add: c[k] + add))
            for m in (2, 3, 4):
                # A window's output: (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1.
                forms.append((f"({k} {'+' if add > 0 else '-'} {abs(add)}) / {m}",
                              lambda c, k=k, add=add, m=m: (c[k] + add) // m))
    for text, f in forms:
        if all(f(c) == v for c, v in seen):
            return text
    if all(v == d for _, v in seen):
        return str(d)
    return None  # depends on the sizes in a way not expressed: a size of its own


def fill_of(rec, t, consts, probe_recs):
    """The fill that makes inputs like t, from the factory that made it (or its values); a
    randint bound that follows a constant is written as that constant (probe_recs: the same
    factory call at the probes' constants, with those constants)."""
    if rec is not None:
        name, args, kwargs, _ = rec
        if name in ("rand", "rand_like"):
            return "uniform(0, 1)"
        if name in ("randn", "randn_like"):
            return "normal(0, 1)"
        if name in ("randint", "randint_like"):
            def bounds(r):
                nums = [a for a in r[1] if isinstance(a, int) and not isinstance(a, bool)]
                if r[0] == "randint_like":
                    return (0, nums[0]) if len(nums) == 1 else (nums[0], nums[1])
                return (0, nums[0]) if len(nums) == 1 or not isinstance(r[1][1], int) else (nums[0], nums[1])
            lo, hi = bounds(rec)
            seen = [(consts, hi)] + [(c, bounds(pr)[1]) for c, pr in probe_recs if pr is not None]
            expr = match_dim(seen) if len(seen) > 1 else None
            if expr is not None and not expr.lstrip("-").isdigit():
                return f"randint({lo}, {expr} - 1)"
            return f"randint({lo}, {hi - 1})"
        if name in ("ones", "ones_like"):
            return "constant(1)"
        if name in ("zeros", "zeros_like"):
            return "constant(0)"
    if t.dtype == torch.bool:
        return "randint(0, 1)"
    if t.numel() == 0:
        return "constant(0)"
    lo, hi = float(t.min()), float(t.max())
    if not t.dtype.is_floating_point:
        return f"randint({int(lo)}, {int(hi)})"
    if lo == hi:
        return f"constant({lo:.6g})"
    return f"uniform({lo:.6g}, {hi:.6g})"


def check_set(mf, consts, seed, exprs_used):
    """Values for a size set the search never times: the size constants that shapes show moved to
    other (odd) values, checked by running forward there."""
    used = {k for k in consts if any(re.search(rf"\b{re.escape(k)}\b", e or "") for e in exprs_used)
            and movable_size(k, consts[k])}
    tries = [lambda v: v // 2 + 1, lambda v: v - 1, lambda v: v + 1, lambda v: max(2, v // 3)]
    for f in tries:
        alt = dict(consts)
        for k in used:
            if isinstance(consts[k], int) and consts[k] > 2:
                alt[k] = f(consts[k])
        if alt == consts:
            return None, "no size to change"
        try:
            sh = Shapes(mf, changed(mf, alt), seed, real=True)
            with torch.no_grad():
                out = sh.model(*sh.items)
            modfile.tensors_of(out, "forward()")
            return alt, ""
        except (ModuleError, Exception) as e:  # noqa: BLE001
            why = str(e)
    return None, why


def names_for(model, items, outs, state):
    """Buffer names: forward's parameter names for its inputs, out / out0.. for outputs, the
    state_dict keys (dots as underscores) for the state."""
    import inspect
    try:
        params = [p for p in inspect.signature(model.forward).parameters if p not in ("self",)]
    except (TypeError, ValueError):
        params = []
    used = set()

    def unique(n):
        base, k = n, 1
        while n in used or n in ("out",) and False:
            n = f"{base}_{k}"
            k += 1
        used.add(n)
        return n

    inputs = [unique(identifier(params[i] if i < len(params) else f"in{i}", "in")) for i in range(len(items))]
    outputs = [unique("out" if len(outs) == 1 else f"out{i}") for i in range(len(outs))]
    st = {k: unique(identifier(k.replace(".", "_"), "w")) for k, _ in state}
    return inputs, outputs, st


def yaml_str(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def flow(items):
    return "[" + ", ".join(yaml_str(x) if isinstance(x, str) and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*|-?[0-9]+", x)
                           else str(x) for x in items) + "]"


def describe(req):
    source = req["source"]
    filename = req.get("filename", "model.py")
    backend = req.get("backend", "opencl")
    seed = int(req.get("seed", 0))
    mf = modfile.ModelFile(source, filename)
    sets = {}
    for k, v in req.get("set", {}).items():
        if k not in mf.free:
            raise ModuleError(f"--set {k}: {filename} has no free constant {k} (it has: "
                              f"{', '.join(sorted(mf.free)) or 'none'})")
        sets[k] = type(mf.free[k])(v)
    cap = int(req.get("max_elements", 1 << 26))
    consts, _ = fit(mf, sets, seed, int(req.get("fit", 0)), cap, set(sets))
    real = Shapes(mf, changed(mf, consts), seed, real=True)
    rec, out_refs, outs = trace.trace_forward(real.model, real.items, filename)
    for i, t in enumerate(outs):
        if t.numel() > cap:
            raise ModuleError(f"output {i} has {t.numel()} elements ({list(t.shape)}), over the limit of {cap}; "
                              "set smaller sizes with --set NAME=VALUE")
        dtype_name(t, f"output {i}")
    real.outputs = outs
    probes = probes_of(mf, consts, seed)
    exprs = shape_exprs(consts, real, probes)
    # Tensor inputs keep their position in get_inputs() (numbers among them are scalars).
    items = real.items
    in_names, out_names, st_names = names_for(real.model, items, outs, real.state)
    # Sizes: the free integer constants (positive), and a size of its own for any dim no
    # expression of them gives.
    size_names = {k: v for k, v in consts.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    fixed = {k: v for k, v in consts.items() if k not in size_names}
    derived = {}

    def dims_of(what, key, shape, buf):
        ex = exprs.get((what, key)) or [str(d) for d in shape]
        out = []
        for j, (e, d) in enumerate(zip(ex, shape)):
            if e is None:
                name = identifier(f"{buf}_d{j}", "d")
                derived[name] = (what, key, j)
                size_names[name] = int(d)
                out.append(name)
            else:
                out.append(e)
        exprs[(what, key)] = out  # the generators write these names
        return out

    buffers, scalars, inputs = [], [], []
    for i, x in enumerate(items):
        if isinstance(x, torch.Tensor):
            rec_entry = real.record.get(id(x))
            probe_recs = []
            for probe, sh in probes:
                px = sh.items[i] if i < len(sh.items) else None
                probe_recs.append((probe, sh.record.get(id(px)) if isinstance(px, torch.Tensor) else None))
            fill = fill_of(rec_entry, x, consts, probe_recs)
            shape = dims_of("input", i, x.shape, in_names[i])
            buffers.append((in_names[i], dtype_name(x, f"input {i}"), shape, "in", fill, i))
        else:
            scalars.append((in_names[i], "f32" if isinstance(x, float) else "i32", x))
        inputs.append(in_names[i])
    state_map = {}
    for k, t in real.state:
        shape = dims_of("parameter", k, t.shape, st_names[k])
        buffers.append((st_names[k], dtype_name(t, f"parameter {k}"), shape or ["1"], "in", "module", None))
        state_map[st_names[k]] = k
    for i, t in enumerate(outs):
        shape = dims_of("output", i, t.shape, out_names[i])
        buffers.append((out_names[i], dtype_name(t, f"output {i}"), shape or ["1"], "out", None, None))
    # Seed kernel.
    from kforge_torch.recognize import Names, recognize
    names = Names({i: n for i, n in enumerate(in_names)}, st_names, out_names, exprs)
    names.consts = size_names
    # A second size set, for validation only.
    all_exprs = [e for b in buffers for e in b[2]]
    alt, alt_why = check_set(mf, consts, seed, all_exprs) if req.get("check_set", True) else (None, "not asked")
    # Numbers in forward's operations that change with the sizes (a mean's divisor), from a trace
    # at the other size set: the kernel computes them from the sizes.
    names.size_consts = set()
    if alt is not None:
        sh_alt = Shapes(mf, changed(mf, alt), seed, real=True)
        rec_alt, _, _ = trace.trace_forward(sh_alt.model, sh_alt.items, filename)
        if [n.full for n in rec.nodes] == [n.full for n in rec_alt.nodes]:
            for n1, n2 in zip(rec.nodes, rec_alt.nodes):
                for j, (x1, x2) in enumerate(zip(n1.args, n2.args)):
                    if (isinstance(x1, (int, float)) and isinstance(x2, (int, float)) and not isinstance(x1, bool)
                            and x1 != x2):
                        names.size_consts.add((id(n1), j))
    seed_kernel, why = recognize(rec, out_refs, outs, names, backend)
    sets_out = [("main", True, dict(size_names))]
    if alt is not None:
        alt_sizes = {k: alt.get(k, v) for k, v in size_names.items() if k not in derived}
        if derived:
            sh = Shapes(mf, changed(mf, alt), seed)
            if sh.outputs is None:
                sh = Shapes(mf, changed(mf, alt), seed, real=True)
                with torch.no_grad():
                    sh.outputs = modfile.tensors_of(sh.model(*sh.items), "forward()")
            tens = {(w, k): t for w, k, t in sh.tensors()}
            for name, (what, key, j) in derived.items():
                alt_sizes[name] = int(tens[(what, key)].shape[j])
        if all(v > 0 for v in alt_sizes.values()):
            sets_out.append(("check", False, alt_sizes))
    return {"mf": mf, "consts": consts, "size_names": size_names, "fixed": fixed, "buffers": buffers,
            "scalars": scalars, "inputs": inputs, "outputs": out_names, "state": state_map, "sets": sets_out,
            "alt_why": alt_why, "seed": seed_kernel, "why": why, "backend": backend, "filename": filename,
            "model": real.model, "outs": outs, "rec": rec}


def tolerance(d):
    """KernelBench checks with atol = rtol = 1e-2; kforge asks 1e-3 unless sums run long."""
    big = any(n.op in ("mm", "bmm", "sum", "mean", "cumsum", "cumprod", "norm", "linalg_vector_norm",
                       "native_batch_norm", "native_group_norm", "native_layer_norm", "_softmax", "_log_softmax",
                       "var", "std", "mse_loss", "nll_loss_forward", "smooth_l1_loss", "prod")
              for n in d["rec"].nodes)
    return (1e-2, 1e-2) if big else (1e-3, 1e-3)


def problem_yaml(d, name):
    mf = d["mf"]
    doc = (mf.tree.body[0].value.value if mf.tree.body and isinstance(mf.tree.body[0], __import__("ast").Expr)
           and isinstance(getattr(mf.tree.body[0], "value", None), __import__("ast").Constant) else "")
    cls_doc = ""
    for node in mf.tree.body:
        if isinstance(node, __import__("ast").ClassDef) and node.name == "Model":
            cls_doc = __import__("ast").get_docstring(node) or ""
    ops = sorted({n.op for n in d["rec"].nodes})
    desc = f"PyTorch module {d['filename']} (KernelBench format). {(cls_doc or doc).strip()} forward() runs: " \
           f"{', '.join(ops)}. Write a kernel computing the same outputs from the same inputs."
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in d["model"].modules()):
        desc += " Dropout runs as the identity (its mask would make the answer random)."
    atol, rtol = tolerance(d)
    lines = [f"# Imported by `kforge import` from {d['filename']}. The reference is the module itself, run by",
             "# PyTorch in a jailed process on the worker; its eager time is the baseline.",
             f"name: {name}", f"backend: {d['backend']}", f"description: {yaml_str(desc[:4000])}", "sizes:"]
    for sname, bench, sizes in d["sets"]:
        body = ", ".join(f"{k}: {v}" for k, v in sizes.items())
        lines.append(f"  - {{name: {sname}, bench: {'true' if bench else 'false'}, sizes: {{{body}}}}}")
    if d["scalars"]:
        lines.append("scalars:")
        for n, dt, v in d["scalars"]:
            lines.append(f"  {n}: {{dtype: {dt}, value: {v}}}")
    lines.append("buffers:")
    for n, dt, shape, role, fill, _ in d["buffers"]:
        f = f", fill: {yaml_str(fill)}" if fill else ""
        lines.append(f"  {n}: {{dtype: {dt}, shape: {flow(shape)}, role: {role}{f}}}")
    lines.append(f"check: {{atol: {atol}, rtol: {rtol}, trials: 3}}")
    lines.append("reference:")
    lines.append("  pytorch: model.py")
    lines.append(f"  inputs: {flow(d['inputs'])}")
    lines.append(f"  outputs: {flow(d['outputs'])}")
    if d["state"]:
        lines.append("  state: {" + ", ".join(f"{b}: {yaml_str(k)}" for b, k in d["state"].items()) + "}")
    consts = [k for k in d["size_names"] if k in d["mf"].free]
    lines.append(f"  constants: {flow(consts)}")
    if d["fixed"]:
        lines.append("  fixed: {" + ", ".join(f"{k}: {v}" for k, v in d["fixed"].items()) + "}")
    s = d["seed"]
    files = {}
    if s is not None:
        ext = "cu" if d["backend"] == "cuda" else "cl"
        files[f"seed.{ext}"] = s.source
        lines.append("seed:")
        lines.append(f"  source: seed.{ext}")
        lines.append(f"  # template: {s.family}")
        lines.append("  params: {" + ", ".join(f"{k}: {flow(v)}" for k, v in s.params.items()) + "}")
        if s.constraints:
            lines.append(f"  constraints: {flow(s.constraints)}")
        if s.scratch:
            lines.append("  scratch:")
            for sc in s.scratch:
                lines.append(f"    {sc['name']}: {{dtype: {sc['dtype']}, shape: {flow(sc['shape'])}}}")
        lines.append("  launches:")
        for la in s.launches:
            parts = [f"kernel: {la['kernel']}"]
            for key in ("global", "local", "grid", "block"):
                if key in la:
                    parts.append(f"{key}: {flow(la[key])}")
            parts.append(f"args: {flow(la['args'])}")
            lines.append("    - {" + ", ".join(parts) + "}")
    files["problem.yaml"] = "\n".join(lines) + "\n"
    files["model.py"] = mf.source
    return files


def import_request(req):
    d = describe(req)
    name = identifier(os.path.splitext(d["filename"])[0].lower(), "kb")
    files = problem_yaml(d, req.get("name") or name)
    summary = {"family": d["seed"].family if d["seed"] is not None else None, "why": d["why"],
               "sizes": d["sets"][0][2], "check_set": len(d["sets"]) > 1, "check_why": d["alt_why"],
               "outputs": [list(t.shape) for t in d["outs"]]}
    return {"files": files, "summary": summary}
