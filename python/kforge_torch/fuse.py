"""Fuses a forward made of elementwise operations and reductions over one set of axes into one
kernel (two for a reduction to a scalar): the elementwise, normalisation, softmax, reduction and
loss families of KernelBench.

The forward's graph is evaluated symbolically over an iteration space F (the shape of its largest
tensor). Every tensor becomes an expression evaluated at a coordinate of F: a load of an input (or
a state_dict entry) broadcast into F, a constant, the coordinate itself, or a reduction's result,
which is per group (the coordinates of F outside the reduced axes D). Reductions may depend on
earlier ones (softmax: max, then the sum of exp(x - max); layer norm: mean, then variance): at
most three levels. The output is a tensor of F's size (written at every coordinate), one value per
group, or one value (a last reduction over the groups: a loss's mean).

What does not fit raises Unsupported with what it met; the recogniser then tries other families.
"""

import math

import torch


class Unsupported(Exception):
    pass


# --- expressions -------------------------------------------------------------------------------
# ("leaf", n) a load of leaf n at the current coordinate; ("c", v) a constant; ("coord", a) the
# coordinate along axis a; ("red", j) reduction j's result for the current group; ("fn", f, args)
# an operation (see C_OPS).

C_OPS = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "neg": "(-{0})", "abs": "fabs({0})", "exp": "exp({0})", "log": "log({0})", "sqrt": "sqrt({0})",
    "rsqrt": "(1.0f / sqrt({0}))", "tanh": "tanh({0})", "sigmoid": "(1.0f / (1.0f + exp(-{0})))",
    "relu": "fmax({0}, 0.0f)", "erf": "erf({0})", "sin": "sin({0})", "cos": "cos({0})",
    "log1p": "log1p({0})", "expm1": "expm1({0})", "reciprocal": "(1.0f / {0})", "pow": "pow({0}, {1})",
    "max": "fmax({0}, {1})", "min": "fmin({0}, {1})", "where": "(({0}) ? ({1}) : ({2}))",
    "gt": "(({0}) > ({1}))", "lt": "(({0}) < ({1}))", "ge": "(({0}) >= ({1}))", "le": "(({0}) <= ({1}))",
    "eq": "(({0}) == ({1}))", "ne": "(({0}) != ({1}))", "not": "(!({0}))", "and": "(({0}) && ({1}))",
    "or": "(({0}) || ({1}))", "float": "((float)({0}))", "sign": "(({0} > 0.0f) - ({0} < 0.0f))",
    "square": "({0} * {0})",
}


class Sym(float):
    """A number in the trace that follows the sizes (KL's batchmean divides by the batch): the
    product of the iteration space's dims `axes`, whatever the size set."""

    def __new__(cls, value, axes):
        obj = super().__new__(cls, value)
        obj.axes = tuple(axes)
        return obj


def fn(name, *args):
    return ("fn", name) + tuple(args)


def const(v):
    return ("c", float(v))


def levels_in(e, reds):
    """The highest level of the reductions an expression reads (0: none)."""
    if e[0] == "red":
        return reds[e[1]]["level"]
    if e[0] == "fn":
        return max([0] + [levels_in(a, reds) for a in e[2:]])
    return 0


def reads_full(e, leaves):
    """Whether an expression depends on a coordinate inside a group (a full-shape load)."""
    if e[0] == "leaf":
        return leaves[e[1]]["full"]
    if e[0] == "coord":
        return True
    if e[0] == "fn":
        return any(reads_full(a, leaves) for a in e[2:])
    return False


class Val:
    """A tensor of the graph: its expression, shape and, for each of its dims, the axis of F it
    runs along (None: a broadcast dim of size 1). A bare load of an input also knows which of the
    input's dims each of its dims is (`dims`; None for a dim a view inserted), so that a view
    (x.unsqueeze(1)) loads along the axes the view puts it on."""

    def __init__(self, expr, shape, align, dtype=torch.float32, dims=None):
        self.expr, self.shape, self.align, self.dtype = expr, tuple(shape), list(align), dtype
        self.dims = dims


class Graph:
    def __init__(self, F):
        self.F = tuple(F)
        self.n = len(F)
        self.leaves = []     # {"ref": Ref, "align": [...], "shape": (...), "full": bool}
        self.reds = []       # {"op", "arg", "level", "index": bool}
        self.D = None        # the reduced axes (a sorted tuple), once a reduction is seen
        self.final = None    # (op, expr) a reduction over the groups, to one value

    # -- values of inputs and state
    def leaf(self, ref, align=None, view=None):
        """A load of `ref`: its dims run along F's axes `align` (None: broadcast; a tuple of axes:
        one dim spanning them, row-major). `view` = (shape, align) of the value it gives, when
        that is not the tensor's own (a channel weight seen as (C, 1, 1))."""
        shape = tuple(ref.shape)
        if align is None:
            align = self.right_align(shape)
        full = tuple(shape) == self.F and align == list(range(self.n))
        vshape, valign = view if view is not None else (shape, align)
        dims = list(range(len(shape))) if view is None else None
        for i, lf in enumerate(self.leaves):
            if lf["ref"] is ref and lf["align"] == align:
                return Val(("leaf", i), vshape, valign, ref.dtype, dims)
        self.leaves.append({"ref": ref, "align": align, "shape": shape, "full": full})
        return Val(("leaf", len(self.leaves) - 1), vshape, valign, ref.dtype, dims)

    def settle(self, v):
        """A bare load seen through views: the load along the axes the views put its dims on."""
        if not isinstance(v, Val) or v.expr[0] != "leaf" or v.dims is None:
            return v
        lf = self.leaves[v.expr[1]]
        align = [None] * len(lf["shape"])
        for j, d in enumerate(v.dims):
            if d is not None and lf["shape"][d] != 1:  # a size-1 dim of the input stays broadcast
                align[d] = v.align[j]
        if align == lf["align"]:
            return v
        return self.leaf(lf["ref"], align, (v.shape, v.align))

    def coord(self, axis):
        """The coordinate along F's axis, as a value."""
        shape = [1] * self.n
        shape[axis] = self.F[axis]
        align = [None] * self.n
        align[axis] = axis
        return Val(("coord", axis), shape, align, torch.int64)

    def right_align(self, shape):
        if len(shape) > self.n:
            raise Unsupported(f"a tensor of {len(shape)} dims in an iteration space of {self.n}")
        align = []
        off = self.n - len(shape)
        for j, s in enumerate(shape):
            a = off + j
            if s == self.F[a]:
                align.append(a)
            elif s == 1:
                align.append(None)
            else:
                raise Unsupported(f"shape {list(shape)} does not broadcast to {list(self.F)}")
        return align

    # -- elementwise
    def positional(self, shape):
        """Each dim's axis of F by its place from the right (broadcasting's rule); None for 1."""
        off = self.n - len(shape)
        if off < 0:
            raise Unsupported(f"a tensor of {len(shape)} dims in an iteration space of {self.n}")
        out = []
        for j, s in enumerate(shape):
            a = off + j
            if s == 1:
                out.append(None)
            elif s == self.F[a]:
                out.append(a)
            else:
                raise Unsupported(f"shape {list(shape)} does not broadcast to {list(self.F)}")
        return out

    # -- elementwise
    def combine(self, name, *vals):
        shapes = [v for v in vals if isinstance(v, Val)]
        if not shapes:
            raise Unsupported("an operation on constants only")
        n = max(len(v.shape) for v in shapes)
        shape = [1] * n
        for v in shapes:
            off = n - len(v.shape)
            for j, s in enumerate(v.shape):
                if s != 1:
                    if shape[off + j] not in (1, s):
                        raise Unsupported(f"shapes {[list(x.shape) for x in shapes]} do not broadcast")
                    shape[off + j] = s
        exprs = []
        for v in vals:
            if isinstance(v, Sym):
                exprs.append(("size", v.axes))
            elif isinstance(v, Val):
                # Broadcasting aligns dims from the right: that decides which axis of F each runs on.
                if v.dims is not None and v.expr[0] == "leaf":
                    v = self.settle(Val(v.expr, v.shape, self.positional(v.shape), v.dtype, v.dims))
                exprs.append(v.expr)
            else:
                exprs.append(const(v))
        dtype = torch.float32
        if name in ("gt", "lt", "ge", "le", "eq", "ne", "not", "and", "or"):
            dtype = torch.bool
        return Val(fn(name, *exprs), shape, self.positional(shape), dtype)

    # -- reductions
    def reduce(self, op, v, dims, keepdim, index=False):
        if not isinstance(v, Val):
            raise Unsupported("a reduction of a constant")
        if v.shape != self.F or not all(a == i or (a is None and self.F[i] == 1) for i, a in enumerate(v.align)):
            # A reduction of per-group values, to one value: the groups' final reduction.
            if dims in (None, []) or set(d % max(1, len(v.shape)) for d in dims) == set(range(len(v.shape))):
                if self.final is not None:
                    raise Unsupported("two reductions over the groups")
                if reads_full(v.expr, self.leaves):
                    raise Unsupported("a reduction over all axes of a tensor that is not the iteration space")
                self.final = (op, v.expr, self.groups_of(v))
                return Val(("final",), (), [])
            raise Unsupported(f"a reduction of a {list(v.shape)} tensor in a {list(self.F)} space")
        D = tuple(range(self.n)) if dims in (None, []) else tuple(sorted(d % self.n for d in dims))
        if self.D is None:
            self.D = D
        elif self.D != D:
            raise Unsupported(f"reductions over different axes ({list(self.D)} and {list(D)})")
        level = 1 + levels_in(v.expr, self.reds)
        if level > 3:
            raise Unsupported("more than three levels of reduction")
        self.reds.append({"op": op, "arg": v.expr, "level": level, "index": index})
        j = len(self.reds) - 1
        if keepdim:
            shape = [1 if a in D else s for a, s in enumerate(self.F)]
            align = [None if a in D else a for a in range(self.n)]
        else:
            shape = [s for a, s in enumerate(self.F) if a not in D]
            align = [a for a in range(self.n) if a not in D]
        return Val(("red", j), shape, align, torch.int64 if index else torch.float32)

    def groups_of(self, v):
        """How many groups a per-group value spans (its numel)."""
        return math.prod(v.shape) if v.shape else 1


# --- from aten nodes ---------------------------------------------------------------------------

VIEW_OPS = {"view", "_unsafe_view", "reshape", "alias", "clone", "detach", "lift_fresh", "contiguous",
            "_to_copy", "to"}
UNARY = {"neg": "neg", "abs": "abs", "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt",
         "tanh": "tanh", "sigmoid": "sigmoid", "relu": "relu", "erf": "erf", "sin": "sin", "cos": "cos",
         "log1p": "log1p", "expm1": "expm1", "reciprocal": "reciprocal", "logical_not": "not", "sign": "sign"}
BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "max", "minimum": "min",
          "gt": "gt", "lt": "lt", "ge": "ge", "le": "le", "eq": "eq", "ne": "ne", "logical_and": "and",
          "logical_or": "or", "pow": "pow"}


def live_nodes(nodes, out_refs):
    """The nodes the outputs depend on (a BatchNorm's running-statistics update is not)."""
    need = {id(r) for r in out_refs if r is not None}
    keep = []
    for node in reversed(nodes):
        if any(id(o) in need for o in node.outs):
            keep.append(node)
            stack = list(node.args) + list(node.kwargs.values())
            while stack:
                a = stack.pop()
                if isinstance(a, list):
                    stack.extend(a)
                elif hasattr(a, "kind"):
                    need.add(id(a))
    return list(reversed(keep))


def sym_axes(F, value):
    """Axes of F whose dims multiply to `value`: one axis, a run of them, or all."""
    for a, d in enumerate(F):
        if d == value:
            return (a,)
    for i in range(len(F)):
        for j in range(i + 2, len(F) + 1):
            if math.prod(F[i:j]) == value:
                return tuple(range(i, j))
    return None


def build(nodes, out_refs, inputs, state, size_consts=None):
    """The fused graph of a forward with one output; Unsupported when it is not of this family.
    `size_consts`: {(id(node), argument index)} of the numbers that follow the sizes."""
    if len(out_refs) != 1 or out_refs[0] is None:
        raise Unsupported("not one tensor out")
    nodes = live_nodes(nodes, out_refs)
    # The iteration space: the largest tensor read.
    tensors = [r for n in nodes for r in n.args if hasattr(r, "kind") and r.kind in ("in", "st")]
    tensors += [out_refs[0]]
    big = max(tensors, key=lambda r: (math.prod(r.shape) if r.shape else 1))
    g = Graph(big.shape if big.shape else (1,))
    vals = {}

    def val(a):
        if hasattr(a, "kind"):
            if id(a) in vals:
                return vals[id(a)]
            if a.kind in ("in", "st"):
                if a.dtype not in (torch.float32, torch.int64, torch.int32, torch.bool, torch.uint8):
                    raise Unsupported(f"a {a.dtype} tensor")
                v = g.leaf(a)
                vals[id(a)] = v
                return v
            raise Unsupported(f"a tensor made inside forward ({a})")
        if isinstance(a, Sym):
            return a
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return float(a)
        if isinstance(a, bool):
            return float(a)
        raise Unsupported(f"an argument {a!r}")

    for node in nodes:
        op, a = node.op, list(node.args)
        for j, x in enumerate(a):
            if size_consts and (id(node), j) in size_consts and isinstance(x, (int, float)):
                axes = sym_axes(g.F, x)
                if axes is None:
                    raise Unsupported(f"a number ({x}) that follows the sizes in a way not expressed")
                a[j] = Sym(x, axes)
        kw = node.kwargs
        out = node.outs[0] if node.outs else None
        if op in VIEW_OPS:
            v = val(a[0])
            if isinstance(v, float):
                vals[id(out)] = v
                continue
            new = tuple(out.shape)
            if tuple(v.shape) != new:
                v = reshape(g, v, new)
            vals[id(out)] = v
        elif op == "unsqueeze":
            v = val(a[0])
            d = a[1] % (len(v.shape) + 1)
            dims = None if v.dims is None else v.dims[:d] + [None] + v.dims[d:]
            vals[id(out)] = Val(v.expr, v.shape[:d] + (1,) + v.shape[d:], v.align[:d] + [None] + v.align[d:], v.dtype,
                                dims)
        elif op == "squeeze":
            v = val(a[0])
            dims = [a[1] % len(v.shape)] if len(a) > 1 and isinstance(a[1], int) else \
                [d for d, s in enumerate(v.shape) if s == 1]
            keep = [d for d in range(len(v.shape)) if not (d in dims and v.shape[d] == 1)]
            vals[id(out)] = Val(v.expr, [v.shape[d] for d in keep], [v.align[d] for d in keep], v.dtype,
                                None if v.dims is None else [v.dims[d] for d in keep])
        elif op == "expand":
            v = val(a[0])
            vals[id(out)] = expand(g, v, tuple(out.shape))
        elif op in UNARY:
            vals[id(out)] = g.combine(UNARY[op], val(a[0]))
        elif op in BINARY:
            x, y = val(a[0]), val(a[1])
            alpha = kw.get("alpha", a[2] if len(a) > 2 and op in ("add", "sub") else 1)
            if op in ("add", "sub") and alpha != 1:
                y = g.combine("mul", y, float(alpha)) if isinstance(y, Val) else y * alpha
            if op == "pow" and not isinstance(y, Val) and y == 2:
                vals[id(out)] = g.combine("square", x)
            elif op == "pow" and not isinstance(y, Val) and y == 3:
                vals[id(out)] = g.combine("mul", g.combine("square", x), x)
            else:
                vals[id(out)] = g.combine(BINARY[op], x, y)
        elif op == "rsub":
            vals[id(out)] = g.combine("sub", val(a[1]), val(a[0]))
        elif op in ("clamp", "clamp_min", "clamp_max", "hardtanh"):
            v = val(a[0])
            lo = a[1] if len(a) > 1 else kw.get("min")
            hi = a[2] if len(a) > 2 else kw.get("max")
            if op == "clamp_max":
                lo, hi = None, a[1]
            if op == "hardtanh":
                lo, hi = (a[1] if len(a) > 1 else -1.0), (a[2] if len(a) > 2 else 1.0)
            if lo is not None:
                v = g.combine("max", v, val(lo))
            if hi is not None:
                v = g.combine("min", v, val(hi))
            vals[id(out)] = v
        elif op == "leaky_relu":
            x = val(a[0])
            slope = a[1] if len(a) > 1 else 0.01
            vals[id(out)] = g.combine("where", g.combine("gt", x, 0.0), x, g.combine("mul", x, float(slope)))
        elif op == "elu":
            x = val(a[0])
            alpha = a[1] if len(a) > 1 else 1.0
            scale = a[2] if len(a) > 2 else 1.0
            iscale = a[3] if len(a) > 3 else 1.0
            neg = g.combine("mul", g.combine("expm1", g.combine("mul", x, float(iscale))), float(alpha * scale))
            vals[id(out)] = g.combine("where", g.combine("gt", x, 0.0), g.combine("mul", x, float(scale)), neg)
        elif op == "gelu":
            x = val(a[0])
            approx = kw.get("approximate", a[1] if len(a) > 1 else "none")
            if approx == "tanh":
                inner = g.combine("mul", g.combine("add", x, g.combine("mul", g.combine("mul", g.combine("square", x), x),
                                                                        0.044715)), math.sqrt(2 / math.pi))
                vals[id(out)] = g.combine("mul", g.combine("mul", x, 0.5), g.combine("add", g.combine("tanh", inner), 1.0))
            else:
                vals[id(out)] = g.combine("mul", g.combine("mul", x, 0.5),
                                          g.combine("add", g.combine("erf", g.combine("mul", x, 1 / math.sqrt(2))), 1.0))
        elif op == "silu":
            x = val(a[0])
            vals[id(out)] = g.combine("mul", x, g.combine("sigmoid", x))
        elif op == "hardsigmoid":
            x = val(a[0])
            vals[id(out)] = g.combine("min", g.combine("max", g.combine("add", g.combine("div", x, 6.0), 0.5), 0.0), 1.0)
        elif op == "hardswish":
            x = val(a[0])
            hs = g.combine("min", g.combine("max", g.combine("add", g.combine("div", x, 6.0), 0.5), 0.0), 1.0)
            vals[id(out)] = g.combine("mul", x, hs)
        elif op == "softplus":
            x = val(a[0])
            beta = a[1] if len(a) > 1 else 1.0
            thr = a[2] if len(a) > 2 else 20.0
            bx = g.combine("mul", x, float(beta))
            soft = g.combine("div", g.combine("log1p", g.combine("exp", bx)), float(beta))
            vals[id(out)] = g.combine("where", g.combine("gt", bx, float(thr)), x, soft)
        elif op == "where":
            vals[id(out)] = g.combine("where", val(a[0]), val(a[1]), val(a[2]))
        elif op == "xlogy":
            x, y = val(a[0]), val(a[1])
            vals[id(out)] = g.combine("where", g.combine("eq", x, 0.0), 0.0, g.combine("mul", x, g.combine("log", y)))
        elif op in ("sum", "mean", "amax", "amin", "prod") or (op in ("max", "min") and node.overload == "dim"):
            v = val(a[0])
            dims = a[1] if len(a) > 1 else kw.get("dim")
            if isinstance(dims, int):
                dims = [dims]
            keep = a[2] if len(a) > 2 else kw.get("keepdim", False)
            kind = {"amax": "max", "amin": "min"}.get(op, op)
            if isinstance(v, Val) and v.dtype == torch.bool:
                v = g.combine("float", v)
            r = g.reduce(kind, v, dims, keep)
            vals[id(out)] = r
            if op in ("max", "min") and len(node.outs) > 1:
                vals[id(node.outs[1])] = g.reduce("arg" + op, v, dims, keep, index=True)
        elif op in ("max", "min") and len(a) == 1:
            vals[id(out)] = g.reduce(op, val(a[0]), None, False)
        elif op in ("argmax", "argmin"):
            v = val(a[0])
            dim = a[1] if len(a) > 1 else kw.get("dim")
            if dim is None:
                raise Unsupported("an arg-reduction over every axis")
            keep = a[2] if len(a) > 2 else kw.get("keepdim", False)
            vals[id(out)] = g.reduce(op, v, [dim], keep, index=True)
        elif op in ("norm", "linalg_vector_norm"):
            v = val(a[0])
            p = a[1] if len(a) > 1 and a[1] is not None else 2
            dims = a[2] if len(a) > 2 else kw.get("dim")
            keep = a[3] if len(a) > 3 else kw.get("keepdim", False)
            if p == 2 or p == "fro":
                vals[id(out)] = g.combine("sqrt", g.reduce("sum", g.combine("square", v), dims, keep))
            elif p == 1:
                vals[id(out)] = g.reduce("sum", g.combine("abs", v), dims, keep)
            elif p == float("inf"):
                vals[id(out)] = g.reduce("max", g.combine("abs", v), dims, keep)
            else:
                raise Unsupported(f"a {p}-norm")
        elif op in ("var", "std"):
            v = val(a[0])
            dims = a[1] if len(a) > 1 else kw.get("dim")
            correction = kw.get("correction", 1 if kw.get("unbiased", True) else 0)
            keep = kw.get("keepdim", a[3] if len(a) > 3 else False)
            mean = g.reduce("mean", v, dims, True)
            ss = g.reduce("sum", g.combine("square", g.combine("sub", v, mean)), dims, keep)
            count = math.prod(g.F[d] for d in g.D)
            var = g.combine("div", ss, float(max(1, count - correction)))
            vals[id(out)] = var if op == "var" else g.combine("sqrt", var)
        elif op == "_softmax" or op == "_log_softmax":
            x = val(a[0])
            d = a[1]
            m = g.reduce("max", x, [d], True)
            e = g.combine("exp", g.combine("sub", x, m))
            s = g.reduce("sum", e, [d], True)
            if op == "_softmax":
                vals[id(out)] = g.combine("div", e, s)
            else:
                vals[id(out)] = g.combine("sub", g.combine("sub", x, m), g.combine("log", s))
        elif op == "native_layer_norm":
            x = val(a[0])
            k = len(a[1])
            dims = list(range(len(x.shape) - k, len(x.shape)))
            mean = g.reduce("mean", x, dims, True)
            var = g.reduce("mean", g.combine("square", g.combine("sub", x, mean)), dims, True)
            y = g.combine("mul", g.combine("sub", x, mean), g.combine("rsqrt", g.combine("add", var, float(a[4]))))
            if a[2] is not None:
                y = g.combine("mul", y, val(a[2]))
            if a[3] is not None:
                y = g.combine("add", y, val(a[3]))
            vals[id(out)] = y
        elif op == "native_batch_norm" or op == "_native_batch_norm_legit":
            x = val(a[0])
            training = a[5] if op == "native_batch_norm" else a[5]
            if not training:
                raise Unsupported("batch norm in eval mode")
            eps = a[7]
            dims = [d for d in range(len(x.shape)) if d != 1]
            mean = g.reduce("mean", x, dims, True)
            var = g.reduce("mean", g.combine("square", g.combine("sub", x, mean)), dims, True)
            y = g.combine("mul", g.combine("sub", x, mean), g.combine("rsqrt", g.combine("add", var, float(eps))))
            c = channel_axis(g, x)
            per_channel = ([g.F[c]] + [1] * (g.n - c - 1), [c] + [None] * (g.n - c - 1))
            if a[1] is not None:
                y = g.combine("mul", y, g.leaf(a[1], [c], per_channel))
            if a[2] is not None:
                y = g.combine("add", y, g.leaf(a[2], [c], per_channel))
            vals[id(out)] = y
        elif op == "native_group_norm":
            x = val(a[0])
            n, c, hw, groups, eps = a[3], a[4], a[5], a[6], a[7]
            if g.reds or x.shape != g.F:
                raise Unsupported("group norm after other work")
            # The space (N, G, C/G, HW): the same elements in the same order.
            g2 = Graph((n, groups, c // groups, hw))
            g.__dict__.update(g2.__dict__)
            g.leaf(a[0], list(range(4)))
            g.leaves[-1]["full"] = True
            g.leaves[-1]["flat"] = True
            x = Val(("leaf", len(g.leaves) - 1), g.F, list(range(4)), torch.float32)
            mean = g.reduce("mean", x, [2, 3], True)
            var = g.reduce("mean", g.combine("square", g.combine("sub", x, mean)), [2, 3], True)
            y = g.combine("mul", g.combine("sub", x, mean), g.combine("rsqrt", g.combine("add", var, float(eps))))
            per_group = ((groups, c // groups, 1), [1, 2, None])
            if a[1] is not None:
                y = g.combine("mul", y, g.leaf(a[1], [(1, 2)], per_group))
            if a[2] is not None:
                y = g.combine("add", y, g.leaf(a[2], [(1, 2)], per_group))
            vals[id(out)] = y
        elif op == "mse_loss":
            d = g.combine("sub", val(a[0]), val(a[1]))
            vals[id(out)] = loss_reduce(g, g.combine("square", d), a[2] if len(a) > 2 else 1)
        elif op in ("smooth_l1_loss", "huber_loss"):
            d = g.combine("abs", g.combine("sub", val(a[0]), val(a[1])))
            beta = float(a[3]) if len(a) > 3 else 1.0
            if op == "smooth_l1_loss":
                inner = g.combine("div", g.combine("mul", g.combine("square", d), 0.5), beta)
                outer = g.combine("sub", d, 0.5 * beta)
            else:
                inner = g.combine("mul", g.combine("square", d), 0.5)
                outer = g.combine("mul", g.combine("sub", d, 0.5 * beta), beta)
            vals[id(out)] = loss_reduce(g, g.combine("where", g.combine("lt", d, beta), inner, outer),
                                        a[2] if len(a) > 2 else 1)
        elif op == "nll_loss_forward" or op == "nll_loss":
            logp = val(a[0])
            if a[2] is not None:
                raise Unsupported("class weights in nll_loss")
            if len(logp.shape) != 2 or not hasattr(a[1], "kind") or a[1].kind != "in":
                raise Unsupported("nll_loss over more than (batch, classes) of an input's targets")
            # One target per row: it runs along the batch axis (not broadcast from the right).
            target = g.leaf(a[1], [0], ((g.F[0], 1), [0, None]))
            picked = g.reduce("sum", g.combine("where", g.combine("eq", g.coord(1), target), logp, 0.0), [1], False)
            vals[id(out)] = loss_reduce(g, g.combine("neg", picked), a[3])
        else:
            raise Unsupported(f"the operation aten.{node.full}")
    return g, vals[id(out_refs[0])]


def channel_axis(g, x):
    if len(x.shape) < 2 or x.align[1] is None:
        raise Unsupported("batch norm of a tensor without channels")
    return x.align[1]


def loss_reduce(g, v, reduction):
    if reduction == 0:
        return v
    r = g.reduce("sum" if reduction == 2 else "mean", v, None, False)
    return r


def reshape(g, v, new):
    """A view of `v` with shape `new`: size-1 dims come and go; a full tensor may take another
    shape with the same elements in the same order (the iteration space follows while nothing has
    been reduced yet, and an output may take any such shape)."""
    squeezed = [(s, a) for s, a in zip(v.shape, v.align) if s != 1]
    target = [s for s in new if s != 1]
    if [s for s, _ in squeezed] == target:
        it = iter(squeezed)
        align = []
        for s in new:
            if s == 1:
                align.append(None)
            else:
                align.append(next(it)[1])
        return Val(v.expr, new, align, v.dtype)
    if math.prod(v.shape) == math.prod(g.F) and v.align == list(range(g.n)) and all(
            lf["full"] for lf in g.leaves) and not g.reds:
        # A new iteration space of the same elements in the same order.
        g.F, g.n = tuple(new), len(new)
        for lf in g.leaves:
            lf["align"] = list(range(g.n))
            lf["flat"] = True
        return Val(v.expr, new, list(range(g.n)), v.dtype)
    if math.prod(v.shape) == math.prod(g.F) and v.align == list(range(g.n)):
        out = Val(v.expr, new, list(range(len(new))), v.dtype)
        out.flat_output = True
        return out
    raise Unsupported(f"a reshape of {list(v.shape)} to {list(new)}")


def expand(g, v, new):
    off = len(new) - len(v.shape)
    align = [None] * off + list(v.align)
    shape = list(new)
    out_align = []
    for j, s in enumerate(new):
        if align[j] is not None:
            out_align.append(align[j])
        elif s == 1:
            out_align.append(None)
        else:
            a = g.n - len(new) + j
            if a < 0 or g.F[a] != s:
                raise Unsupported(f"an expand to {list(new)}")
            out_align.append(a)
    return Val(v.expr, shape, out_align, v.dtype, None if v.dims is None else [None] * off + v.dims)
