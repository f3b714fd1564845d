"""Kernels for a fused graph (fuse.py): one map kernel when nothing is reduced; a reduce-map
kernel (a work-group or a work-item per group, a knob) when the graph reduces over axes D; and,
for a reduction over everything or over the groups, partial results in a scratch buffer combined
by one more kernel.
"""

import math

from kforge_torch import codegen
from kforge_torch.codegen import Seed, flt, launch, prod_expr
from kforge_torch.fuse import C_OPS, Unsupported

INIT = {"sum": "0.0f", "mean": "0.0f", "prod": "1.0f", "max": "(-INFINITY)", "min": "INFINITY",
        "argmax": "(-INFINITY)", "argmin": "INFINITY"}


def combine(op, acc, x):
    if op in ("sum", "mean"):
        return f"{acc} + {x}"
    if op == "prod":
        return f"{acc} * {x}"
    if op == "max":
        return f"fmax({acc}, {x})"
    if op == "min":
        return f"fmin({acc}, {x})"
    raise Unsupported(op)


class Ctx:
    """How the pieces of an expression read in one place of a kernel."""

    def __init__(self, g, names, coord, flat, red, group_flat=None):
        self.g, self.names, self.coord, self.flat, self.red = g, names, coord, flat, red
        self.group_flat = group_flat
        self.axes_used = set()

    def leaf(self, n):
        lf = self.g.leaves[n]
        name = self.names[n]
        cast = "" if lf["ref"].dtype_name == "f32" else "(float)"
        if lf.get("flat") or lf["full"]:
            return f"{cast}{name}[{self.flat}]"
        idx = leaf_index(self.g, lf, self.coord)
        return f"{cast}{name}[{idx}]"


def f_arg(a):
    return f"(long)f{a}"


def leaf_index(g, lf, coord):
    """sum over the leaf's dims of coordinate * stride (broadcast dims read element 0)."""
    terms = []
    stride = []
    sizes = []
    for al in lf["align"]:
        if al is None:
            sizes.append("1")
        elif isinstance(al, tuple):
            sizes.append(" * ".join(f_arg(a) for a in al))
        else:
            sizes.append(f_arg(al))
    for j in range(len(lf["align"])):
        rest = [s for s in sizes[j + 1:] if s != "1"]
        stride.append(" * ".join(rest) if rest else "1")
    for j, al in enumerate(lf["align"]):
        if al is None:
            continue
        if isinstance(al, tuple):
            c = None
            for a in al:
                c = coord(a) if c is None else f"({c}) * {f_arg(a)} + {coord(a)}"
        else:
            c = coord(al)
        terms.append(c if stride[j] == "1" else f"({c}) * {stride[j]}")
    return " + ".join(terms) if terms else "0"


def cexpr(e, ctx):
    kind = e[0]
    if kind == "leaf":
        return ctx.leaf(e[1])
    if kind == "c":
        return flt(e[1])
    if kind == "coord":
        return f"(float){ctx.coord(e[1])}"
    if kind == "size":
        return "((float)(" + " * ".join(f_arg(a) for a in e[1]) + "))"
    if kind == "red":
        return ctx.red(e[1])
    if kind == "fn":
        args = [cexpr(a, ctx) for a in e[2:]]
        return C_OPS[e[1]].format(*args)
    raise Unsupported(f"expression {e!r}")


def uses_coords(e, g):
    """Whether an expression needs per-axis coordinates (a broadcast load or a coordinate)."""
    if e[0] == "leaf":
        lf = g.leaves[e[1]]
        return not (lf.get("flat") or lf["full"])
    if e[0] == "coord":
        return True
    if e[0] == "fn":
        return any(uses_coords(a, g) for a in e[2:])
    return False


def params_decl(g, names, outputs, scratch, backend):
    """The kernel's parameters: each distinct leaf buffer once, the outputs, scratch, the sizes."""
    seen, decl = set(), []
    for n, lf in enumerate(g.leaves):
        if names[n] in seen:
            continue
        seen.add(names[n])
        decl.append(f"GLOBAL const {codegen.CTYPES[lf['ref'].dtype_name]}* RESTRICT {names[n]}")
    for name, ctype in outputs:
        decl.append(f"GLOBAL {ctype}* RESTRICT {name}")
    for name in scratch:
        decl.append(f"GLOBAL float* RESTRICT {name}")
    decl += [f"int f{a}" for a in range(g.n)]
    args = list(dict.fromkeys(names[n] for n in range(len(g.leaves)))) + [o for o, _ in outputs] + list(scratch)
    return ", ".join(decl), args


def coords_from_flat(g, var, axes):
    """C statements: c<a> for each axis in `axes` from the flat index `var` over F."""
    lines = []
    for a in sorted(axes):
        inner = " * ".join(f_arg(b) for b in range(a + 1, g.n)) or "1"
        lines.append(f"const long c{a} = ({var} / ({inner})) % {f_arg(a)};")
    return lines


def map_seed(g, out, names, out_name, out_ctype, F_exprs, backend):
    """A kernel with nothing reduced: out[i] = EXPR(i) over F (or the output's equal-size shape)."""
    ctx = Ctx(g, names, lambda a: f"c{a}", "i", None)
    expr = cexpr(out.expr, ctx)
    need = uses_coords(out.expr, g)
    decl, args = params_decl(g, names, [(out_name, out_ctype)], [], backend)
    n = " * ".join(f_arg(a) for a in range(g.n))
    coord_lines = coords_from_flat(g, "i", range(g.n)) if need else []
    body = "\n".join("        " + c for c in coord_lines)
    src = f"""{codegen.prelude(backend)}
// Fused elementwise map over {g.n}-D shape, VEC elements per work-item, interleaved so that
// neighbouring work-items touch neighbouring elements.
KERNEL void kf_map({decl}) {{
  const long n = {n};
  for (long base = GID0; base < n; base += GSZ0 * VEC) {{
#pragma unroll
    for (int u = 0; u < VEC; ++u) {{
      const long i = base + (long)u * GSZ0;
      if (i < n) {{
{body}
        {out_name}[i] = {expr};
      }}
    }}
  }}
}}
"""
    N = prod_expr(F_exprs)
    la = launch(backend, "kf_map", f"ceil_div({N}, VEC)", "WG", args + F_exprs)
    return Seed("elementwise", src, ["kf_map"], {"WG": [32, 64, 128, 256], "VEC": [1, 2, 4, 8]}, [], [la])


def reduce_code(g, names, reds_by_level, out_expr, out_kind, out_name, group_mode):
    """The body of a reduce-map kernel for group `g` (work-group or work-item per group)."""
    D = g.D
    keep = [a for a in range(g.n) if a not in D]
    lines = []
    trailing = list(D) == list(range(g.n - len(D), g.n))
    contiguous = list(D) == list(range(D[0], D[-1] + 1))

    # Coordinates of the group (outside D) from g, and of k (inside D), and the flat index.
    def coords(var_g, var_k):
        out = []
        for a in keep:
            inner = " * ".join(f_arg(b) for b in keep if b > a) or "1"
            out.append(f"const long c{a} = ({var_g} / ({inner})) % {f_arg(a)};")
        for a in D:
            inner = " * ".join(f_arg(b) for b in D if b > a) or "1"
            out.append(f"const long c{a} = ({var_k} / ({inner})) % {f_arg(a)};")
        return out

    if trailing:
        flat = "(gi * S + k)"
    elif contiguous:
        inner = " * ".join(f_arg(b) for b in range(D[-1] + 1, g.n)) or "1"
        flat = f"((gi / ({inner})) * S * ({inner}) + k * ({inner}) + gi % ({inner}))"
    else:
        flat = " + ".join(f"c{a} * " + (" * ".join(f_arg(b) for b in range(a + 1, g.n)) or "1") for a in range(g.n))
        flat = f"({flat})"

    def red_name(j):
        return f"r{j}"

    def body_for(e):
        need = uses_coords(e, g) or not (trailing or contiguous)
        return need

    ctx = Ctx(g, names, lambda a: f"c{a}", "fi", red_name)
    for level in sorted(reds_by_level):
        reds = reds_by_level[level]
        need = any(body_for(g.reds[j]["arg"]) for j in reds)
        inits = []
        for j in reds:
            r = g.reds[j]
            inits.append(f"float a{j} = {INIT[r['op']]};")
            if r["index"]:
                inits.append(f"long x{j} = 0;")
        updates = []
        for j in reds:
            r = g.reds[j]
            v = cexpr(r["arg"], ctx)
            if r["index"]:
                cmp = ">" if r["op"] == "argmax" else "<"
                updates.append(f"{{ const float v = {v}; if (v {cmp} a{j}) {{ a{j} = v; x{j} = k; }} }}")
            else:
                updates.append(f"a{j} = {combine(r['op'], f'a{j}', v)};")
        coord_lines = coords("gi", "k") if need else []
        loop_head = "for (long k = LID0; k < S; k += WG)" if group_mode else "for (long k = 0; k < S; ++k)"
        lines += inits
        lines.append(loop_head + " {")
        lines += ["  " + c for c in coord_lines]
        lines.append(f"  const long fi = {flat};")
        lines += ["  " + u for u in updates]
        lines.append("}")
        for j in reds:
            r = g.reds[j]
            if group_mode:
                if r["index"]:
                    cmp = ">" if r["op"] == "argmax" else "<"
                    lines += [f"buf[LID0] = a{j}; ibuf[LID0] = x{j}; SYNC();",
                              "for (long s = WG / 2; s > 0; s >>= 1) {",
                              "  if (LID0 < s) {",
                              f"    const float o = buf[LID0 + s]; const long oi = ibuf[LID0 + s];",
                              f"    if (o {cmp} buf[LID0] || (o == buf[LID0] && oi < ibuf[LID0])) {{ buf[LID0] = o; ibuf[LID0] = oi; }}",
                              "  }",
                              "  SYNC();",
                              "}",
                              f"const long x{j}r = ibuf[0]; SYNC();"]
                    lines.append(f"const float r{j} = (float)x{j}r;")
                else:
                    lines += [f"buf[LID0] = a{j}; SYNC();",
                              "for (long s = WG / 2; s > 0; s >>= 1) {",
                              f"  if (LID0 < s) buf[LID0] = {combine(r['op'], 'buf[LID0]', 'buf[LID0 + s]')};",
                              "  SYNC();",
                              "}",
                              f"const float r{j} = buf[0]{' / (float)S' if r['op'] == 'mean' else ''}; SYNC();"]
            else:
                if r["index"]:
                    lines.append(f"const float r{j} = (float)x{j};")
                else:
                    lines.append(f"const float r{j} = a{j}{' / (float)S' if r['op'] == 'mean' else ''};")
    # The output.
    if out_kind == "full":
        need = uses_coords(out_expr, g) or not (trailing or contiguous)
        loop_head = "for (long k = LID0; k < S; k += WG)" if group_mode else "for (long k = 0; k < S; ++k)"
        lines.append(loop_head + " {")
        lines += ["  " + c for c in (coords("gi", "k") if need else [])]
        lines.append(f"  const long fi = {flat};")
        lines.append(f"  {out_name}[fi] = {cexpr(out_expr, ctx)};")
        lines.append("}")
    else:
        # One value per group; a per-group load reads the group's coordinates.
        need = uses_coords(out_expr, g)
        head = "if (LID0 == 0) {" if group_mode else "{"
        lines.append(head)
        lines += ["  " + c for c in (coords("gi", "0") if need else [])]
        lines.append("  const long fi = 0;")
        lines.append(f"  {out_name}[gi] = {cexpr(out_expr, ctx)};")
        lines.append("}")
    return lines


def reduce_seed(g, out, names, out_name, out_ctype, F_exprs, backend, out_kind):
    """Reduce-map over groups (the coordinates outside D), with an optional final reduction over
    the groups (a loss's mean) in a second kernel."""
    D = g.D
    keep = [a for a in range(g.n) if a not in D]
    by_level = {}
    for j, r in enumerate(g.reds):
        by_level.setdefault(r["level"], []).append(j)
    final = g.final
    scratch = []
    target, target_ctype = out_name, out_ctype
    if final is not None:
        target, target_ctype = "part", "float"
        scratch = [{"name": "part", "dtype": "f32", "shape": [prod_expr([F_exprs[a] for a in keep])]}]
        group_expr = final[1]
    else:
        group_expr = out.expr
    has_index = any(r["index"] for r in g.reds)
    decl_outputs = [(target, target_ctype)] if final is None else []
    decl, args = params_decl(g, names, decl_outputs, ["part"] if final is not None else [], backend)
    G = " * ".join(f_arg(a) for a in keep) or "1"
    S = " * ".join(f_arg(a) for a in D) or "1"
    wg_body = reduce_code(g, names, by_level, group_expr, out_kind if final is None else "group", target, True)
    wi_body = reduce_code(g, names, by_level, group_expr, out_kind if final is None else "group", target, False)
    ind = lambda ls, n: "\n".join(" " * n + x for x in ls)  # noqa: E731
    src = f"""{codegen.prelude(backend)}
// Fused reduce-map: for each group (coordinates outside the reduced axes) its reductions, then its
// output. MODE 0: a work-group of WG per group; MODE 1: a work-item per group.
KERNEL void kf_reduce({decl}) {{
  const long G = {G};
  const long S = {S};
#if MODE == 0
  LOCAL_MEM float buf[WG];
{"  LOCAL_MEM long ibuf[WG];" if has_index else ""}
  for (long gi = GRP0; gi < G; gi += NGRP0) {{
{ind(wg_body, 4)}
  }}
#else
  for (long gi = GID0; gi < G; gi += GSZ0) {{
{ind(wi_body, 4)}
  }}
#endif
}}
"""
    Gx = prod_expr([F_exprs[a] for a in keep])
    kernels = ["kf_reduce"]
    items = f"(1 - MODE) * min({Gx}, 65536) * WG + MODE * {Gx}"
    launches = [launch(backend, "kf_reduce", items, "WG", args + F_exprs)]
    if final is not None:
        op = final[0]
        src += final_kernel(backend, op, out_name, out_ctype)
        kernels.append("kf_final")
        launches.append(launch(backend, "kf_final", "WG", "WG", ["part", out_name, Gx]))
    return Seed("reduce-map", src, kernels, {"WG": [32, 64, 128, 256], "MODE": [0, 1]}, [], launches, scratch)


def final_kernel(backend, op, out_name, out_ctype):
    """One work-group combines the per-group values into one."""
    comb = combine("max" if op == "max" else "min" if op == "min" else "sum", "acc", "part[i]")
    init = INIT.get(op, "0.0f")
    scale = " / (float)n" if op == "mean" else ""
    red = combine("max" if op == "max" else "min" if op == "min" else "sum", "buf[LID0]", "buf[LID0 + s]")
    return f"""
KERNEL void kf_final(GLOBAL const float* RESTRICT part, GLOBAL {out_ctype}* RESTRICT {out_name}, int n) {{
  LOCAL_MEM float buf[WG];
  float acc = {init};
  for (long i = LID0; i < n; i += WG) acc = {comb};
  buf[LID0] = acc;
  SYNC();
  for (long s = WG / 2; s > 0; s >>= 1) {{
    if (LID0 < s) buf[LID0] = {red};
    SYNC();
  }}
  if (LID0 == 0) {out_name}[0] = buf[0]{scale};
}}
"""


def global_seed(g, out, names, out_name, out_ctype, F_exprs, backend, out_kind):
    """A reduction over every axis: each of NCHUNK work-groups reduces a contiguous chunk into
    scratch, one work-group combines the chunks, and (when the output is a full tensor, as in
    x / norm(x)) a map kernel writes it."""
    reds = list(range(len(g.reds)))
    if any(r["level"] != 1 or r["index"] for r in g.reds):
        raise Unsupported("a reduction over every axis that depends on another")
    nred = len(reds)
    decl, args = params_decl(g, names, [], ["part"], backend)
    ctx = Ctx(g, names, lambda a: f"c{a}", "i", lambda j: f"r{j}")
    need = any(uses_coords(r["arg"], g) for r in g.reds)
    coord_lines = coords_from_flat(g, "i", range(g.n)) if need else []
    inits = "\n".join(f"    float a{j} = {INIT[g.reds[j]['op']]};" for j in reds)
    updates = "\n".join(f"      a{j} = {combine(g.reds[j]['op'], f'a{j}', cexpr(g.reds[j]['arg'], ctx))};"
                        for j in reds)
    stores = []
    for j in reds:
        op = g.reds[j]["op"]
        stores += [f"    buf[LID0] = a{j};", "    SYNC();",
                   "    for (long s = WG / 2; s > 0; s >>= 1) {",
                   f"      if (LID0 < s) buf[LID0] = {combine(op, 'buf[LID0]', 'buf[LID0 + s]')};",
                   "      SYNC();", "    }",
                   f"    if (LID0 == 0) part[{j} * NGRP0 + c] = buf[0];", "    SYNC();"]
    n = " * ".join(f_arg(a) for a in range(g.n))
    src = f"""{codegen.prelude(backend)}
// A reduction over every element: NCHUNK work-groups each reduce a contiguous chunk into scratch.
KERNEL void kf_partial({decl}) {{
  LOCAL_MEM float buf[WG];
  const long n = {n};
  const long chunk = (n + NGRP0 - 1) / NGRP0;
  for (long c = GRP0; c < NGRP0; c += NGRP0) {{
{inits}
    const long end = min(n, (c + 1) * chunk);
    for (long i = c * chunk + LID0; i < end; i += WG) {{
{chr(10).join("      " + x for x in coord_lines)}
{updates}
    }}
{chr(10).join(stores)}
  }}
}}
"""
    # Combining: one work-group; results go to part[nred * NCHUNK + j] for the map kernel.
    comb_lines = []
    for j in reds:
        op = g.reds[j]["op"]
        comb_lines += [f"  float a{j} = {INIT[op]};",
                       f"  for (long i = LID0; i < nchunk; i += WG) a{j} = {combine(op, f'a{j}', f'part[{j} * nchunk + i]')};",
                       f"  buf[LID0] = a{j};", "  SYNC();",
                       "  for (long s = WG / 2; s > 0; s >>= 1) {",
                       f"    if (LID0 < s) buf[LID0] = {combine(op, 'buf[LID0]', 'buf[LID0 + s]')};",
                       "    SYNC();", "  }",
                       f"  const float r{j} = buf[0]{' / (float)n' if op == 'mean' else ''};", "  SYNC();"]
    final_decl = ", ".join([f"GLOBAL float* RESTRICT part"] +
                           ([f"GLOBAL {out_ctype}* RESTRICT {out_name}"] if out_kind != "full" else []) +
                           ["int nchunk"] + [f"int f{a}" for a in range(g.n)])
    if out_kind != "full":
        write = f"  if (LID0 == 0) {out_name}[0] = {cexpr(out.expr, ctx)};"
    else:
        write = "\n".join(f"  if (LID0 == 0) part[{nred} * nchunk + {j}] = r{j};" for j in reds)
    src += f"""
KERNEL void kf_combine({final_decl}) {{
  LOCAL_MEM float buf[WG];
  const long n = {n};
{chr(10).join(comb_lines)}
{write}
}}
"""
    launches = [launch(backend, "kf_partial", "NCHUNK * WG", "WG", args + F_exprs)]
    combine_args = ["part"] + ([out_name] if out_kind != "full" else []) + ["NCHUNK"] + F_exprs
    launches.append(launch(backend, "kf_combine", "WG", "WG", combine_args))
    kernels = ["kf_partial", "kf_combine"]
    if out_kind == "full":
        mctx = Ctx(g, names, lambda a: f"c{a}", "i", lambda j: f"part[{nred} * nchunk + {j}]")
        mneed = uses_coords(out.expr, g)
        mdecl, margs = params_decl(g, names, [(out_name, out_ctype)], ["part"], backend)
        mcoords = coords_from_flat(g, "i", range(g.n)) if mneed else []
        src += f"""
KERNEL void kf_apply({mdecl}, int nchunk) {{
  const long n = {n};
  for (long i = GID0; i < n; i += GSZ0) {{
{chr(10).join("    " + x for x in mcoords)}
    {out_name}[i] = {cexpr(out.expr, mctx)};
  }}
}}
"""
        launches.append(launch(backend, "kf_apply", f"min({prod_expr(F_exprs)}, 1048576)", "WG",
                               margs + F_exprs + ["NCHUNK"]))
        kernels.append("kf_apply")
    scratch = [{"name": "part", "dtype": "f32", "shape": [f"NCHUNK * {nred} + {nred}"]}]
    return Seed("global-reduce", src, kernels, {"WG": [64, 128, 256], "NCHUNK": [16, 64, 256]}, [], launches,
                scratch)
