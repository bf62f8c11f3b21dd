"""The few CUDA driver calls the GPU runtime needs, through ctypes on
``libcuda.so.1`` (always present where a CUDA GPU is; no cuda-python needed):
find a module global (``cuModuleGetGlobal``) and write it (``cuMemcpyHtoD``).
Loaded on first use, never at import."""
from __future__ import annotations

import ctypes
import struct

from ..errors import DitronError

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_FOUND = 500

_LIB = None


class IpcMemHandle(ctypes.Structure):
    """``CUipcMemHandle``: 64 opaque bytes, passed by value."""
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def _lib():
    global _LIB
    if _LIB is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise DitronError(f"cannot load the CUDA driver library libcuda.so.1 ({e})") from None
        lib.cuModuleGetGlobal_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                             ctypes.c_void_p, ctypes.c_char_p]
        lib.cuModuleGetGlobal_v2.restype = ctypes.c_int
        lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        lib.cuMemcpyHtoD_v2.restype = ctypes.c_int
        for name in ("cuStreamWriteValue64", "cuStreamWaitValue64"):
            fn = getattr(lib, name + "_v2", None) or getattr(lib, name, None)
            if fn is not None:
                fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
                fn.restype = ctypes.c_int
            setattr(lib, "_ditron_" + name, fn)
        lib.cuMemcpyAsync.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        lib.cuMemcpyAsync.restype = ctypes.c_int
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuGetErrorName.restype = ctypes.c_int
        # plain allocations shared with other processes of the same GPU (ranks that share a GPU)
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        lib.cuMemAlloc_v2.restype = ctypes.c_int
        lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        lib.cuMemFree_v2.restype = ctypes.c_int
        lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(IpcMemHandle), ctypes.c_uint64]
        lib.cuIpcGetMemHandle.restype = ctypes.c_int
        lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), IpcMemHandle, ctypes.c_uint]
        lib.cuIpcOpenMemHandle_v2.restype = ctypes.c_int
        lib.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
        lib.cuIpcCloseMemHandle.restype = ctypes.c_int
        _LIB = lib
    return _LIB


def error_name(code: int) -> str:
    name = ctypes.c_char_p()
    if _lib().cuGetErrorName(code, ctypes.byref(name)) == CUDA_SUCCESS and name.value:
        return name.value.decode()
    return f"CUresult {code}"


def module_global(module: int, symbol: str):
    """(device address, size) of ``symbol`` in the loaded ``module``, or None
    when the module does not define it."""
    ptr = ctypes.c_uint64()
    size = ctypes.c_size_t()
    rc = _lib().cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), ctypes.c_void_p(int(module)),
                                     symbol.encode())
    if rc == CUDA_ERROR_NOT_FOUND:
        return None
    if rc != CUDA_SUCCESS:
        raise DitronError(f"cuModuleGetGlobal({symbol}) failed: {error_name(rc)}")
    return ptr.value, size.value


def write_words(dptr: int, words, size: int):
    """Write 64-bit ``words`` (signed or unsigned Python ints) to device
    address ``dptr`` (synchronous; ``size`` bytes at most)."""
    data = struct.pack(f"<{len(words)}Q", *[w & 0xFFFF_FFFF_FFFF_FFFF for w in words])
    if len(data) > size:
        raise DitronError(f"world descriptor is {len(data)} bytes but the module's global has {size}")
    buf = ctypes.create_string_buffer(data, len(data))
    rc = _lib().cuMemcpyHtoD_v2(ctypes.c_uint64(dptr), buf, len(data))
    if rc != CUDA_SUCCESS:
        raise DitronError(f"writing the world descriptor (cuMemcpyHtoD) failed: {error_name(rc)}")


CU_STREAM_WAIT_VALUE_GEQ = 0x0
CU_STREAM_WAIT_VALUE_EQ = 0x1
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1


def _stream_memop(name, stream: int, dptr: int, value: int, flags: int):
    fn = getattr(_lib(), "_ditron_" + name)
    if fn is None:
        raise DitronError(f"the CUDA driver has no {name} (stream memory operations need CUDA >= 11.7)")
    rc = fn(ctypes.c_void_p(int(stream)), ctypes.c_uint64(int(dptr)), ctypes.c_uint64(int(value) & (2**64 - 1)),
            ctypes.c_uint(flags))
    if rc != CUDA_SUCCESS:
        raise DitronError(f"{name} failed: {error_name(rc)}")


def stream_write_value64(stream: int, dptr: int, value: int):
    """``cuStreamWriteValue64`` with the default flags (a memory fence first)."""
    _stream_memop("cuStreamWriteValue64", stream, dptr, value, 0)


def stream_wait_value64(stream: int, dptr: int, value: int):
    """``cuStreamWaitValue64(..., CU_STREAM_WAIT_VALUE_EQ)``."""
    _stream_memop("cuStreamWaitValue64", stream, dptr, value, CU_STREAM_WAIT_VALUE_EQ)


def stream_wait_value64_geq(stream: int, dptr: int, value: int):
    """``cuStreamWaitValue64(..., CU_STREAM_WAIT_VALUE_GEQ)``: the stream waits until the 64-bit word at ``dptr``
    is >= ``value`` (as a signed difference)."""
    _stream_memop("cuStreamWaitValue64", stream, dptr, value, CU_STREAM_WAIT_VALUE_GEQ)


def _check(rc, what):
    if rc != CUDA_SUCCESS:
        raise DitronError(f"{what} failed: {error_name(rc)}")


def mem_alloc(nbytes: int) -> int:
    """``cuMemAlloc`` in the current context (the caller's GPU): a plain allocation another process can map."""
    ptr = ctypes.c_uint64()
    _check(_lib().cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(nbytes))), f"cuMemAlloc({nbytes} bytes)")
    return ptr.value


def mem_free(dptr: int):
    _check(_lib().cuMemFree_v2(ctypes.c_uint64(int(dptr))), "cuMemFree")


def ipc_get_handle(dptr: int) -> bytes:
    """``cuIpcGetMemHandle`` of an allocation made by :func:`mem_alloc` (64 bytes, picklable)."""
    h = IpcMemHandle()
    _check(_lib().cuIpcGetMemHandle(ctypes.byref(h), ctypes.c_uint64(int(dptr))), "cuIpcGetMemHandle")
    return ctypes.string_at(ctypes.addressof(h), 64)     # all 64 bytes (a c_char view would stop at a NUL)


def ipc_open_handle(handle: bytes) -> int:
    """Map another process's allocation into this one (``cuIpcOpenMemHandle``); its base address here."""
    if len(handle) != 64:
        raise DitronError(f"a CUDA IPC handle is 64 bytes, got {len(handle)}")
    h = IpcMemHandle()
    ctypes.memmove(ctypes.addressof(h), bytes(handle), 64)
    ptr = ctypes.c_uint64()
    _check(_lib().cuIpcOpenMemHandle_v2(ctypes.byref(ptr), h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
           "cuIpcOpenMemHandle")
    return ptr.value


def ipc_close_handle(dptr: int):
    _check(_lib().cuIpcCloseMemHandle(ctypes.c_uint64(int(dptr))), "cuIpcCloseMemHandle")


def memcpy_async(dst: int, src: int, nbytes: int, stream: int):
    """``cuMemcpyAsync`` (unified addressing: a peer's mapped memory is a
    copy-engine peer-to-peer copy)."""
    rc = _lib().cuMemcpyAsync(ctypes.c_uint64(int(dst)), ctypes.c_uint64(int(src)), ctypes.c_size_t(int(nbytes)),
                              ctypes.c_void_p(int(stream)))
    if rc != CUDA_SUCCESS:
        raise DitronError(f"cuMemcpyAsync failed: {error_name(rc)}")
