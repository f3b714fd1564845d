"""A KernelBench-style module file: its module-level constants, run with some of them changed.

A file defines `class Model(nn.Module)`, `get_inputs()`, `get_init_inputs()` and top-level
constants (`batch_size = 16`, `dim = 16384`, `input_shape = (4096,)`). A constant whose value is
made of literals only (`N = 2048 * 2`) is *free*: kforge may set it (its sizes); one that names
others (`groups = in_channels`) is *derived* and recomputes when the file runs again. A tuple of
literals (`input_shape = (4096,)`) gives one free constant per element, named `input_shape__0`.

Changing a constant rewrites its assignment in the file's syntax tree before the file runs, so the
file's own arithmetic (derived constants, shapes) follows, as if the user had edited the literal.
"""

import ast
import contextlib
import math
import sys

import torch

# Factories get_inputs() may use and how kforge fills a buffer like theirs (see Fill in
# proto/kforge/v1/problem.proto).
RANDOM_FACTORIES = ("rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "ones", "zeros",
                    "full", "empty", "arange", "ones_like", "zeros_like", "full_like", "empty_like")
TENSOR_FACTORIES = RANDOM_FACTORIES + ("tensor", "eye", "linspace", "as_tensor")


class ModuleError(Exception):
    """A problem with the user's file, said so that they can act on it (where and what)."""


def _literal(node, known):
    """The value of a constant expression made of literals (and, with `known`, names); None if not."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)) and node.value is not None:
        return node.value
    if isinstance(node, ast.Name) and known is not None and node.id in known:
        return known[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _literal(node.operand, known)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return -v if isinstance(node.op, ast.USub) else v
        return None
    if isinstance(node, ast.BinOp):
        a, b = _literal(node.left, known), _literal(node.right, known)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
            return None
        try:
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, ast.FloorDiv):
                return a // b
            if isinstance(node.op, ast.Div):
                return a / b
            if isinstance(node.op, ast.Mod):
                return a % b
            if isinstance(node.op, ast.Pow) and abs(b) <= 64:
                return a ** b
        except (ZeroDivisionError, OverflowError):
            return None
    return None


class ModelFile:
    """A parsed module file and its free constants."""

    def __init__(self, source, filename="model.py"):
        self.source = source
        self.filename = filename
        try:
            self.tree = ast.parse(source, filename=filename)
        except SyntaxError as e:
            raise ModuleError(f"{filename}:{e.lineno}: does not parse: {e.msg}") from None
        self.free = {}      # name -> value (ints and floats)
        self._nodes = {}    # name -> (assignment node, element index or None)
        for stmt in self.tree.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
                continue
            name = stmt.targets[0].id
            if isinstance(stmt.value, ast.Tuple):
                values = [_literal(e, None) for e in stmt.value.elts]
                if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                    for i, v in enumerate(values):
                        self.free[f"{name}__{i}"] = v
                        self._nodes[f"{name}__{i}"] = (stmt, i)
                continue
            v = _literal(stmt.value, None)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.free[name] = v
                self._nodes[name] = (stmt, None)
        names = {"Model", "get_inputs", "get_init_inputs"}
        defined = {n.name for n in self.tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        missing = sorted(names - defined)
        if missing:
            raise ModuleError(f"{filename}: defines no {', '.join(missing)} (KernelBench's format: class Model(nn.Module), "
                              "get_inputs(), get_init_inputs())")

    def rewritten(self, overrides):
        """The syntax tree with the free constants in `overrides` set."""
        tree = ast.parse(self.source, filename=self.filename)
        # The same text parses to the same statements: the i-th of one is the i-th of the other.
        by_pos = dict(zip((id(s) for s in self.tree.body), tree.body))
        for name, value in overrides.items():
            if name not in self._nodes:
                raise ModuleError(f"{self.filename}: no constant {name} to set (free constants: "
                                  f"{', '.join(sorted(self.free)) or 'none'})")
            stmt, index = self._nodes[name]
            target = by_pos[id(stmt)]
            # The file's own type: padding=0 stays an int, eps=1 a float, whatever the caller sent.
            orig = self.free[name]
            if isinstance(orig, int) and isinstance(value, float) and value.is_integer():
                value = int(value)
            elif isinstance(orig, float) and isinstance(value, int):
                value = float(value)
            node = ast.Constant(value=value)
            if index is None:
                target.value = node
            else:
                target.value.elts[index] = node
        return ast.fix_missing_locations(tree)

    def run(self, overrides=None):
        """Executes the file with `overrides`; returns its namespace."""
        tree = self.rewritten(overrides or {})
        ns = {"__name__": "kforge_model", "__file__": self.filename, "__builtins__": __builtins__}
        try:
            exec(compile(tree, self.filename, "exec"), ns)  # noqa: S102 - the tenant's file, in a jail
        except BaseException as e:  # noqa: BLE001 - anything the file does is its error
            raise ModuleError(f"{self.filename} does not import: {where(e, self.filename)}") from None
        for name in ("Model", "get_inputs", "get_init_inputs"):
            if not callable(ns.get(name)):
                raise ModuleError(f"{self.filename}: {name} is not defined at module level")
        return ns

    def values(self, ns):
        """Every free constant's value as the file computed it (tuples by element)."""
        out = {}
        for name in self.free:
            base, _, index = name.partition("__")
            v = ns.get(base)
            if index:
                v = v[int(index)] if isinstance(v, tuple) and int(index) < len(v) else None
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[name] = v
        return out


def where(exc, filename):
    """'ValueError: ... (model.py, line 12)' for an exception raised by the user's code."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    if isinstance(exc, SyntaxError) and exc.lineno:
        line = exc.lineno
    text = f"{type(exc).__name__}: {exc}".strip()
    if len(text) > 400:
        text = text[:400] + "..."
    return f"{text} ({filename}, line {line})" if line else text


@contextlib.contextmanager
def patched_factories(meta, record):
    """Inside, torch's tensor factories make meta tensors when `meta` (shapes without memory), and
    every tensor they make is recorded as record[id(t)] = (factory name, args, kwargs)."""
    saved = {}

    def wrap(name, fn):
        def made(*args, **kwargs):
            # nn.Module constructors pass device=None explicitly.
            if meta and kwargs.get("device") is None and not name.endswith("_like"):
                kwargs = dict(kwargs, device="meta")
            t = fn(*args, **kwargs)
            if isinstance(t, torch.Tensor):
                record[id(t)] = (name, args, kwargs, t)
            return t
        return made

    for name in TENSOR_FACTORIES:
        fn = getattr(torch, name, None)
        if fn is not None:
            saved[name] = fn
            setattr(torch, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)


def numel(shape):
    return int(math.prod(shape)) if shape else 1


def call_user(what, fn, filename, *args):
    try:
        return fn(*args)
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise ModuleError(f"{what} tried to exit ({filename})") from None
        raise ModuleError(f"{what} raised {where(e, filename)}") from None


def tensors_of(value, what):
    """The tensors of get_inputs()'s list or forward()'s result, in order; a clear error otherwise."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        out = []
        for i, v in enumerate(value):
            if not isinstance(v, torch.Tensor):
                raise ModuleError(f"{what} gave a {type(v).__name__} at position {i}; kforge takes tensors only")
            out.append(v)
        if not out:
            raise ModuleError(f"{what} gave no tensor")
        return out
    raise ModuleError(f"{what} gave a {type(value).__name__}; kforge takes a tensor or a list of tensors")


def init_args(ns, filename):
    args = call_user("get_init_inputs()", ns["get_init_inputs"], filename)
    if not isinstance(args, (list, tuple)):
        raise ModuleError(f"get_init_inputs() gave a {type(args).__name__}; KernelBench's format is a list")
    return list(args)


def build_model(ns, filename, seed, meta=False):
    """Model(*get_init_inputs()) from a seeded initialisation; on the meta device (no memory) when
    `meta`: parameter shapes without allocating them."""
    args = init_args(ns, filename)
    torch.manual_seed(seed)
    with patched_factories(meta, {}) if meta else contextlib.nullcontext():
        model = call_user("Model(*get_init_inputs())", ns["Model"], filename, *args)
    if not isinstance(model, torch.nn.Module):
        raise ModuleError(f"Model(...) is a {type(model).__name__}, not a torch.nn.Module")
    # KernelBench's convention: train mode (BatchNorm uses the batch's statistics). Dropout would
    # make the answer random: it runs as the identity (stated in the problem's description).
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            m.eval()
    return model


def state_of(model):
    """The module's parameters and buffers, in state_dict order: (key, tensor)."""
    return [(k, v) for k, v in model.state_dict(keep_vars=True).items() if isinstance(v, torch.Tensor)]


def set_threads(n):
    if n and n > 0:
        torch.set_num_threads(int(n))


def fail(msg):
    sys.stderr.write(msg + "\n")
    sys.exit(2)
