"""The forward pass as a graph of aten operations, for recognising what it computes.

forward() runs once under a TorchDispatchMode that records every aten call with its tensors (by
identity: an input of forward, a state_dict entry, or an earlier result) and its other arguments.
Views (view, reshape, unsqueeze, expand, permute, t, transpose, select, narrow, flip is not a
view) are recorded like any operation; the recogniser decides what it can follow.
"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kforge_torch import modfile


DTYPE_NAMES = {torch.float32: "f32", torch.float64: "f64", torch.int32: "i32", torch.int64: "i64",
               torch.uint8: "u8", torch.bool: "u8", torch.float16: "f16", torch.bfloat16: "bf16"}


class Ref:
    """A tensor in the graph: an input ("in", i), a state entry ("st", key) or a result ("t", n)."""

    def __init__(self, kind, key, shape, dtype):
        self.kind, self.key, self.shape, self.dtype = kind, key, tuple(shape), dtype
        self.dtype_name = DTYPE_NAMES.get(dtype, "?")
        self.t = None

    def __repr__(self):
        return f"{self.kind}:{self.key}{list(self.shape)}"


class Node:
    def __init__(self, op, args, kwargs, outs):
        self.op = op          # "aten.relu.default" -> "relu"; the overload is in .overload
        self.full = op
        self.args = args      # Ref, or plain values (lists of them too)
        self.kwargs = kwargs
        self.outs = outs      # [Ref]

    def __repr__(self):
        return f"{self.full}({', '.join(map(repr, self.args))}) -> {self.outs}"


def _short(func):
    name = str(func)  # "aten.relu.default"
    parts = name.split(".")
    return parts[1] if len(parts) >= 2 else name, parts[2] if len(parts) >= 3 else "default"


class Recorder(TorchDispatchMode):
    def __init__(self, inputs, state):
        super().__init__()
        self.nodes = []
        self.refs = {}      # id(tensor) -> Ref
        self.keep = []      # tensors kept alive so that ids stay unique
        self.by_ptr = {}    # (data_ptr, shape, stride) -> Ref for inputs and state
        for i, t in enumerate(inputs):
            self._known(t, Ref("in", i, t.shape, t.dtype))
        for key, t in state:
            self._known(t, Ref("st", key, t.shape, t.dtype))
        self.count = 0

    def _known(self, t, ref):
        ref.t = t
        self.refs[id(t)] = ref
        self.keep.append(t)
        try:
            self.by_ptr[(t.data_ptr(), tuple(t.shape), tuple(t.stride()))] = ref
        except RuntimeError:
            pass

    def ref(self, t):
        r = self.refs.get(id(t))
        if r is not None:
            return r
        try:
            r = self.by_ptr.get((t.data_ptr(), tuple(t.shape), tuple(t.stride())))
        except RuntimeError:
            r = None
        if r is None:
            # A tensor made inside forward (a constant, torch.zeros_like): recorded as a constant
            # when small, else unknown.
            if t.numel() == 1:
                return float(t.item()) if t.dtype.is_floating_point else int(t.item())
            r = Ref("const", len(self.keep), t.shape, t.dtype)
        self.refs[id(t)] = r
        self.keep.append(t)
        return r

    def tensor(self, ref):
        """The tensor a ref stands for (kept alive while the recorder lives)."""
        for t in self.keep:
            if self.refs.get(id(t)) is ref:
                return t
        return None

    def _arg(self, a):
        if isinstance(a, torch.Tensor):
            return self.ref(a)
        if isinstance(a, (list, tuple)):
            return [self._arg(x) for x in a]
        if isinstance(a, torch.dtype):
            return str(a)
        if isinstance(a, (torch.device, torch.layout, torch.memory_format)):
            return str(a)
        return a

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name, overload = _short(func)
        rargs = [self._arg(a) for a in args]
        rkw = {k: self._arg(v) for k, v in kwargs.items()}
        outs_t = out if isinstance(out, (list, tuple)) else [out]
        outs = []
        for t in outs_t:
            if isinstance(t, torch.Tensor):
                r = Ref("t", self.count, t.shape, t.dtype)
                r.t = t
                self.count += 1
                self.refs[id(t)] = r
                self.keep.append(t)
                outs.append(r)
            else:
                outs.append(t)
        node = Node(name, rargs, rkw, outs)
        node.full = f"{name}.{overload}"
        node.overload = overload
        self.nodes.append(node)
        return out


def trace_forward(model, items, filename):
    """Runs forward once on `items` (tensors and numbers, as get_inputs gave them), recording;
    (nodes, output refs, output tensors). Input i of the graph is items[i]."""
    state = modfile.state_of(model)
    rec = Recorder([], state)
    for i, t in enumerate(items):
        if isinstance(t, torch.Tensor):
            rec._known(t, Ref("in", i, t.shape, t.dtype))
    with torch.no_grad():
        with rec:
            out = modfile.call_user("forward()", model, filename, *items)
    outs = modfile.tensors_of(out, "forward()")
    return rec, [rec.ref(t) if id(t) in rec.refs else None for t in outs], outs
