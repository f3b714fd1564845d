"""Frames between a kforge process and its jailed Python one, over stdin/stdout.

A frame is a little-endian u32 length and that many bytes of a JSON header, then a little-endian
u64 length and that many bytes of payload (tensor bytes, concatenated; the header says where each
one lies: {"dtype", "shape", "offset", "bytes"}). An answer that failed is {"error": "..."}.
"""

import json
import os
import struct
import sys

import torch

DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
          "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8, "bool": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}

MAX_HEADER = 64 << 20


def read_exact(f, n):
    out = bytearray()
    while len(out) < n:
        chunk = f.read(n - len(out))
        if not chunk:
            return None
        out += chunk
    return bytes(out)


def read_frame(f):
    head = read_exact(f, 4)
    if head is None:
        return None, None
    (n,) = struct.unpack("<I", head)
    if n > MAX_HEADER:
        raise ValueError(f"header of {n} bytes")
    header = json.loads(read_exact(f, n) or b"null")
    (m,) = struct.unpack("<Q", read_exact(f, 8))
    payload = read_exact(f, m) if m else b""
    return header, payload


def write_frame(f, header, payload=b""):
    data = json.dumps(header).encode()
    f.write(struct.pack("<I", len(data)))
    f.write(data)
    f.write(struct.pack("<Q", len(payload)))
    if payload:
        f.write(payload)
    f.flush()


def tensors_from(specs, payload, device="cpu"):
    """Tensors from their header entries and the payload (copies: the payload is reused)."""
    out = []
    for s in specs:
        dtype = DTYPES[s["dtype"]]
        raw = payload[s["offset"]:s["offset"] + s["bytes"]]
        # bool travels as u8 bytes (0 or 1).
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8 if dtype == torch.bool else dtype)
        if dtype == torch.bool:
            t = t.bool()
        t = t.reshape(s["shape"])
        # A number forward takes (get_inputs gave 3.14, not a tensor).
        out.append(t.item() if s.get("key") == "scalar" else t.to(device))
    return out


def tensors_to(tensors):
    """Header entries and payload for tensors (bool as u8)."""
    specs, parts, offset = [], [], 0
    for t in tensors:
        t = t.detach()
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
            name = "bool"
        else:
            name = NAMES.get(t.dtype)
            if name is None:
                raise ValueError(f"a tensor of dtype {t.dtype}, which kforge has no buffer type for")
        data = t.contiguous().cpu().numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.contiguous().cpu().view(torch.int16).numpy().tobytes()
        specs.append({"dtype": name, "shape": list(t.shape), "offset": offset, "bytes": len(data)})
        parts.append(data)
        offset += len(data)
    return specs, b"".join(parts)


def serve(handle):
    """Answers frames on stdin until it closes; `handle(header, payload) -> (header, payload)`."""
    # The frames move to descriptors of their own: whatever the module prints or writes to
    # descriptor 1 goes to stderr, and what it reads from descriptor 0 is empty, so it can
    # neither mix with the frames nor swallow one.
    fin = os.fdopen(os.dup(0), "rb")
    fout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    except OSError:
        os.close(0)
    sys.stdout = sys.stderr
    while True:
        header, payload = read_frame(fin)
        if header is None:
            return
        try:
            out, data = handle(header, payload)
        except Exception as e:  # noqa: BLE001 - every failure is an answer, never a dead process
            # The module's own errors already say where; others say what kind they are.
            text = str(e) if type(e).__name__ == "ModuleError" else f"{type(e).__name__}: {e}"
            out, data = {"error": text[:2000]}, b""
        write_frame(fout, out, data)
