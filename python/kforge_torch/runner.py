"""The worker's PyTorch reference: a jailed process that runs the tenant's module.

The worker starts it (kforge-sandbox --python: files closed before Python starts; network,
signals, IPC and new processes once torch has opened its device, jail.py, before any request)
and asks, over frames (protocol.py):
  hello                     torch's version, the device, whether torch.compile is there
  load  {set, problem, source, filename, constants, seed, max_state_bytes}
                            builds Model(*get_init_inputs()) of that size set from a seeded
                            initialisation; answers its state_dict entries (the candidate's
                            read-only inputs) with their bytes. Another problem's modules go.
  run   {set, inputs}       forward() on the worker's inputs; answers the outputs
  time  {set, mode, sets, warmup, min_samples, max_samples, min_seconds, max_seconds}
                            times forward() (eager, or torch.compile's) rotating over input sets,
                            as a warmed-up process runs it: same inputs, memory reused (the worker
                            preloads jemalloc so that freed memory is not returned to the system
                            and faulted in again on every call); answers the samples in seconds
Timing runs under torch.no_grad(): a forward pass, as KernelBench times it.
"""

import os
import sys
import time

import torch

from kforge_torch import jail, modfile, protocol

DEVICE = "cpu"
MODELS = {}      # size set -> model
COMPILED = {}    # size set -> torch.compile(model)
PROBLEM = None   # whose modules MODELS holds: one problem's at a time


def _device():
    want = os.environ.get("KFORGE_TORCH_DEVICE", "")
    if want:
        return want
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def _sync():
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def hello(req, _):
    global DEVICE
    DEVICE = _device()
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        # Never a baseline on another device than the candidates': say why instead.
        raise ValueError(f"torch {torch.__version__} cannot use {DEVICE} here (built without CUDA, or no "
                         f"GPU visible)")
    modfile.set_threads(req.get("threads", 0))
    return {"torch": torch.__version__, "device": DEVICE, "compile": hasattr(torch, "compile"),
            "threads": torch.get_num_threads()}, b""


def load(req, _):
    global PROBLEM
    if req.get("problem") != PROBLEM:
        # Another problem's modules go (a worker serves many): their memory, on the GPU too.
        MODELS.clear()
        if COMPILED:
            COMPILED.clear()
            torch._dynamo.reset()  # torch.compile's own caches of the graphs it compiled
        if DEVICE.startswith("cuda"):
            torch.cuda.empty_cache()
        PROBLEM = req.get("problem")
    source = req["source"]
    filename = req.get("filename", "model.py")
    mf = modfile.ModelFile(source, filename)
    ns = mf.run({k: v for k, v in req.get("constants", {}).items()})
    # Shapes first (no memory), so that a module too large for this worker is refused, not built.
    meta = modfile.build_model(ns, filename, req.get("seed", 0), meta=True)
    state_bytes = sum(t.numel() * t.element_size() for _, t in modfile.state_of(meta))
    limit = req.get("max_state_bytes", 0)
    if limit and state_bytes > limit:
        raise modfile.ModuleError(f"the module's parameters and buffers take {state_bytes} bytes, over this "
                                  f"worker's limit of {limit}")
    model = modfile.build_model(ns, filename, req.get("seed", 0)).to(DEVICE)
    MODELS[req["set"]] = model
    COMPILED.pop(req["set"], None)
    state = modfile.state_of(model)
    specs, data = protocol.tensors_to([t for _, t in state])
    for (key, _), s in zip(state, specs):
        s["key"] = key
    return {"state": specs}, data


def _model(req):
    model = MODELS.get(req.get("set"))
    if model is None:
        raise ValueError(f"size set {req.get('set')!r} was not loaded")
    return model


def _forward(model, inputs, filename="model.py"):
    with torch.no_grad():
        out = modfile.call_user("forward()", model, filename, *inputs)
    return modfile.tensors_of(out, "forward()")


def run(req, payload):
    model = _model(req)
    inputs = protocol.tensors_from(req["inputs"], payload, DEVICE)
    outputs = _forward(model, inputs)
    _sync()
    specs, data = protocol.tensors_to(outputs)
    return {"outputs": specs}, data


def timed(req, payload):
    model = _model(req)
    if req.get("mode") == "compile":
        if not hasattr(torch, "compile"):
            raise ValueError(f"torch {torch.__version__} has no torch.compile")
        if req["set"] not in COMPILED:
            try:
                # One module, one or a few kernels: a pool of compiler processes costs more than it saves.
                import torch._inductor.config as inductor_config
                inductor_config.compile_threads = 1
            except Exception:  # noqa: BLE001 (an older or newer torch without that setting)
                pass
            COMPILED[req["set"]] = torch.compile(model)
        model = COMPILED[req["set"]]
    sets = [protocol.tensors_from(specs, payload, DEVICE) for specs in req["sets"]]
    warmup = max(1, int(req.get("warmup", 2)))
    min_samples = max(1, int(req.get("min_samples", 10)))
    max_samples = max(min_samples, int(req.get("max_samples", 200)))
    min_seconds = float(req.get("min_seconds", 0.25))
    max_seconds = float(req.get("max_seconds", 30))
    cuda = DEVICE.startswith("cuda")
    if cuda:
        # As KernelBench times it and as the candidates are: CUDA events around each call (the
        # launch's own cost included), the L2 cache flushed before it, as the sandbox does.
        flush = _flush_buffer()
        begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start = time.perf_counter()
    with torch.no_grad():
        for i in range(warmup):
            model(*sets[i % len(sets)])
        _sync()
        samples = []
        spent = 0.0
        while len(samples) < max_samples:
            inputs = sets[len(samples) % len(sets)]
            if cuda:
                flush.fill_(len(samples) & 0xFF)
                begin.record()
                model(*inputs)
                finish.record()
                finish.synchronize()
                dt = begin.elapsed_time(finish) / 1e3
            else:
                t0 = time.perf_counter()
                model(*inputs)
                dt = time.perf_counter() - t0
            samples.append(dt)
            spent += dt
            if len(samples) >= min_samples and spent >= min_seconds:
                break
            if time.perf_counter() - start > max_seconds and len(samples) >= 3:
                break
    return {"samples": samples}, b""


_FLUSH = []


def _flush_buffer():
    """Bytes to overwrite before each timed call: twice the GPU's L2, 256 MB where torch does not
    say."""
    if not _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(DEVICE), "L2_cache_size", 0) or (128 << 20)
        _FLUSH.append(torch.empty(2 * l2, dtype=torch.uint8, device=DEVICE))
    return _FLUSH[0]


def handle(req, payload):
    op = req.get("op")
    if op == "hello":
        return hello(req, payload)
    if op == "load":
        return load(req, payload)
    if op == "run":
        return run(req, payload)
    if op == "time":
        return timed(req, payload)
    if op == "import":
        from kforge_torch import describe
        return describe.import_request(req), b""
    raise ValueError(f"unknown op {op!r}")


def _open_device():
    """Opens the device before the jail closes: the CUDA context, cuBLAS and cuDNN start here."""
    device = _device()
    if not device.startswith("cuda"):
        return
    x = torch.ones(64, 64, device=device)
    (x @ x).sum().item()
    try:
        torch.nn.functional.conv2d(torch.ones(1, 1, 8, 8, device=device),
                                   torch.ones(1, 1, 3, 3, device=device)).sum().item()
    except Exception:  # noqa: BLE001 (a torch without cuDNN still runs the rest)
        pass


def main():
    try:
        _open_device()
    except Exception as e:  # noqa: BLE001 (hello reports the device torch did get)
        sys.stderr.write(f"kforge-torch: the device did not open before the jail: {e}\n")
    jail.apply_from_environment()
    try:
        protocol.serve(handle)
    except modfile.ModuleError as e:
        sys.stderr.write(f"{e}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
