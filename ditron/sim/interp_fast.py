"""Cheaper bookkeeping in Triton's interpreter, with the same results.

Most of the CPU of a simulated program is not NumPy arithmetic but the interpreter's per-operation Python
bookkeeping.  This module replaces some of it with exact equivalents (same values, same types, same errors),
installed once per process by the executor (:func:`install`):

* ``_get_np_dtype`` (Triton type -> the NumPy storage dtype; called for nearly every operation) builds a
  17-entry dict of Triton dtypes, hashing each, on every call.  Here the answer for a scalar type is remembered
  by its name -- Triton dtypes compare and hash by name, so the dict lookup it replaces answers by name too;
  pointers and blocks of pointers are ``uint64`` as before, and a type it has not answered yet (or any other
  object) goes to Triton's own function, whose result (or ``KeyError``) is what the caller sees.
* ``tl.tensor.__init__`` wraps the shape of every tensor the interpreter makes in a ``tl.tuple`` of
  ``constexpr``, whose ``type`` (a ``tuple_type`` of the elements' types) it computes at once, and its ``numel``
  in a ``constexpr``; most tensors are only read by type.  Here ``shape`` and ``numel`` are computed from the
  tensor's ``type`` when first read (:class:`_Lazy` attributes of the class; nothing assigns a tensor's ``type``
  after its constructor): the same ``tl.tuple`` of the same ``constexpr`` values, whose ``type`` is computed from
  them when first read (the same ``tuple_type``: the constexprs never change).  ``tl.tuple``'s
  constructor does the same for every tuple of ints and constexprs (shapes compared, concatenated, indexed);
  a tuple holding anything else gets its type at once, as before.
* ``tl.block_type.__init__`` unwraps the shape, checks it (``validate_block_shape``: powers of two, the element
  limit) and formats its name for every block the interpreter makes.  A shape of plain ``int`` (a list or a
  ``tl.tuple``) is taken as it is (what the unwrapping gives for it), into a ``tl.tuple`` whose ``type`` is
  computed when read (as above), and the check's result and the shape's text for a shape that passed it are
  remembered (a shape that fails is checked again, raising the same error).
* the wrappers with which the interpreter patches ``triton.language`` (``_patch_attr``) drop a caller's
  ``_semantic`` keyword by copying every keyword argument into a new dict on every call; here the ``_semantic``
  keyword is removed from the call's own (fresh) keyword dict: the callee gets the same arguments.

The semantic's decisions from types alone (binary operations, broadcasts, casts, ``expand_dims``) are
remembered and replayed by :mod:`ditron.sim.interp_plans`, installed with these.

Each replacement is installed only when Triton's own function has exactly the source it replaces (3.6 and 3.9 as
released); otherwise Triton's stays.

``ORIGINALS`` keeps Triton's own functions and ``TARGETS`` where each was installed (tests compare the two).
"""
from __future__ import annotations

import builtins

from .interp_patch import ABSENT, ORIGINALS, TARGETS, _replace, _source_is  # noqa: F401 -- (tests read them)

_INSTALLED = False


class _Lazy:
    """An attribute computed from the object when first read and then kept in its ``__dict__`` (which takes
    precedence from then on): ``functools.cached_property`` without its lock (Python 3.11 takes an ``RLock`` at
    every first read; two threads reading it at once both compute the same value)."""
    __slots__ = ("fn", "name")

    def __init__(self, fn, name):
        self.fn, self.name = fn, name

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


def _make_np_dtype(orig, tl, np):
    dtype_cls, block_cls, pointer_cls = tl.dtype, tl.block_type, tl.pointer_type
    u64 = np.dtype(np.uint64)
    by_name: dict = {}

    def _get_np_dtype(tt_dtype):
        cls = type(tt_dtype)
        if cls is block_cls:
            elem = tt_dtype.element_ty
            if type(elem) is dtype_cls:
                hit = by_name.get(elem.name)
                if hit is not None:
                    return hit
        elif cls is dtype_cls:
            hit = by_name.get(tt_dtype.name)
            if hit is not None:
                return hit
        elif cls is pointer_cls:
            return u64
        ret = orig(tt_dtype)
        if cls is dtype_cls:
            by_name[tt_dtype.name] = ret
        elif cls is block_cls and type(tt_dtype.element_ty) is dtype_cls:
            by_name[tt_dtype.element_ty.name] = ret
        return ret

    _get_np_dtype.__wrapped__ = orig
    return _get_np_dtype


_TENSOR_INIT = ("super().__init__()", "self.handle = handle", "self.shape = type.shape if type.is_block() else ()",
                "self.numel = constexpr(math.prod(self.shape))", "self.type = type  # Tensor type (can be block_type)",
                "self.dtype = type.scalar", "self.shape = tuple([constexpr(s) for s in self.shape])")
_CONSTEXPR_INIT = ("while isinstance(value, constexpr):", "value = value.value", "self.value = value",
                   "self.type = constexpr_type(value)")
_TUPLE_INIT = ("self.values = [i for i in args]", "if isinstance(type, tuple_type):", "self.type = type",
               "elif type is not None:  # make_template in ASTFunction.deserialize may pass us a list/tuple",
               "self.type = tuple_type(type)", "else:", "self.type = _type_for_tuple_values(self.values)")
_BLOCK_INIT = ("self.element_ty = element_ty", "assert (isinstance(shape, (list, tuple)))",
               "self.shape = tuple(_unwrap_shape(shape))", "if not self.shape:",
               "raise TypeError('0d block_type is forbidden')", "self.numel = validate_block_shape(self.shape)",
               "self.name = f'<{self.shape}, {self.element_ty}>'")
_PATCH_ATTR_36 = ("semantic = TritonSemantic(builder)",
                  "new_member = lambda *args, member=member, **kwargs: (member(*args, **",
                  "{k: v", "for k, v in kwargs.items()", 'if k != "_semantic"}, _semantic=semantic))',
                  "scope.set_attr(obj, name, new_member)")
_PATCH_ATTR_39 = ("new_member = lambda *args, member=member, **kwargs: (member(*args, **",
                  "{k: v", "for k, v in kwargs.items()", 'if k != "_semantic"}, _semantic=interpreter_semantic))',
                  "scope.set_attr(obj, name, new_member)")


def _install_lazy_tuple_type(core):
    """``tl.tuple.type`` computed on first read for tuples of plain ``int`` and ``constexpr`` values (shapes): the
    tuples built here without one, and those ``tl.tuple``'s constructor builds without a ``type`` argument.  The
    type of such a tuple is a function of its values that cannot fail (an int's ``constexpr_type``, a
    ``constexpr``'s own ``type``, set by its constructor), so computing it later gives the same ``tuple_type``;
    Triton's ``_setitem`` still recomputes it.  Tuples of anything else get their type at once, as before."""
    tuple_cls, tuple_type, constexpr = core.tuple, core.tuple_type, core.constexpr
    if "type" in vars(tuple_cls) or not _source_is(tuple_cls.__init__, _TUPLE_INIT):
        return False
    type_for_values = core._type_for_tuple_values

    def type(self):          # noqa: A001 -- the attribute's name
        return type_for_values(self.values)

    prop = _Lazy(type, "type")

    def __init__(self, args, type=None):        # noqa: A002 -- Triton's parameter name
        self.values = [i for i in args]
        if isinstance(type, tuple_type):
            self.type = type
        elif type is not None:  # make_template in ASTFunction.deserialize may pass us a list/tuple
            self.type = tuple_type(type)
        else:
            for v in self.values:
                if v.__class__ is not int and v.__class__ is not constexpr:
                    self.type = type_for_values(self.values)
                    break
            # else: all ints / constexprs: the _Lazy attribute computes it when read

    tuple_cls.type = prop
    _replace("tuple.__init__", tuple_cls, "__init__", __init__)
    return True


def _install_tensor_init(core):
    import math
    tensor_cls, tuple_cls, constexpr, constexpr_type = core.tensor, core.tuple, core.constexpr, core.constexpr_type
    if not _source_is(tensor_cls.__init__, _TENSOR_INIT) or not _source_is(constexpr.__init__, _CONSTEXPR_INIT) \
            or not _source_is(constexpr_type.__init__, ("self.value = value",)) \
            or "shape" in vars(tensor_cls) or "numel" in vars(tensor_cls):
        return
    new = object.__new__
    prod = math.prod

    # ``shape`` and ``numel`` are functions of ``type`` (which nothing assigns after the constructor): computed
    # when first read, most tensors the interpreter makes are only ever read by type
    def shape(self):
        type = self.type        # noqa: A001
        vals = []
        for s in (type.shape if type.is_block() else ()):
            if s.__class__ is int:
                # constexpr(s) for an int: value s, type constexpr_type(s) (its constructor, inlined)
                c = new(constexpr)
                c.value = s
                c.type = t = new(constexpr_type)
                t.value = s
            else:
                c = constexpr(s)
            vals.append(c)
        t = new(tuple_cls)
        t.values = vals
        return t                # its .type: computed when read (a _Lazy attribute)

    def numel(self):
        type = self.type        # noqa: A001
        return constexpr(prod(type.shape if type.is_block() else ()))

    for name, fn in (("shape", shape), ("numel", numel)):
        _replace(f"tensor.{name}", tensor_cls, name, _Lazy(fn, name))   # (Triton's class has none: ORIGINALS: ABSENT)

    def __init__(self, handle, type):       # noqa: A002 -- Triton's parameter name
        super(tensor_cls, self).__init__()
        self.handle = handle
        self.type = type
        self.dtype = type.scalar

    _replace("tensor.__init__", tensor_cls, "__init__", __init__)


def _install_block_init(core):
    block_cls, tuple_cls = core.block_type, core.tuple
    if not _source_is(block_cls.__init__, _BLOCK_INIT):
        return
    unwrap_shape, validate = core._unwrap_shape, core.validate_block_shape
    new_tuple = object.__new__
    checked: dict = {}      # shape (a builtin tuple of ints) -> (numel, str(shape)), for shapes that passed the check

    # in triton.language.core, ``tuple`` is ``tl.tuple``: a block's shape is a tl.tuple of ints
    def __init__(self, element_ty, shape):
        self.element_ty = element_ty
        assert (isinstance(shape, (list, tuple_cls)))
        key = None
        if shape.__class__ is list:
            vals = shape
        elif shape.__class__ is tuple_cls:
            vals = shape.values
        else:
            vals = ()
        if vals and all(s.__class__ is int for s in vals):
            key = builtins.tuple(vals)           # what _unwrap_shape gives for plain ints: the same ints
            shape = new_tuple(tuple_cls)
            shape.values = list(key)             # its .type: computed when read (a _Lazy attribute)
        else:
            shape = tuple_cls(unwrap_shape(shape))
        self.shape = shape
        if not shape:
            raise TypeError('0d block_type is forbidden')
        hit = checked.get(key) if key is not None else None
        if hit is None:
            hit = (validate(shape), str(shape))
            if key is not None:
                checked[key] = hit
        self.numel = hit[0]
        self.name = f'<{hit[1]}, {element_ty}>'

    _replace("block_type.__init__", block_cls, "__init__", __init__)


def _install_patch_attr(interp):
    orig = getattr(interp, "_patch_attr", None)
    if orig is None:
        return
    if _source_is(orig, _PATCH_ATTR_36):
        TritonSemantic = interp.TritonSemantic

        def _patch_attr(obj, name, member, builder, scope):
            semantic = TritonSemantic(builder)

            def new_member(*args, member=member, **kwargs):
                kwargs.pop("_semantic", None)
                kwargs["_semantic"] = semantic
                return member(*args, **kwargs)
            scope.set_attr(obj, name, new_member)
    elif _source_is(orig, _PATCH_ATTR_39):
        def _patch_attr(obj, name, member, builder, scope):
            def new_member(*args, member=member, **kwargs):
                kwargs.pop("_semantic", None)
                kwargs["_semantic"] = interp.interpreter_semantic     # read at the call, as Triton's does
                return member(*args, **kwargs)
            scope.set_attr(obj, name, new_member)
    else:
        return
    _replace("_patch_attr", interp, "_patch_attr", _patch_attr)


def install():
    """Install the equivalents into Triton's interpreter (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as interp

    orig = getattr(interp, "_get_np_dtype", None)
    if orig is not None and all(hasattr(tl, n) for n in ("dtype", "block_type", "pointer_type")):
        _replace("_get_np_dtype", interp, "_get_np_dtype", _make_np_dtype(orig, tl, np))
    from triton.language import core
    if _install_lazy_tuple_type(core):
        _install_tensor_init(core)
        _install_block_init(core)
    _install_patch_attr(interp)
    semantic_cls = getattr(interp, "TritonSemantic", None)
    if semantic_cls is not None:
        from . import interp_plans
        interp_plans.install(semantic_cls, interp, core)
