#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Part of depot: the memory layer for host, CUDA and HIP tensor data.
"""DLPack round trips between depot and PyTorch on a CUDA device.

    check.py --lib PATH/libdepot_dlpack_torch.so

depot -> torch: the library (dlpack_torch.cpp) makes depot CUDA views (float32 1-D, a
transpose, a strided slice, a slice with a non-zero offset, int64 1-D), fills them, and
exports them with depot::to_dlpack; here they become PyCapsules named "dltensor" that
torch.utils.dlpack.from_dlpack consumes. Checked: the DLPack fields (data + byte_offset is
the view's first element), shape, strides, dtype, device, data pointer and values in torch;
that depot sees torch's writes; that the data stays valid and writable after depot has
dropped every handle of its own and its pool has handed out new blocks of the same sizes
(nothing freed early); and that once the torch tensors are gone each deleter ran exactly
once and depot's pool is back to its baseline (nothing leaked).

torch -> depot: CUDA tensors (contiguous float32, a transposed strided float32 slice, an
int64 column) go through torch.utils.dlpack.to_dlpack; the raw DLManagedTensor* goes to the
library, which imports it with depot::from_dlpack, and the capsule is renamed
"used_dltensor" as the protocol asks. Checked: the layout and data depot sees, writes in
both directions, data still intact after Python has dropped the tensors and torch has reused
its cache, torch's deleter run exactly once when depot lets go, and
torch.cuda.memory_allocated() back to its baseline. Also: a tensor depot refuses (a CPU
tensor for depot::cuda) stays with its capsule.

Exit status: 0 when every check passes, 1 on any mismatch (each one printed), 77 (meson's
"skipped") when torch or a CUDA device is missing; DEPOT_TORCH_REQUIRED=1 makes that 1.
--device cpu runs the same checks on CPU tensors against the library built with -DDLPT_HOST
(development on a machine without a GPU; torch's memory statistics are CUDA-only).
"""
import argparse
import ctypes
import gc
import os
import sys
import traceback

SKIP = 77

# ---- DLPack structures (dlpack.h; the unversioned DLManagedTensor of "dltensor") --------
K_DL_CPU = 1
K_DL_CUDA = 2
K_DL_INT = 0
K_DL_FLOAT = 2


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


# Capsule names: a capsule keeps the pointer it is given, so these buffers live as long as
# the module.
NAME_DLTENSOR = ctypes.create_string_buffer(b"dltensor")
NAME_USED = ctypes.create_string_buffer(b"used_dltensor")

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_void_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_void_p]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]


def capsule_named(capsule, name_buffer):
    return _api.PyCapsule_IsValid(capsule, ctypes.addressof(name_buffer)) == 1


def capsule_name(capsule):
    try:
        name = _api.PyCapsule_GetName(capsule)
    except Exception as e:  # noqa: BLE001 - a diagnostic only
        return "<%s>" % e
    return name.decode() if name is not None else None


def read_dl(ptr):
    """The DLTensor fields at DLManagedTensor* ptr, as plain Python values."""
    m = DLManagedTensor.from_address(ptr)
    t = m.dl_tensor
    n = t.ndim
    return {
        "data": t.data or 0,
        "device": (t.device.device_type, t.device.device_id),
        "ndim": n,
        "dtype": (t.dtype.code, t.dtype.bits, t.dtype.lanes),
        "shape": tuple(t.shape[i] for i in range(n)),
        "strides": None if not t.strides else tuple(t.strides[i] for i in range(n)),
        "byte_offset": t.byte_offset,
    }


# ---- the library ------------------------------------------------------------------------
def load_library(path):
    lib = ctypes.CDLL(path)
    i64, vp, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    sigs = {
        "dlpt_last_error": (ctypes.c_char_p, []),
        "dlpt_init": (i32, []),
        "dlpt_synchronize": (i32, []),
        "dlpt_memory_allocated": (i64, []),
        "dlpt_export_case_count": (i32, []),
        "dlpt_export": (vp, [i32]),
        "dlpt_delete_unconsumed": (None, [vp]),
        "dlpt_check_held": (i64, [i32, vp, i64]),
        "dlpt_held_data": (vp, [i32]),
        "dlpt_drop_held": (i32, []),
        "dlpt_churn": (i32, [i32]),
        "dlpt_release_churn": (i32, []),
        "dlpt_export_deleter_calls": (i64, []),
        "dlpt_export_deleter_errors": (i64, []),
        "dlpt_export_pending": (i64, []),
        "dlpt_import": (i32, [vp]),
        "dlpt_import_layout": (i32, [i32, ctypes.POINTER(i64), ctypes.POINTER(i64), ctypes.POINTER(i64)]),
        "dlpt_import_data": (vp, [i32]),
        "dlpt_import_check": (i64, [i32, vp, i64]),
        "dlpt_import_write": (i32, [i32, vp, i64]),
        "dlpt_import_release": (i32, [i32]),
        "dlpt_import_deleter_calls": (i64, []),
        "dlpt_import_deleter_errors": (i64, []),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    return lib


class Checks:
    def __init__(self, lib):
        self.lib = lib
        self.failures = []
        self.passed = 0

    def error(self):
        return self.lib.dlpt_last_error().decode(errors="replace")

    def check(self, ok, what, detail=""):
        if ok:
            self.passed += 1
        else:
            msg = what + (": " + detail if detail else "")
            self.failures.append(msg)
            print("FAIL: " + msg, flush=True)
        return ok

    def c_ok(self, rc, what):
        """A library call's status: negative (or None) is a failure, with its error text."""
        ok = rc is not None and rc >= 0
        return self.check(ok, what, "" if ok else "library call failed: " + self.error())

    def depot_sees(self, fn, key, expected, what):
        """The library's element-by-element comparison of a depot view with `expected`."""
        exp = expected.contiguous()
        bad = fn(key, ctypes.c_void_p(exp.data_ptr()), exp.numel())
        if bad < 0:
            return self.check(False, what, "library call failed: " + self.error())
        return self.check(bad == 0, what, self.error() if bad else "")


# ---- depot -> torch ---------------------------------------------------------------------
def export_cases(torch):
    """(name, expected CPU tensor with the layout of depot's view, elements in its storage);
    dlpack_torch.cpp's export case k is the k-th entry."""
    f32 = (torch.arange(48, dtype=torch.float32) + 0.5).reshape(6, 8)
    return [
        ("float32 1-D contiguous", torch.arange(1000, dtype=torch.float32) + 0.5, 1000),
        ("float32 (6, 8) transposed", f32.t(), 48),
        ("float32 (6, 8)[:, 0::2] transposed", f32[:, 0::2].t(), 48),
        ("float32 (6, 8)[1:5, 1::3] (offset 9 elements)", f32[1:5, 1::3], 48),
        ("int64 1-D contiguous", (1 << 40) + 3 * torch.arange(257, dtype=torch.int64) - 7, 257),
    ]


def depot_to_torch(torch, lib, c, dev):
    print("== depot -> torch", flush=True)
    from torch.utils.dlpack import from_dlpack

    cases = export_cases(torch)
    c.check(lib.dlpt_export_case_count() == len(cases), "export case count",
            "library has %d, check.py %d" % (lib.dlpt_export_case_count(), len(cases)))
    baseline = lib.dlpt_memory_allocated()
    c.c_ok(baseline, "depot memory_allocated before exporting")
    calls0 = lib.dlpt_export_deleter_calls()
    storage_bytes = 0
    live = []  # (index, name, expected, torch tensor)
    for k, (name, expected, storage_numel) in enumerate(cases):
        ptr = lib.dlpt_export(k)
        if not c.check(bool(ptr), "export %s" % name, "depot::to_dlpack failed: " + c.error()):
            continue
        dl = read_dl(ptr)
        itemsize = expected.element_size()
        storage_bytes += storage_numel * itemsize
        code = K_DL_FLOAT if expected.dtype.is_floating_point else K_DL_INT
        c.check(dl["device"] == (dev.dl_type, 0), "%s: DLPack device" % name, "got %s" % (dl["device"],))
        c.check(dl["dtype"] == (code, itemsize * 8, 1), "%s: DLPack dtype" % name, "got %s" % (dl["dtype"],))
        c.check(dl["shape"] == tuple(expected.shape), "%s: DLPack shape" % name,
                "got %s, expected %s" % (dl["shape"], tuple(expected.shape)))
        c.check(dl["strides"] == tuple(expected.stride()), "%s: DLPack strides" % name,
                "got %s, expected %s" % (dl["strides"], tuple(expected.stride())))
        # Where the first element is: data + byte_offset (depot may put the view's offset in
        # either); torch must land on the same address.
        first = lib.dlpt_held_data(k) or 0
        c.check(dl["data"] + dl["byte_offset"] == first, "%s: DLPack data + byte_offset is the view's first element" % name,
                "data 0x%x + byte_offset %d, first element at 0x%x" % (dl["data"], dl["byte_offset"], first))
        c.check(dl["byte_offset"] % itemsize == 0, "%s: DLPack byte_offset is whole elements" % name,
                "byte_offset %d" % dl["byte_offset"])

        capsule = _api.PyCapsule_New(ptr, ctypes.addressof(NAME_DLTENSOR), None)
        try:
            t = from_dlpack(capsule)
        except Exception as e:  # noqa: BLE001
            c.check(False, "%s: torch.utils.dlpack.from_dlpack" % name, "%s: %s" % (type(e).__name__, e))
            if capsule_named(capsule, NAME_DLTENSOR):  # not consumed: the producer frees it
                lib.dlpt_delete_unconsumed(ptr)
            continue
        c.check(capsule_named(capsule, NAME_USED), "%s: torch renamed the capsule used_dltensor" % name,
                "capsule is named %r" % capsule_name(capsule))
        del capsule

        c.check(t.device == dev.torch, "%s: torch device" % name, "got %s" % t.device)
        c.check(t.dtype == expected.dtype, "%s: torch dtype" % name, "got %s" % t.dtype)
        c.check(tuple(t.shape) == tuple(expected.shape), "%s: torch shape" % name, "got %s" % (tuple(t.shape),))
        c.check(tuple(t.stride()) == tuple(expected.stride()), "%s: torch strides" % name,
                "got %s, expected %s" % (tuple(t.stride()), tuple(expected.stride())))
        hint = ""
        if dl["byte_offset"] and t.data_ptr() == dl["data"]:
            hint = (" -- torch ignored DLTensor.byte_offset (%d) and took DLTensor.data, the storage's "
                    "base, as the first element (PyTorch's fromDLPack does not add byte_offset): "
                    "depot::to_dlpack must export data = the view's first element, byte_offset = 0"
                    % dl["byte_offset"])
        placed = c.check(t.data_ptr() == first, "%s: torch data_ptr is the view's first element" % name,
                         "data_ptr 0x%x, DLTensor.data 0x%x, byte_offset %d%s"
                         % (t.data_ptr(), dl["data"], dl["byte_offset"], hint))
        got = t.cpu()
        c.check(torch.equal(got, expected), "%s: values torch reads" % name,
                "got %s, expected %s%s" % (got.flatten()[:8].tolist(), expected.flatten()[:8].tolist(), hint))
        # A tensor torch misplaced stays alive for the lifetime checks, not for the value ones
        # (its writes land elsewhere in the storage).
        live.append((k, name, expected, t, placed))
    t = got = None  # the list holds the tensors now
    if any(not placed for *_, placed in live):
        print("note: value checks after this point skip the tensors torch misplaced", flush=True)

    # torch writes; depot (still holding its own handles) sees the writes: zero copy.
    for k, name, expected, t, placed in live:
        if placed:
            t.add_(100)
    dev.sync()
    for k, name, expected, t, placed in live:
        if placed:
            c.depot_sees(lib.dlpt_check_held, k, expected + 100, "%s: depot reads torch's write" % name)

    # depot drops every handle of its own: the DLPack tensors alone keep the storage.
    c.c_ok(lib.dlpt_drop_held(), "depot drops its handles")
    alive = lib.dlpt_memory_allocated()
    c.check(alive - baseline >= storage_bytes, "exported storage still allocated in depot's pool after depot dropped its handles",
            "memory_allocated %d, baseline %d, exported storage %d bytes" % (alive, baseline, storage_bytes))
    # New pool blocks of the same sizes, filled with -777: an early free would be overwritten.
    c.c_ok(lib.dlpt_churn(4), "depot allocates and fills new blocks of the same sizes")
    for k, name, expected, t, placed in live:
        if not placed:
            continue
        got = t.cpu()
        c.check(torch.equal(got, expected + 100), "%s: torch data intact after depot dropped its handles" % name,
                "got %s%s" % (got.flatten()[:8].tolist(),
                              " (-777 is what depot wrote into new pool blocks: the storage was freed early)"
                              if bool((got == -777).any()) else ""))
        t.mul_(2)
        got = t.cpu()
        c.check(torch.equal(got, (expected + 100) * 2), "%s: torch writes and reads it afterwards" % name,
                "got %s" % got.flatten()[:8].tolist())
    dev.sync()
    c.c_ok(lib.dlpt_release_churn(), "depot releases the new blocks")
    c.check(lib.dlpt_memory_allocated() == alive, "depot memory_allocated unchanged while torch holds the tensors",
            "now %d, was %d" % (lib.dlpt_memory_allocated(), alive))
    c.check(lib.dlpt_export_deleter_calls() == calls0, "no export deleter ran while torch holds the tensors",
            "%d ran" % (lib.dlpt_export_deleter_calls() - calls0))

    # torch lets go: every deleter runs once and depot's pool is back to its baseline.
    consumed = len(live)
    t = got = None
    live.clear()
    gc.collect()
    dev.sync()
    ran = lib.dlpt_export_deleter_calls() - calls0
    c.check(ran == consumed, "each export deleter ran once after the torch tensors were deleted",
            "%d ran for %d tensors" % (ran, consumed))
    c.check(lib.dlpt_export_deleter_errors() == 0, "no export deleter ran twice",
            "%d bad calls" % lib.dlpt_export_deleter_errors())
    c.check(lib.dlpt_export_pending() == 0, "no exported tensor left undeleted",
            "%d pending" % lib.dlpt_export_pending())
    end = lib.dlpt_memory_allocated()
    c.check(end == baseline, "depot memory_allocated back to its baseline (nothing leaked)",
            "now %d, baseline %d" % (end, baseline))


# ---- torch -> depot ---------------------------------------------------------------------
def import_cases(torch, dev):
    """(name, tensor, parent): tensors that depot imports; parent keeps a view's base."""
    a = torch.arange(1000, dtype=torch.float32, device=dev) * 0.5 - 3.0
    big = torch.arange(96, dtype=torch.float32, device=dev).reshape(8, 12) * 0.25 + 1.0
    big64 = (torch.arange(70, dtype=torch.int64, device=dev) * (1 << 33) - 5).reshape(10, 7)
    return [
        ("float32 1-D contiguous", a, None),
        ("float32 (8, 12)[1::2, 2:11:2] transposed", big[1::2, 2:11:2].t(), big),
        ("int64 (10, 7)[:, 3]", big64[:, 3], big64),
    ]


def torch_to_depot(torch, lib, c, dev):
    print("== torch -> depot", flush=True)
    from torch.utils.dlpack import to_dlpack

    gc.collect()
    dev.sync()
    baseline = dev.memory_allocated()
    calls0 = lib.dlpt_import_deleter_calls()
    handles = []  # (handle, name, expected CPU contiguous, storage elements, dtype)
    cases = import_cases(torch, dev.torch)
    for name, t, parent in cases:
        expected = t.cpu().clone().contiguous()  # a copy even where t is on the CPU
        capsule = to_dlpack(t)
        if not c.check(capsule_named(capsule, NAME_DLTENSOR), "%s: to_dlpack gives a capsule named dltensor" % name,
                       "it is named %r" % capsule_name(capsule)):
            continue
        ptr = _api.PyCapsule_GetPointer(capsule, ctypes.addressof(NAME_DLTENSOR))
        dl = read_dl(ptr)
        h = lib.dlpt_import(ptr)
        if not c.check(h > 0, "%s: depot::from_dlpack imports it" % name, c.error()):
            continue  # the capsule still owns the tensor; its destructor frees it
        c.check(_api.PyCapsule_SetName(capsule, ctypes.addressof(NAME_USED)) == 0, "%s: capsule renamed" % name)
        del capsule

        shape = (ctypes.c_int64 * 8)()
        strides = (ctypes.c_int64 * 8)()
        offset = ctypes.c_int64()
        rank = lib.dlpt_import_layout(h, shape, strides, ctypes.byref(offset))
        if c.c_ok(rank, "%s: depot layout" % name):
            got = (tuple(shape[:rank]), tuple(strides[:rank]))
            want = (tuple(t.shape), tuple(t.stride()))
            c.check(got == want, "%s: depot shape and strides" % name,
                    "depot %s, torch %s (DLPack shape %s strides %s)" % (got, want, dl["shape"], dl["strides"]))
        c.check(lib.dlpt_import_data(h) == t.data_ptr(), "%s: depot's first element is torch's data_ptr" % name,
                "depot 0x%x, torch 0x%x" % (lib.dlpt_import_data(h) or 0, t.data_ptr()))
        c.depot_sees(lib.dlpt_import_check, h, expected, "%s: values depot reads" % name)
        # depot writes, torch sees it; torch writes back, depot sees that.
        written = (-expected - 1).contiguous()
        c.c_ok(lib.dlpt_import_write(h, ctypes.c_void_p(written.data_ptr()), written.numel()),
               "%s: depot writes into the imported view" % name)
        got = t.cpu()
        c.check(torch.equal(got, written), "%s: torch reads depot's write" % name,
                "got %s, expected %s" % (got.flatten()[:8].tolist(), written.flatten()[:8].tolist()))
        t.neg_().sub_(1)  # back to the original values
        dev.sync()
        c.depot_sees(lib.dlpt_import_check, h, expected, "%s: depot reads torch's write" % name)
        storage_numel = (parent if parent is not None else t).numel()  # parents are contiguous
        handles.append((h, name, expected, storage_numel, t.dtype))
    t = parent = got = None  # `cases` holds the tensors now

    # Python drops every tensor: depot's handles alone keep the memory.
    gc.collect()
    dev.sync()
    held = dev.memory_allocated()
    cases.clear()
    gc.collect()
    dev.sync()
    if dev.tracks_memory:
        c.check(dev.memory_allocated() == held, "torch memory_allocated unchanged after Python dropped the tensors depot holds",
                "now %d, was %d" % (dev.memory_allocated(), held))
        c.check(held > baseline, "torch memory still allocated while depot holds it",
                "held %d, baseline %d" % (held, baseline))
    # torch's cache hands out new blocks of the same sizes, filled: an early free would show.
    junk = [torch.full((n,), -777, dtype=dt, device=dev.torch) for _ in range(4) for _, _, _, n, dt in handles]
    dev.sync()
    for h, name, expected, _, _ in handles:
        c.depot_sees(lib.dlpt_import_check, h, expected, "%s: depot data intact after Python dropped the tensor" % name)
    del junk
    gc.collect()
    c.check(lib.dlpt_import_deleter_calls() == calls0, "no import deleter ran while depot holds the views",
            "%d ran" % (lib.dlpt_import_deleter_calls() - calls0))

    # depot lets go: torch's deleter runs once per tensor and torch's memory is back.
    for h, name, _, _, _ in handles:
        c.c_ok(lib.dlpt_import_release(h), "%s: depot releases the view" % name)
    dev.sync()
    ran = lib.dlpt_import_deleter_calls() - calls0
    c.check(ran == len(handles), "torch's deleter ran once per imported tensor", "%d ran for %d" % (ran, len(handles)))
    c.check(lib.dlpt_import_deleter_errors() == 0, "no import deleter ran twice",
            "%d bad calls" % lib.dlpt_import_deleter_errors())
    if dev.tracks_memory:
        end = dev.memory_allocated()
        c.check(end == baseline, "torch memory_allocated back to its baseline after depot released",
                "now %d, baseline %d" % (end, baseline))

    # A tensor depot refuses (CPU memory for depot::cuda) stays with its capsule.
    if not dev.cuda:
        return
    cpu = torch.arange(6, dtype=torch.float32)
    capsule = to_dlpack(cpu)
    ptr = _api.PyCapsule_GetPointer(capsule, ctypes.addressof(NAME_DLTENSOR))
    h = lib.dlpt_import(ptr)
    c.check(h < 0, "depot refuses a CPU tensor as a CUDA view", "it was imported as handle %d" % h)
    if h < 0:
        c.check("device" in c.error(), "depot's refusal names the device", c.error())
        c.check(capsule_named(capsule, NAME_DLTENSOR), "a refused tensor's capsule keeps its dltensor name",
                "it is named %r" % capsule_name(capsule))
        del capsule  # its destructor runs torch's own deleter
        gc.collect()
        c.check(lib.dlpt_import_deleter_calls() - calls0 == len(handles) and lib.dlpt_import_deleter_errors() == 0,
                "a refused import left the deleter with torch")
    else:
        lib.dlpt_import_release(h)


class Device:
    """Where the tensors live: CUDA device 0 (the test), or the CPU (--device cpu, with the
    library built with -DDLPT_HOST: the same checks where no GPU is, less torch's memory
    statistics, which only CUDA has)."""

    def __init__(self, torch, kind):
        self.cuda = kind == "cuda"
        self.torch = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.dl_type = K_DL_CUDA if self.cuda else K_DL_CPU
        self.tracks_memory = self.cuda
        self._t = torch

    def sync(self):
        if self.cuda:
            self._t.cuda.synchronize(self.torch)

    def memory_allocated(self):
        return self._t.cuda.memory_allocated(self.torch) if self.cuda else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="path of libdepot_dlpack_torch.so")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: against a library built with -DDLPT_HOST (development without a GPU)")
    args = ap.parse_args()
    required = os.environ.get("DEPOT_TORCH_REQUIRED") == "1"

    def skip(why):
        print(("FAIL (DEPOT_TORCH_REQUIRED=1): " if required else "SKIP: ") + why, flush=True)
        sys.exit(1 if required else SKIP)

    try:
        import torch
        import torch.utils.dlpack  # noqa: F401
    except ImportError as e:
        skip("PyTorch is not importable (%s)" % e)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            skip("torch %s sees no CUDA device (torch.cuda.is_available() is False; torch CUDA %s)"
                 % (torch.__version__, torch.version.cuda))
        torch.zeros(1, device="cuda")  # torch's CUDA state first, outside every baseline
        where = "%s (torch CUDA %s)" % (torch.cuda.get_device_name(0), torch.version.cuda)
    else:
        where = "the CPU"
    print("torch %s on %s" % (torch.__version__, where), flush=True)
    dev = Device(torch, args.device)

    path = os.path.abspath(args.lib)  # ctypes looks a bare name up on the library path
    if not os.path.isfile(path):
        print("FAIL: no library at %s" % path, flush=True)
        return 1
    lib = load_library(path)
    c = Checks(lib)
    n = lib.dlpt_init()
    if not c.check(n > 0, "depot sees a device",
                   "dlpt_init returned %d: %s" % (n, c.error() if n < 0 else "no device")):
        return 1
    for step in (depot_to_torch, torch_to_depot):
        try:
            step(torch, lib, c, dev)
        except Exception:  # noqa: BLE001 - reported, and the run fails
            c.check(False, step.__name__ + " raised", traceback.format_exc())
    print("%d checks passed, %d failed" % (c.passed, len(c.failures)), flush=True)
    for f in c.failures:
        print("  failed: " + f.splitlines()[0], flush=True)
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
