"""The second step of the PyTorch process's jail. kforge-sandbox restricted the files before
Python started (Landlock, which binds every thread started after it); the rest (seccomp: no
socket, no signal outside, no IPC, no new process unless allowed) closes once torch has opened its
device, because the CUDA driver does not initialise inside the whole jail, and before the runner
reads a request, so the tenant's module never runs outside it. The filter goes on every thread the
process already has (torch's and the driver's), by seccomp's thread sync.

The filter is built in C++ (SeccompPlanJson in services/gpu-worker/sandbox_jail.cc, the same as
kforge-sandbox's own); only the system call is made here.
"""

import ctypes
import json
import os
import sys

_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_EXIT_NOT_JAILED = 5  # kExitNotJailed


class _Prog(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _seccomp(plan):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    code = bytes.fromhex(plan["filter"])
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    r = libc.syscall(ctypes.c_long(plan["nr"]), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                     ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if r > 0:  # the id of a thread that could not take the filter
        raise OSError(0, f"seccomp: thread {r} could not take the filter")
    if r != 0:
        raise OSError(ctypes.get_errno(), f"seccomp: {os.strerror(ctypes.get_errno())}")


def apply_from_environment():
    """Applies KFORGE_JAIL_PLAN. Returns what the jail enforces, or None when unjailed; exits
    with status 5 when KFORGE_JAIL_REQUIRED is 1 and the jail cannot be had (as kforge-sandbox
    does)."""
    text = os.environ.pop("KFORGE_JAIL_PLAN", None)
    required = os.environ.pop("KFORGE_JAIL_REQUIRED", "0") == "1"
    if text is None:
        if not required:
            return None  # an unjailed runner (sandbox.restrict_files off), which the worker knows
        sys.stderr.write("kforge-sandbox: the PyTorch process is not jailed: no jail plan was handed over\n")
        sys.exit(_EXIT_NOT_JAILED)
    try:
        plan = json.loads(text)
        _seccomp(plan["seccomp"])
        return plan.get("summary", "")
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write(f"kforge-sandbox: the PyTorch process is not jailed: sockets and signals are not "
                         f"restricted: {e}\n")
        if required:
            sys.exit(_EXIT_NOT_JAILED)
        return None
