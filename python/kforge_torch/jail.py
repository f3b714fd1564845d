"""The PyTorch process jails itself: kforge-sandbox hands over the plan (KFORGE_JAIL_PLAN, made by
JailPlanJson in services/gpu-worker/sandbox_jail.cc: which files, which system calls) and the runner
applies it once torch has opened its device, before it reads a request. The CUDA driver does not
initialise inside the jail (kforge-sandbox opens its device before it jails itself, for the same
reason); the tenant's module only arrives in a request, so it never runs outside the jail.

Only the system calls are made here; what the jail allows is decided in C++, in one place for the
sandbox and this process.
"""

import ctypes
import json
import os
import struct
import sys

_PR_SET_NO_NEW_PRIVS = 38
_LANDLOCK_RULE_PATH_BENEATH = 1
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1  # every thread torch already started gets the filter too


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _fail(libc, what):
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def _no_new_privs(libc):
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        raise _fail(libc, "PR_SET_NO_NEW_PRIVS")


def _landlock(libc, plan):
    attr = bytes.fromhex(plan["attr"])
    attr_buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(ctypes.c_long(plan["create"]), attr_buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _fail(libc, "landlock_create_ruleset")
    try:
        for path, access in plan["rules"]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # gone since the plan
            # struct landlock_path_beneath_attr is packed: u64 allowed_access, s32 parent_fd.
            rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
            r = libc.syscall(ctypes.c_long(plan["add"]), ctypes.c_long(ruleset),
                             ctypes.c_long(_LANDLOCK_RULE_PATH_BENEATH), rule, ctypes.c_uint32(0))
            os.close(fd)
            if r < 0:
                raise _fail(libc, f"landlock_add_rule {path}")
        _no_new_privs(libc)
        if libc.syscall(ctypes.c_long(plan["restrict"]), ctypes.c_long(ruleset), ctypes.c_uint32(0)) != 0:
            raise _fail(libc, "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _seccomp(libc, plan):
    code = bytes.fromhex(plan["filter"])
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _no_new_privs(libc)
    if libc.syscall(ctypes.c_long(plan["nr"]), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                    ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog)) != 0:
        raise _fail(libc, "seccomp")


def apply_from_environment():
    """Applies KFORGE_JAIL_PLAN if there is one. Returns what was enforced, or None when not asked;
    exits with status 5 when KFORGE_JAIL_REQUIRED is 1 and the jail cannot be had (as
    kforge-sandbox does)."""
    text = os.environ.pop("KFORGE_JAIL_PLAN", None)
    required = os.environ.pop("KFORGE_JAIL_REQUIRED", "0") == "1"
    if text is None:
        return None
    plan = json.loads(text)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    errors = []
    if "landlock" in plan:
        try:
            _landlock(libc, plan["landlock"])
        except OSError as e:
            errors.append(f"files are not restricted: {e.strerror}")
    else:
        errors.append(plan.get("landlock_error", "files are not restricted"))
    # The filter goes on whatever Landlock said: what can be closed is closed.
    try:
        _seccomp(libc, plan["seccomp"])
    except OSError as e:
        errors.append(f"sockets and signals are not restricted: {e.strerror}")
    if errors:
        sys.stderr.write(f"kforge-sandbox: the PyTorch process is not jailed: {'; '.join(errors)}\n")
        if required:
            sys.exit(5)
        return None
    return plan.get("summary", "")
