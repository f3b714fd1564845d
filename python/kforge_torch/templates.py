"""Templates for the families that are not elementwise or reductions: matrix products (batched,
either operand transposed, a triangular result), scans (cumulative sum or product along an axis,
reversed, exclusive, of an elementwise expression such as x * mask) and pooling (max or average,
1 to 3 spatial dims, stride, padding, dilation).
"""

import math

import torch

from kforge_torch import codegen, fuse
from kforge_torch.codegen import Seed, launch, prod_expr
from kforge_torch.fuse import Unsupported

VIEWS = {"view", "_unsafe_view", "_reshape_alias", "reshape", "permute", "t", "transpose", "unsqueeze",
         "squeeze", "expand", "alias", "detach", "clone", "contiguous", "lift_fresh"}


def live(rec, out_refs):
    return fuse.live_nodes(rec.nodes, out_refs)


def source_of(rec, names, t):
    """The input `t` views (same storage), its name, its dims' expressions, and t's element
    strides as expressions of them; Unsupported when t is not a view of an input."""
    for ref_t in rec.keep:
        ref = rec.refs.get(id(ref_t))
        if ref is None or ref.kind not in ("in", "st"):
            continue
        try:
            same = ref_t.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        except AttributeError:
            same = ref_t.storage().data_ptr() == t.storage().data_ptr()
        if not same:
            continue
        exprs = names.shape_of(ref)
        if exprs is None or any(e is None for e in exprs):
            raise Unsupported(f"no size expressions for {ref}")
        # Suffix products of the input's dims: its own strides, as values and expressions.
        vals, strides = [], []
        for j in range(len(ref_t.shape)):
            rest = ref_t.shape[j + 1:]
            vals.append(math.prod(rest) if rest else 1)
            strides.append(prod_expr(exprs[j + 1:]) if j + 1 < len(exprs) else "1")
        out = []
        for s, d in zip(t.stride(), t.shape):
            if d == 1:
                out.append("0")
                continue
            if s not in vals:
                raise Unsupported("a view with strides that are not the input's")
            out.append(strides[vals.index(s)])
        offset = t.storage_offset() - ref_t.storage_offset()
        if offset != 0:
            raise Unsupported("a view that does not start at the input's first element")
        return names.of(ref), exprs, out, ref
    raise Unsupported("an operand that is not a view of an input")


def view_exprs(view_shape, base_shape, base_exprs):
    """Expressions for the dims of a view that only adds or drops dims of 1 (x.unsqueeze(-2)):
    matched to the base's from the right; an added dim of 1 is "1". None when it is another view."""
    if not base_exprs:
        return None
    out, j = [], len(base_shape) - 1
    for d in reversed(view_shape):
        while j >= 0 and base_shape[j] == 1 and d != 1:
            j -= 1
        if j >= 0 and base_shape[j] == d:
            out.append(base_exprs[j])
            j -= 1
        elif d == 1:
            out.append("1")
        else:
            return None
    return list(reversed(out))


def dim_expr(value, candidates):
    """The expression among candidates [(value, expr)] with this value."""
    for v, e in candidates:
        if v == value:
            return e
    return str(value)


# --- matrix products ---------------------------------------------------------------------------

def try_matmul(rec, out_refs, outs, names, backend):
    nodes = live(rec, out_refs)
    core = [n for n in nodes if n.op in ("mm", "bmm", "mv", "matmul", "addmm", "baddbmm")]
    if len(core) != 1:
        raise Unsupported("not one matrix product")
    mm = core[0]
    if mm.op in ("addmm", "baddbmm", "mv"):
        raise Unsupported(f"aten.{mm.op}")
    after = nodes[nodes.index(mm) + 1:]
    epilogue = None
    for n in after:
        if n.op in ("triu", "tril"):
            if epilogue is not None or (len(n.args) > 1 and n.args[1] != 0):
                raise Unsupported("a triangle other than the main diagonal's")
            epilogue = n.op
        elif n.op not in VIEWS:
            raise Unsupported(f"aten.{n.op} after the product")
    for n in nodes[:nodes.index(mm)]:
        if n.op not in VIEWS:
            raise Unsupported(f"aten.{n.op} before the product")
    a_t, b_t = mm.args[0].t, mm.args[1].t
    if a_t is None or b_t is None:
        raise Unsupported("operands not kept")
    a_name, a_exprs, a_str, a_ref = source_of(rec, names, a_t)
    b_name, b_exprs, b_str, b_ref = source_of(rec, names, b_t)
    if a_ref.dtype != torch.float32 or b_ref.dtype != torch.float32:
        raise Unsupported("a product of tensors other than f32")
    # The output: the product's result, maybe viewed; its elements in the same order.
    res = mm.outs[0].t
    out = outs[0]
    if out.numel() != res.numel():
        raise Unsupported("an output of another size than the product")
    if not out.is_contiguous():
        raise Unsupported("a non-contiguous output")
    batched = mm.op == "bmm"
    if batched:
        B, M, K = a_t.shape
        N = b_t.shape[2]
        sab, sam, sak = a_str
        sbb, sbk, sbn = b_str
    else:
        M, K = a_t.shape
        N = b_t.shape[1]
        B = 1
        sab, sbb = "0", "0"
        sam, sak = a_str
        sbk, sbn = b_str
    # Size expressions for M, N, K, B from the operands' inputs.
    cands = []
    for ints, exprs in ((a_ref.shape, a_exprs), (b_ref.shape, b_exprs), (out.shape, names.exprs.get(("output", 0)))):
        if exprs:
            cands += [(v, e) for v, e in zip(ints, exprs) if e is not None]
            # products of consecutive dims (a batch of matrices as rows)
            for i in range(len(ints)):
                for j in range(i + 2, len(ints) + 1):
                    if all(exprs[i:j]):
                        cands.append((math.prod(ints[i:j]), prod_expr(list(exprs[i:j]))))
    Me, Ne, Ke, Be = (dim_expr(v, cands) for v in (M, N, K, B))
    return matmul_seed(backend, a_name, b_name, names.outputs[0], Me, Ne, Ke, Be, (sab, sam, sak), (sbb, sbk, sbn),
                       epilogue)


MATMUL_BODY = r"""
// Tiled matrix product C[b] = A[b] * B[b] (row-major C, M x N), A and B read through strides, so
// either may be transposed or broadcast over the batch. A work-group computes a TILE x TILE tile
// of C, staging TILE x TILE tiles of A and B in local memory; each work-item owns WPT outputs of
// a row, TILE / WPT apart. Tiles are zero-filled past the edges: any sizes work.
//   EPI 0: C = A * B;  1: upper triangle kept (triu), 2: lower triangle kept (tril)
#define RTS (TILE / WPT)

KERNEL void kf_matmul(GLOBAL const float* RESTRICT A, GLOBAL const float* RESTRICT B,
                      GLOBAL float* RESTRICT C, int M, int N, int K,
                      int sab, int sam, int sak, int sbb, int sbk, int sbn) {
  const int tx = (int)LID0;
  const int ty = (int)LID1;
  const int row = (int)GRP1 * TILE + ty;
  const int col0 = (int)GRP0 * TILE;
  const long b = GRP2;
  GLOBAL const float* Ab = A + b * (long)sab;
  GLOBAL const float* Bb = B + b * (long)sbb;
  LOCAL_MEM float As[TILE][TILE + PAD];
  LOCAL_MEM float Bs[TILE][TILE + PAD];
  float acc[WPT];
  for (int w = 0; w < WPT; ++w) acc[w] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += TILE) {
    for (int w = 0; w < WPT; ++w) {
      const int c = tx + w * RTS;
      const int ka = k0 + c;
      const int kb = k0 + ty;
      const int nb = col0 + c;
      As[ty][c] = (row < M && ka < K) ? Ab[(long)row * sam + (long)ka * sak] : 0.0f;
      Bs[ty][c] = (kb < K && nb < N) ? Bb[(long)kb * sbk + (long)nb * sbn] : 0.0f;
    }
    SYNC();
    for (int k = 0; k < TILE; ++k) {
      const float a = As[ty][k];
      for (int w = 0; w < WPT; ++w) acc[w] += a * Bs[k][tx + w * RTS];
    }
    SYNC();
  }
  if (row < M) {
    for (int w = 0; w < WPT; ++w) {
      const int col = col0 + tx + w * RTS;
      if (col < N) {
        float v = acc[w];
#if EPI == 1
        if (col < row) v = 0.0f;
#elif EPI == 2
        if (col > row) v = 0.0f;
#endif
        C[b * (long)M * N + (long)row * N + col] = v;
      }
    }
  }
}
"""


def matmul_seed(backend, a, b, c, M, N, K, B, sa, sb, epilogue):
    epi = {None: 0, "triu": 1, "tril": 2}[epilogue]
    src = codegen.prelude(backend) + f"#define EPI {epi}\n" + MATMUL_BODY
    args = [a, b, c, M, N, K, sa[0], sa[1], sa[2], sb[0], sb[1], sb[2]]
    if backend == "cuda":
        la = {"kernel": "kf_matmul", "grid": [f"ceil_div({N}, TILE)", f"ceil_div({M}, TILE)", B],
              "block": ["TILE / WPT", "TILE", "1"], "args": args}
    else:
        la = {"kernel": "kf_matmul", "global": [f"ceil_div({N}, TILE) * (TILE / WPT)", f"ceil_div({M}, TILE) * TILE", B],
              "local": ["TILE / WPT", "TILE", "1"], "args": args}
    params = {"TILE": [8, 16, 32], "WPT": [1, 2, 4, 8], "PAD": [0, 1]}
    return Seed("matmul", src, ["kf_matmul"], params, ["TILE % WPT == 0", "TILE * TILE / WPT <= 256"], [la])


# --- scans ---------------------------------------------------------------------------------------

SCAN_BODY = r"""
// Scan along an axis of L elements, for each of G lines (stride INNER between neighbours):
// y[i] = x[0] OP ... OP x[i] (REV: from the end; EXCL: without x[i] itself). MODE 0: a work-item
// scans a line; MODE 1: a work-group of WG splits a line in WG chunks, scans each, then adds the
// chunks' running totals.
KERNEL void kf_scan(%(params)s, int L, int INNER, int G) {
#if MODE == 0
  for (long line = GID0; line < G; line += GSZ0) {
    const long base = (line / INNER) * (long)L * INNER + line %% INNER;
    float acc = IDENT;
    for (long j = 0; j < L; ++j) {
      const long pos = REV ? (L - 1 - j) : j;
      const long i = base + pos * INNER;
      const float v = %(load)s;
      if (EXCL) { OUT[i] = acc; acc = acc OP v; } else { acc = acc OP v; OUT[i] = acc; }
    }
  }
#else
  LOCAL_MEM float tot[WG];
  for (long line = GRP0; line < G; line += NGRP0) {
    const long base = (line / INNER) * (long)L * INNER + line %% INNER;
    const long chunk = (L + WG - 1) / WG;
    const long j0 = LID0 * chunk;
    const long j1 = min((long)L, j0 + chunk);
    float acc = IDENT;
    for (long j = j0; j < j1; ++j) {
      const long pos = REV ? (L - 1 - j) : j;
      const long i = base + pos * INNER;
      const float v = %(load)s;
      acc = acc OP v;
    }
    tot[LID0] = acc;
    SYNC();
    if (LID0 == 0) {
      float run = IDENT;
      for (long w = 0; w < WG; ++w) { const float t = tot[w]; tot[w] = run; run = run OP t; }
    }
    SYNC();
    acc = tot[LID0];
    for (long j = j0; j < j1; ++j) {
      const long pos = REV ? (L - 1 - j) : j;
      const long i = base + pos * INNER;
      const float v = %(load)s;
      if (EXCL) { OUT[i] = acc; acc = acc OP v; } else { acc = acc OP v; OUT[i] = acc; }
    }
    SYNC();
  }
#endif
}
"""


def try_scan(rec, out_refs, outs, names, backend):
    nodes = live(rec, out_refs)
    scans = [n for n in nodes if n.op in ("cumsum", "cumprod")]
    if len(scans) != 1:
        raise Unsupported("not one scan")
    sc = scans[0]
    dim = sc.args[1]
    rev = False
    excl = False
    pre_nodes = nodes[:nodes.index(sc)]
    post = nodes[nodes.index(sc) + 1:]
    x_ref = sc.args[0]
    # reversed: flip, scan, flip
    if pre_nodes and pre_nodes[-1].op == "flip" and post and post[0].op == "flip":
        rev = True
        x_ref = pre_nodes[-1].args[0]
        pre_nodes = pre_nodes[:-1]
        post = post[1:]
    # exclusive: cat(zeros, scan(x[..., :-1]))
    if post and post[-1].op == "cat":
        excl = True
        slice_node = next((n for n in pre_nodes if n.op == "slice" and n.outs[0] is x_ref), None)
        if slice_node is None:
            raise Unsupported("a concatenation that is not an exclusive scan")
        x_ref = slice_node.args[0]
        pre_nodes = [n for n in pre_nodes if n.op not in ("slice", "select", "unsqueeze", "zeros_like", "detach")]
        post = []
    if any(n.op not in VIEWS for n in post):
        raise Unsupported("operations after the scan")
    out = outs[0]
    L = out.shape[dim]
    # The scanned values: an elementwise expression of inputs (x, or x * mask).
    g = fuse.Graph(tuple(out.shape))
    vals = {}
    for n in pre_nodes:
        if n.op in fuse.BINARY:
            args = []
            for a in n.args[:2]:
                if hasattr(a, "kind"):
                    args.append(vals.get(id(a)) or g.leaf(a))
                else:
                    args.append(float(a))
            vals[id(n.outs[0])] = g.combine(fuse.BINARY[n.op], *args)
        elif n.op in ("_to_copy", "to", "clone", "detach", "alias"):
            a = n.args[0]
            vals[id(n.outs[0])] = vals.get(id(a)) or g.leaf(a)
        elif n.op in ("flip",):
            raise Unsupported("a flip that is not around the scan")
        else:
            raise Unsupported(f"aten.{n.op} before the scan")
    v = vals.get(id(x_ref)) or g.leaf(x_ref)
    for lf in g.leaves:
        if not lf["full"]:
            raise Unsupported("a broadcast input to a scan")
    leaf_names = [names.of(lf["ref"]) for lf in g.leaves]
    from kforge_torch import fusegen
    ctx = fusegen.Ctx(g, leaf_names, lambda a: "0", "i", None)
    load = fusegen.cexpr(v.expr, ctx)
    params = []
    for nm, lf in zip(leaf_names, g.leaves):
        if f"GLOBAL const" not in " ".join(params) or nm not in " ".join(params):
            params.append(f"GLOBAL const {codegen.CTYPES[lf['ref'].dtype_name]}* RESTRICT {nm}")
    params = list(dict.fromkeys(params))
    params.append("GLOBAL float* RESTRICT OUT")
    exprs = names.exprs.get(("output", 0))
    if exprs is None or any(e is None for e in exprs):
        raise Unsupported("no size expressions for the output")
    Le = exprs[dim]
    inner = prod_expr(exprs[dim + 1:])
    G = prod_expr([e for j, e in enumerate(exprs) if j != dim])
    op = "+" if sc.op == "cumsum" else "*"
    ident = "0.0f" if sc.op == "cumsum" else "1.0f"
    src = (codegen.prelude(backend) + f"#define OP {op}\n#define IDENT {ident}\n#define REV {int(rev)}\n"
           f"#define EXCL {int(excl)}\n#define OUT {names.outputs[0]}\n" +
           SCAN_BODY % {"params": ", ".join(params).replace(f"RESTRICT OUT", f"RESTRICT {names.outputs[0]}"),
                        "load": load})
    args = list(dict.fromkeys(leaf_names)) + [names.outputs[0], Le, inner, G]
    la = launch(backend, "kf_scan", f"(1 - MODE) * {G} + MODE * min({G}, 65536) * WG", "WG", args)
    return Seed("scan", src, ["kf_scan"], {"WG": [32, 64, 128, 256], "MODE": [0, 1]}, [], [la])


# --- pooling -------------------------------------------------------------------------------------

POOL_BODY = r"""
// Pooling over ND spatial dims (1 to 3): an output element per work-item, its window read with
// stride, padding and dilation. MAXP: max (padding never wins), else average (COUNT_PAD: the
// padding counts in the divisor).
KERNEL void kf_pool(GLOBAL const float* RESTRICT X, GLOBAL float* RESTRICT Y, int NC,
                    int I0, int I1, int I2, int O0, int O1, int O2,
                    int K0, int K1, int K2, int S0, int S1, int S2, int P0, int P1, int P2,
                    int D0, int D1, int D2) {
  const long total = (long)NC * O0 * O1 * O2;
  for (long base = GID0; base < total; base += GSZ0 * VEC) {
    for (int u = 0; u < VEC; ++u) {
      const long o = base + (long)u * GSZ0;
      if (o >= total) break;
      const long o2 = o % O2, o1 = (o / O2) % O1, o0 = (o / ((long)O2 * O1)) % O0;
      const long nc = o / ((long)O2 * O1 * O0);
      GLOBAL const float* x = X + nc * (long)I0 * I1 * I2;
#if MAXP
      float acc = -INFINITY;
#else
      float acc = 0.0f;
      int count = 0;
#endif
      for (int k0 = 0; k0 < K0; ++k0) {
        const long i0 = o0 * S0 - P0 + (long)k0 * D0;
        for (int k1 = 0; k1 < K1; ++k1) {
          const long i1 = o1 * S1 - P1 + (long)k1 * D1;
          for (int k2 = 0; k2 < K2; ++k2) {
            const long i2 = o2 * S2 - P2 + (long)k2 * D2;
            const int inside = i0 >= 0 && i0 < I0 && i1 >= 0 && i1 < I1 && i2 >= 0 && i2 < I2;
#if MAXP
            if (inside) acc = fmax(acc, x[(i0 * I1 + i1) * I2 + i2]);
#else
            if (inside) acc += x[(i0 * I1 + i1) * I2 + i2];
            count += COUNT_PAD ? (i0 < I0 + P0 && i1 < I1 + P1 && i2 < I2 + P2) : inside;
#endif
          }
        }
      }
#if MAXP
      Y[o] = acc;
#else
      Y[o] = acc / (float)(DIVISOR > 0 ? DIVISOR : count);
#endif
    }
  }
}
"""


def try_pool(rec, out_refs, outs, names, backend):
    nodes = live(rec, out_refs)
    pools = [n for n in nodes if n.op.startswith("max_pool") or n.op.startswith("avg_pool")]
    if len(pools) != 1:
        raise Unsupported("not one pooling")
    p = pools[0]
    for n in nodes:
        if n is not p and n.op not in VIEWS:
            raise Unsupported(f"aten.{n.op} beside the pooling")
    nd = int(p.op[len("max_pool") if p.op.startswith("max") else len("avg_pool")][0])
    x_t = p.args[0].t
    x_name, x_exprs, strides, x_ref = source_of(rec, names, x_t)
    if x_ref.dtype != torch.float32:
        raise Unsupported("pooling of a tensor other than f32")
    if not x_t.is_contiguous():
        raise Unsupported("pooling of a non-contiguous view")
    a = p.args
    ks = list(a[1])
    st = list(a[2]) if len(a) > 2 and a[2] else ks
    pad = list(a[3]) if len(a) > 3 else [0] * nd
    ismax = p.op.startswith("max")
    dil = list(a[4]) if ismax and len(a) > 4 else [1] * nd
    ceil = a[5] if ismax and len(a) > 5 else (a[4] if not ismax and len(a) > 4 else False)
    count_pad = a[5] if not ismax and len(a) > 5 else True
    divisor = a[6] if not ismax and len(a) > 6 and a[6] is not None else 0
    if ceil:
        raise Unsupported("ceil_mode")

    def rep(v):
        return list(v) * nd if len(v) == 1 else list(v)

    ks, st, pad, dil = rep(ks), rep(st), rep(pad), rep(dil)
    in_sp = list(x_t.shape[-nd:])
    out_t = p.outs[0].t
    out_sp = list(out_t.shape[-nd:])
    nc = x_t.numel() // math.prod(in_sp)
    # Size expressions: the input's (through its view) and the output's.
    xin = names.shape_of(x_ref)
    cands = [(v, e) for v, e in zip(x_ref.shape, xin)]
    oex = names.exprs.get(("output", 0)) or []
    cands += [(v, e) for v, e in zip(outs[0].shape, oex) if e is not None]
    for i in range(len(x_ref.shape)):
        for j in range(i + 2, len(x_ref.shape) + 1):
            cands.append((math.prod(x_ref.shape[i:j]), prod_expr(list(xin[i:j]))))
    # The constants (kernel size, stride...) are whatever expressions share their values.
    const_cands = [(v, k) for k, v in names.consts.items() if isinstance(v, int)] if hasattr(names, "consts") else []

    def e(v, prefer_const=False):
        if prefer_const:
            for cv, ce in const_cands:
                if cv == v:
                    return ce
        return dim_expr(v, cands)

    # The pooling's own input and output through the views around it (avg_pool1d is avg_pool2d of
    # x.unsqueeze(-2)).
    out_view = view_exprs(list(out_t.shape), list(outs[0].shape), oex)
    in_view = view_exprs(list(x_t.shape), list(x_ref.shape), xin)
    if out_view is None or in_view is None:
        raise Unsupported("pooling through a view other than a dim of 1 added")
    out_exprs = out_view[-nd:]
    pads = [1] * (3 - nd)
    sp_exprs = in_view[-nd:]
    I = pads + sp_exprs
    O = pads + out_exprs
    # Window, stride, padding and dilation as numbers: the sizes the validation set changes are
    # those shapes show, never these.
    K = pads + [str(v) for v in ks]
    S = pads + [str(v) for v in st]
    P = ["0"] * (3 - nd) + [str(v) for v in pad]
    D = pads + [str(v) for v in dil]
    I = [str(x) for x in I]
    O = [str(x) for x in O]
    K, S, D = [str(x) for x in K], [str(x) for x in S], [str(x) for x in D]
    NCe = prod_expr(in_view[:-nd])
    src = (codegen.prelude(backend) + f"#define MAXP {int(ismax)}\n#define COUNT_PAD {int(bool(count_pad))}\n"
           f"#define DIVISOR {int(divisor)}\n" + POOL_BODY)
    total = prod_expr([NCe] + O)
    args = [x_name, names.outputs[0], NCe] + I + O + K + S + P + D
    la = launch(backend, "kf_pool", f"ceil_div({total}, VEC)", "WG", args)
    return Seed("pooling", src, ["kf_pool"], {"WG": [32, 64, 128, 256], "VEC": [1, 2, 4]}, [], [la])


# --- convolutions --------------------------------------------------------------------------------

CONV_BODY = r"""
// Direct convolution over ND spatial dims (1 to 3, the unused ones of size 1): an output element
// per work-item (VEC of them, interleaved), summing its input channels of the group over the
// window. TRANSPOSED: the gradient form, out[o] gathers x[i] where o = i * S - P + k * D.
// Weight layout: (OC, IC / G, K...) plain, (IC, OC / G, K...) transposed.
KERNEL void kf_conv(GLOBAL const float* RESTRICT X, GLOBAL const float* RESTRICT W, %(bias_param)s
                    GLOBAL float* RESTRICT Y, int N, int IC, int OC, int G,
                    int I0, int I1, int I2, int O0, int O1, int O2, int K0, int K1, int K2,
                    int S0, int S1, int S2, int P0, int P1, int P2, int D0, int D1, int D2) {
  const long total = (long)N * OC * O0 * O1 * O2;
  const int ICG = IC / G, OCG = OC / G;
  for (long base = GID0; base < total; base += GSZ0 * VEC) {
    for (int u = 0; u < VEC; ++u) {
      const long o = base + (long)u * GSZ0;
      if (o >= total) break;
      const long o2 = o %% O2, o1 = (o / O2) %% O1, o0 = (o / ((long)O2 * O1)) %% O0;
      const long oc = (o / ((long)O2 * O1 * O0)) %% OC;
      const long n = o / ((long)O2 * O1 * O0 * OC);
      const long g = oc / OCG;
      float acc = %(bias_init)s;
      for (int ic = 0; ic < ICG; ++ic) {
        const long cin = g * ICG + ic;
        GLOBAL const float* x = X + (n * IC + cin) * (long)I0 * I1 * I2;
#if TRANSPOSED
        GLOBAL const float* w = W + (cin * OCG + (oc - g * OCG)) * (long)K0 * K1 * K2;
#else
        GLOBAL const float* w = W + (oc * ICG + ic) * (long)K0 * K1 * K2;
#endif
        for (int k0 = 0; k0 < K0; ++k0) {
#if TRANSPOSED
          const long t0 = o0 + P0 - (long)k0 * D0;
          if (t0 < 0 || t0 %% S0 != 0) continue;
          const long i0 = t0 / S0;
#else
          const long i0 = o0 * S0 - P0 + (long)k0 * D0;
#endif
          if (i0 < 0 || i0 >= I0) continue;
          for (int k1 = 0; k1 < K1; ++k1) {
#if TRANSPOSED
            const long t1 = o1 + P1 - (long)k1 * D1;
            if (t1 < 0 || t1 %% S1 != 0) continue;
            const long i1 = t1 / S1;
#else
            const long i1 = o1 * S1 - P1 + (long)k1 * D1;
#endif
            if (i1 < 0 || i1 >= I1) continue;
            for (int k2 = 0; k2 < K2; ++k2) {
#if TRANSPOSED
              const long t2 = o2 + P2 - (long)k2 * D2;
              if (t2 < 0 || t2 %% S2 != 0) continue;
              const long i2 = t2 / S2;
#else
              const long i2 = o2 * S2 - P2 + (long)k2 * D2;
#endif
              if (i2 < 0 || i2 >= I2) continue;
              acc += x[(i0 * I1 + i1) * I2 + i2] * w[((long)k0 * K1 + k1) * K2 + k2];
            }
          }
        }
      }
      Y[o] = acc;
    }
  }
}
"""


def try_conv(rec, out_refs, outs, names, backend):
    nodes = live(rec, out_refs)
    convs = [n for n in nodes if n.op in ("convolution", "_convolution")]
    if len(convs) != 1:
        raise Unsupported("not one convolution")
    cv = convs[0]
    for n in nodes:
        if n is not cv and n.op not in VIEWS:
            raise Unsupported(f"aten.{n.op} beside the convolution")
    a = cv.args
    x_t, w_ref, b_ref = a[0].t, a[1], a[2]
    stride, padding, dilation, transposed, out_pad, groups = a[3], a[4], a[5], a[6], a[7], a[8]
    if not hasattr(w_ref, "kind") or w_ref.kind != "st" or (b_ref is not None and getattr(b_ref, "kind", "") != "st"):
        raise Unsupported("a convolution whose weights are not the module's")
    if x_t.dtype != torch.float32 or w_ref.dtype != torch.float32:
        raise Unsupported("a convolution of tensors other than f32")
    x_name, x_exprs, _, x_ref = source_of(rec, names, x_t)
    if not x_t.is_contiguous():
        raise Unsupported("a convolution of a non-contiguous view")
    nd = x_t.dim() - 2
    if not 1 <= nd <= 3:
        raise Unsupported(f"a {nd}-D convolution")
    out_t = cv.outs[0].t
    in_view = view_exprs(list(x_t.shape), list(x_ref.shape), x_exprs)
    out_view = view_exprs(list(out_t.shape), list(outs[0].shape), names.exprs.get(("output", 0)))
    w_exprs = names.shape_of(w_ref)
    if in_view is None or out_view is None or w_exprs is None or any(e is None for e in w_exprs):
        raise Unsupported("no size expressions for the convolution's tensors")
    pad1 = ["1"] * (3 - nd)
    N, IC = in_view[0], in_view[1]
    OC = out_view[1]
    I = pad1 + in_view[2:]
    O = pad1 + out_view[2:]
    K = pad1 + list(w_exprs[2:])

    def rep(v):
        v = list(v)
        return v * nd if len(v) == 1 else v

    S = pad1 + [str(v) for v in rep(stride)]
    P = ["0"] * (3 - nd) + [str(v) for v in rep(padding)]
    D = pad1 + [str(v) for v in rep(dilation)]
    follows = getattr(names, "size_consts", set())
    if any((id(cv), j) in follows for j in (3, 4, 5)):
        raise Unsupported("a stride, padding or dilation that follows the sizes")
    G = str(groups)
    if (id(cv), 8) in follows:
        # Depthwise: groups = channels, whatever the size set.
        G = IC if groups == x_t.shape[1] else OC if groups == out_t.shape[1] else None
        if G is None:
            raise Unsupported("groups that follow the sizes in a way not expressed")
    bias = b_ref is not None
    src = codegen.prelude(backend) + f"#define TRANSPOSED {int(bool(transposed))}\n" + CONV_BODY % {
        "bias_param": "GLOBAL const float* RESTRICT Bias," if bias else "",
        "bias_init": "Bias[oc]" if bias else "0.0f"}
    total = prod_expr([N, OC] + O)
    args = [x_name, names.of(w_ref)] + ([names.of(b_ref)] if bias else []) + [names.outputs[0], N, IC, OC,
                                                                             G] + I + O + K + S + P + D
    la = launch(backend, "kf_conv", f"ceil_div({total}, VEC)", "WG", args)
    return Seed("convolution", src, ["kf_conv"], {"WG": [32, 64, 128, 256], "VEC": [1, 2, 4]}, [], [la])
