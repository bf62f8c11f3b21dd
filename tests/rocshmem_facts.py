"""rocSHMEM's device API as read from its sources (facts, not derived from ditron's table).

Read on 2026-11-25 from the newest rocSHMEM, ROCm/rocm-systems ``projects/rocshmem`` (CMakeLists.txt
``set(VERSION_STRING 3.4.0)``, read at commit 006ac1aa):

* ``src/device/rocshmem_wrapper.cc`` at commits fc82b313 (the newest stored) and 2922ab56 (identical for
  every function below): the ``extern "C"`` functions (``ROCSHMEM_DEVICE_API`` = ``__device__``, default
  visibility) that JIT consumers link by their plain C names.  Typed families are macros there:
  ``WRAP_AMO_STANDARD(uint64_t, uint64)`` gives ``void rocshmem_uint64_atomic_add(uint64_t *dest,
  uint64_t value, int pe)``, ``WRAP_AMO_EXTENDED(uint64_t, uint64)`` gives ``void
  rocshmem_uint64_atomic_set(uint64_t *dest, uint64_t value, int pe)``, ``WRAP_WAIT(uint64_t, uint64)``
  gives ``void rocshmem_uint64_wait_until(uint64_t *ivars, int cmp, uint64_t val)``.
* ``include/rocshmem/rocshmem_common.hpp`` at commit 48cce340: ``enum ROCSHMEM_SIGNAL_OPS {
  ROCSHMEM_SIGNAL_SET, ROCSHMEM_SIGNAL_ADD }`` and ``enum rocshmem_cmps { ROCSHMEM_CMP_EQ, ROCSHMEM_CMP_NE,
  ROCSHMEM_CMP_GT, ROCSHMEM_CMP_GE, ROCSHMEM_CMP_LT, ROCSHMEM_CMP_LE }`` (implicit values 0, 1, ...; the
  same order in ROCm/rocSHMEM ``develop``, 2.0.0, commit eb5a38e8, include/rocshmem/rocshmem_common.hpp);
  ``extern "C" __device__ rocshmem_ctx_t ROCSHMEM_CTX_DEFAULT`` (the per-module context that the host's
  ``rocshmem_hipmodule_init(hipModule_t, hipStream_t)`` copies into each loaded module).
* ``cmake/DeviceBitcode.cmake`` at commit 10f6c531: one bitcode per architecture,
  ``librocshmem_device_<arch>.bc``, installed in ``${CMAKE_INSTALL_LIBDIR}``.

Absent from every rocSHMEM read (2.0.0 on ROCm/rocSHMEM ``develop``, 3.2.0, and the newest):
``rocshmem_signal_op``, ``rocshmem_mc_ptr``; ``rocshmem_signal_wait_until`` is documented but neither
declared nor exported by the newest.  2.0.0 and 3.2.0 export only C++ names (``namespace rocshmem``).
"""

ROCSHMEM_VERSION = "3.4.0"

#: C prototype of each exported function: name -> (return type, parameter types), as spelled in
#: rocshmem_wrapper.cc
EXPORTS = {
    "rocshmem_my_pe": ("int", []),
    "rocshmem_n_pes": ("int", []),
    "rocshmem_ptr": ("void *", ["const void *", "int"]),
    "rocshmem_quiet": ("void", []),
    "rocshmem_fence": ("void", []),
    "rocshmem_barrier_all": ("void", []),
    "rocshmem_barrier_all_wave": ("void", []),
    "rocshmem_barrier_all_wg": ("void", []),
    "rocshmem_sync_all": ("void", []),
    "rocshmem_sync_all_wave": ("void", []),
    "rocshmem_sync_all_wg": ("void", []),
    "rocshmem_signal_fetch": ("uint64_t", ["const uint64_t *"]),
    "rocshmem_uint64_atomic_set": ("void", ["uint64_t *", "uint64_t", "int"]),
    "rocshmem_uint64_atomic_add": ("void", ["uint64_t *", "uint64_t", "int"]),
    "rocshmem_uint64_wait_until": ("void", ["uint64_t *", "int", "uint64_t"]),
}
for _op in ("putmem", "getmem"):
    for _sfx in ("", "_wave", "_wg", "_nbi", "_nbi_wave", "_nbi_wg"):
        EXPORTS[f"rocshmem_{_op}{_sfx}"] = ("void", ["void *", "const void *", "size_t", "int"])
for _sfx in ("", "_wg", "_wave", "_nbi", "_nbi_wg", "_nbi_wave"):
    EXPORTS[f"rocshmem_putmem_signal{_sfx}"] = (
        "void", ["void *", "const void *", "size_t", "uint64_t *", "uint64_t", "int", "int"])

#: rocshmem_common.hpp's enumerators, in declaration order (so their values are their indices)
SIGNAL_OPS = ["ROCSHMEM_SIGNAL_SET", "ROCSHMEM_SIGNAL_ADD"]
CMPS = ["ROCSHMEM_CMP_EQ", "ROCSHMEM_CMP_NE", "ROCSHMEM_CMP_GT", "ROCSHMEM_CMP_GE", "ROCSHMEM_CMP_LT",
        "ROCSHMEM_CMP_LE"]

#: names that no rocSHMEM exports (ditron must not call them)
NOT_EXPORTED = ["rocshmem_signal_op", "rocshmem_signal_wait_until", "rocshmem_mc_ptr", "rocshmem_wg_barrier_all",
                "rocshmem_wg_sync_all"]

#: C type -> LLVM IR type on amdgcn (pointers are flat: addrspace 0)
LLVM = {"void": "void", "int": "i32", "size_t": "i64", "uint64_t": "i64", "void *": "ptr", "const void *": "ptr",
        "uint64_t *": "ptr", "const uint64_t *": "ptr"}


def llvm_prototype(name):
    ret, params = EXPORTS[name]
    return LLVM[ret], [LLVM[p] for p in params]


def fake_library_ir():
    """A stand-in for librocshmem_device_<arch>.bc built from EXPORTS: every function with its exact
    LLVM prototype, noinline, and a body that keeps each argument alive (volatile stores to a sink), so
    that the optimised kernel still shows each call with its arguments.  It lets the CPU compile and link
    kernels against rocSHMEM's prototypes; it is no rocSHMEM."""
    lines = ["; stand-in for rocSHMEM's device bitcode (tests only): exact prototypes, no implementation",
             "@rocshmem_fake_sink = addrspace(1) global [16 x i64] zeroinitializer, align 8"]
    for name in sorted(EXPORTS):
        ret, params = llvm_prototype(name)
        args = ", ".join(f"{t} %a{i}" for i, t in enumerate(params))
        body = ["  store volatile i64 1, ptr addrspace(1) getelementptr inbounds ([16 x i64], ptr addrspace(1) "
                "@rocshmem_fake_sink, i64 0, i64 15), align 8"]     # a side effect, also without parameters
        for i, t in enumerate(params):
            slot = f"getelementptr inbounds ([16 x i64], ptr addrspace(1) @rocshmem_fake_sink, i64 0, i64 {i})"
            body.append(f"  store volatile {t} %a{i}, ptr addrspace(1) {slot}, align 8")
        if ret == "void":
            body.append("  ret void")
        elif ret == "ptr":
            body.append("  %r = load volatile ptr, ptr addrspace(1) @rocshmem_fake_sink, align 8\n  ret ptr %r")
        else:
            body.append(f"  %r = load volatile {ret}, ptr addrspace(1) @rocshmem_fake_sink, align 8\n  ret {ret} %r")
        lines.append(f"define {ret} @{name}({args}) #0 {{\n" + "\n".join(body) + "\n}")
    lines.append("attributes #0 = { noinline nounwind }")
    return "\n".join(lines) + "\n"
