"""Which family a traced forward belongs to, and its seed kernel: fused elementwise / reduce-map
(fuse.py, fusegen.py), matrix products, scans and pooling (templates.py). None (with why) when no
template fits: then only a model writes the kernel.
"""

import math

import torch

from kforge_torch import fuse, fusegen, templates
from kforge_torch.fuse import Unsupported


class Names:
    """Buffer names and size expressions the generators write into launch plans."""

    def __init__(self, inputs, state, outputs, exprs):
        self.inputs = inputs    # position in get_inputs() -> buffer (or scalar) name
        self.state = state      # state_dict key -> buffer name
        self.outputs = outputs  # [buffer name]
        self.exprs = exprs      # (what, key) -> [dim expressions]

    def of(self, ref):
        if ref.kind == "in":
            return self.inputs[ref.key]
        if ref.kind == "st":
            return self.state[ref.key]
        raise Unsupported(f"a tensor made inside forward ({ref})")

    def shape_of(self, ref):
        what = "input" if ref.kind == "in" else "parameter"
        return self.exprs.get((what, ref.key))


def dims_exprs(shape, known_shapes, consts=None):
    """Expressions for `shape` from tensors of known expressions: the same dims, products of
    consecutive ones (a reshape that merges axes), or, dim by dim, a constant of that value or a
    dim divided by one (group norm's channels per group)."""
    found = _dims_exprs(shape, known_shapes)
    if found is not None or not consts:
        return found
    out = []
    for d in shape:
        e = next((k for k, v in consts.items() if v == d and v > 1), None)
        if e is None:
            for ints, exprs in known_shapes:
                if not exprs:
                    continue
                for i in range(len(ints)):
                    for j in range(i + 1, len(ints) + 1):
                        p = math.prod(ints[i:j])
                        if p == d and all(exprs[i:j]):
                            e = " * ".join(exprs[i:j])
                        for k, v in consts.items():
                            if e is None and v > 1 and p % v == 0 and p // v == d and all(exprs[i:j]):
                                e = f"({' * '.join(exprs[i:j])}) / {k}"
                    if e:
                        break
                if e:
                    break
        if e is None:
            if d != 1:
                return None
            e = "1"
        out.append(e)
    return out


def _dims_exprs(shape, known_shapes):
    for ints, exprs in known_shapes:
        if tuple(ints) == tuple(shape) and exprs and all(e is not None for e in exprs):
            return list(exprs)
    for ints, exprs in known_shapes:
        if not exprs or any(e is None for e in exprs):
            continue
        out, j = [], 0
        ok = True
        for d in shape:
            if d == 1:
                out.append("1")
                continue
            prod, parts = 1, []
            while j < len(ints) and prod < d:
                prod *= ints[j]
                parts.append(exprs[j])
                j += 1
            while j < len(ints) and ints[j] == 1 and prod == d:
                j += 1
            if prod != d:
                ok = False
                break
            parts = [p for p in parts if p != "1"]
            out.append(" * ".join(f"({p})" if any(c in p for c in "+-/") else p for p in parts) or "1")
        if ok and math.prod(shape) == math.prod(ints):
            return out
    return None


def out_ctype(dtype_name):
    return {"f32": "float", "i64": "long", "u8": "unsigned char", "i32": "int", "f64": "double"}.get(dtype_name)


def try_fused(rec, out_refs, outs, names, backend):
    g, out = fuse.build(rec.nodes, out_refs, None, None, getattr(names, "size_consts", None))
    leaf_names = [names.of(lf["ref"]) for lf in g.leaves]
    for lf in g.leaves:
        if lf["ref"].dtype_name not in ("f32", "i64", "i32", "u8"):
            raise Unsupported(f"a {lf['ref'].dtype} input")
    known = []
    for lf in g.leaves:
        e = names.shape_of(lf["ref"])
        known.append((lf["ref"].shape, e))
    known.append((tuple(outs[0].shape), names.exprs.get(("output", 0))))
    F_exprs = dims_exprs(g.F, known, getattr(names, "consts", None))
    if F_exprs is None:
        raise Unsupported(f"no size expressions for the iteration space {list(g.F)}")
    odt = {torch.float32: "f32", torch.int64: "i64", torch.bool: "u8", torch.int32: "i32"}.get(outs[0].dtype)
    if odt is None:
        raise Unsupported(f"a {outs[0].dtype} output")
    ctype = out_ctype(odt)
    oname = names.outputs[0]
    if not g.reds and g.final is None:
        return fusegen.map_seed(g, out, leaf_names, oname, ctype, F_exprs, backend)
    if g.final is not None:
        return fusegen.reduce_seed(g, out, leaf_names, oname, ctype, F_exprs, backend, "group")
    if g.D == tuple(range(g.n)):
        kind = "full" if math.prod(outs[0].shape) == math.prod(g.F) and outs[0].numel() > 1 else "scalar"
        return fusegen.global_seed(g, out, leaf_names, oname, ctype, F_exprs, backend, kind)
    kind = "full" if outs[0].numel() == math.prod(g.F) else "group"
    return fusegen.reduce_seed(g, out, leaf_names, oname, ctype, F_exprs, backend, kind)


def recognize(rec, out_refs, outs, names, backend):
    """(Seed, "") or (None, why no template fits)."""
    whys = []
    for attempt in (try_fused, templates.try_matmul, templates.try_scan, templates.try_pool, templates.try_conv):
        try:
            seed = attempt(rec, out_refs, outs, names, backend)
            if seed is not None:
                return seed, ""
        except Unsupported as e:
            whys.append(f"{attempt.__name__[4:]}: {e}")
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            whys.append(f"{attempt.__name__[4:]}: {type(e).__name__}: {e}")
    return None, "; ".join(whys)
