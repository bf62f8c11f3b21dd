"""The interpreter's semantic decisions taken from types alone, remembered and replayed (installed by
:func:`ditron.sim.interp_fast.install`, with the same results as Triton's own functions):

* ``TritonSemantic.binary_op_type_checking_impl`` (the implicit casts and broadcasts of every binary operation:
  ``+``, ``<``, ``&``, pointer arithmetic, ...; ~30 us a call, the most expensive bookkeeping of a decoder test)
  decides from the two tensors' *types* alone what it does to their values: which side it casts to which scalar
  type, which side it splats, expands and broadcasts to which block type.  Here the decision is taken once per
  pair of types (and flags) by Triton's own function, whose result on that first call is what the caller gets,
  and later calls with the same types replay it: the same ``cast`` calls, then the same builder operations
  (``create_splat`` / ``create_expand_dims`` / ``create_broadcast``) with the result types of that first call.
  A decision is remembered only when the replayed types equal the first call's results and a tensor left alone
  is returned as it was given.  A call that raised, a builder other than the interpreter's, and types it cannot
  name exactly (:func:`_type_key`) go to Triton's function every time.
  A Python number operand (``x + 1.0``, ``i < N``: about half of a decoder test's calls, and three times the cost
  of two tensors, since Triton makes a constant of it, casts and splats it at every call) is remembered with its
  value: per tensor type, number (its class: ``True``, ``1`` and ``1.0`` are told apart; the sign of a zero) and
  flags, the first call's result for the number (Triton's) is kept, its array copied and made read-only, and
  later calls get a tensor of that array (a fresh handle) and the tensor side cast as on the first call.  A NaN
  (never equal to itself) and numbers past the first ``_CONSTS_MAX`` go to Triton's function.
* ``TritonSemantic.broadcast_impl_value`` on its own (loads' and stores' mask, ``other`` and value, ``where``,
  and the binary operations' first calls): the same decision per pair of types, replayed with the same builder
  operations (usually none: a pointer block and its mask have one shape), checked against the first call's result
  as above.
* ``TritonSemantic.expand_dims`` of a block (``x[:, None]``): the new shape from the block type's own ints, which
  is what Triton's unwrapping of the tensor's ``constexpr`` shape gives back (3.9's check of the axis kept).
* ``TritonSemantic.cast``: for most pairs of types one builder call on the input's handle (``create_fp_trunc``,
  ``create_int_cast``, ...), noted on the deciding call (Triton's function) and replayed (see
  :func:`_install_cast_plans`): fp32 -> int32 of a 16 x 64 block 14.3 -> 6.1 us.
* ``TritonSemantic.to_tensor`` of a Python number (a load's ``other``, ``where``'s scalars, a store's value):
  the first call's scalar tensor kept per number (class, value, the sign of a zero), its array read-only, as the
  binary operations' numbers are (see :func:`_install_number_tensors`): a masked load with ``other=0.0`` ~87 ->
  ~69 us.

Each is installed only when Triton's own function has exactly the source it replaces (3.6 and 3.9 as released).
"""
from __future__ import annotations

import builtins
from math import copysign

from .interp_patch import _replace, _source_is

#: ``TritonSemantic.binary_op_type_checking_impl`` / ``broadcast_impl_value`` of Triton 3.6.0 and 3.9.0 (digests of
#: their bodies, see :func:`_source_is`)
_BINARY_36 = "1e4b94f202c5b152b3b53ec1076b239d729de61534d27244bfce8cda3640d78d"
_BINARY_39 = "93f1b75a744a74ca6213e0e84739d2990a5f178fe57fee0eedeca84fbe1f0a2d"
_BCAST_36 = "6697f8a4e05979698e4b5212f1531aebe1dc057c2dacecc8c34e7b5cf8b7c578"
_BCAST_39 = "fbab69cc302ecb780ce6a81c804e39f3a69161f57892f8f8c20596099ebae657"
#: ``TritonSemantic.cast`` of 3.6.0 and 3.9.0, and the builder calls a cast may make (one of them, for most pairs)
_CAST_36 = "3f5c25c879f078ba78c46d504ca34fbe735712d8d65f99d026d40b3b0489bf1b"
_CAST_39 = "b6cf927de453d62296cda392345fa0774a1f84bd2aedeed9c1702132053465af"
_CAST_CALLS = ("create_fp_trunc", "create_fp_ext", "create_int_cast", "create_fp_to_si", "create_fp_to_ui",
               "create_si_to_fp", "create_ui_to_fp", "create_fp_to_fp")
#: ``TritonSemantic.to_tensor`` of 3.6.0 and 3.9.0
_TO_TENSOR_36 = "60a0fd5848da9965ae591e47d062fb310e416518918847d98c3782b50a1b0f22"
_TO_TENSOR_39 = "63f5f065e3959545bb5ad4afbdd88bf1593ab5137c50d9a9c92bedd5991ec356"
#: ``TritonSemantic.expand_dims``: 3.6.0 (no check of the axis), 3.9.0 (``invalid axis`` outside [0, rank])
_EXPAND_36 = "06ec0b6252cb9633aa5421d3ba83fc18ca8d94e14a9b68ea95e7dc63b89cd56e"
_EXPAND_39 = "0eaf497c39960ab9948456e98140b36495af6f538f24e6663b12d9b34bb6837f"


def _type_key(t, dtype_cls, pointer_cls, block_cls):
    """A hashable key equal for two Triton types exactly when they are equal (``None``: a type not keyed here).
    ``pointer_type`` and ``block_type`` define ``__eq__`` without ``__hash__``; a dtype's name is its identity.
    A pointer's or block's key is kept on it (``_ditron_key``: neither changes once made, and the tensors of a
    replayed decision share their type object)."""
    c = t.__class__
    if c is dtype_cls:
        return t.name
    if c is block_cls or c is pointer_cls:
        d = t.__dict__
        k = d.get("_ditron_key", _NOKEY)
        if k is _NOKEY:
            e = _type_key(t.element_ty, dtype_cls, pointer_cls, block_cls)
            if e is None:
                k = None
            elif c is pointer_cls:
                k = ("p", e, t.address_space, t.is_const())
            else:
                k = ("b", e, builtins.tuple(int(n) for n in t.shape))
            d["_ditron_key"] = k
        return k
    return None


_NOKEY = object()
_NO = object()              # a decision that is not remembered (Triton's function decides every time)


def _broadcast_steps(lt, rt, block_cls):
    """The block types ``broadcast_impl_value`` gives ``lhs`` and ``rhs`` of types ``lt`` / ``rt`` (already cast),
    as steps per side: ``("splat", ty)``, ``("expand", ty)`` (a leading axis), ``("broadcast", shape, ty)``.
    Raises where Triton's function raises (the caller then does not remember the decision)."""
    ls, rs = [], []
    lb, rb = lt.__class__ is block_cls, rt.__class__ is block_cls
    if lb and not rb:
        rt = lt.with_element_ty(rt.scalar)
        rs.append(("splat", rt))
    elif rb and not lb:
        lt = rt.with_element_ty(lt.scalar)
        ls.append(("splat", lt))
    elif lb and rb:
        lshape, rshape = [int(d) for d in lt.shape], [int(d) for d in rt.shape]
        while len(lshape) < len(rshape):
            lshape = [1] + lshape
            lt = block_cls(lt.scalar, lshape)
            ls.append(("expand", lt))
        while len(rshape) < len(lshape):
            rshape = [1] + rshape
            rt = block_cls(rt.scalar, rshape)
            rs.append(("expand", rt))
        ret = []
        for left, right in zip(lshape, rshape):
            if left == 1:
                ret.append(right)
            elif right == 1 or right == left:
                ret.append(left)
            else:
                raise ValueError("incompatible dimensions")
        if lshape != ret:
            lt = block_cls(lt.scalar, ret)
            ls.append(("broadcast", ret, lt))
        if rshape != ret:
            rt = block_cls(rt.scalar, ret)
            rs.append(("broadcast", ret, rt))
    return ls, rs, lt, rt


#: the Python numbers whose tensors are remembered (exactly these classes: ``True == 1 == 1.0`` are told apart by
#: class, ``0.0`` and ``-0.0`` by sign; a NaN, never equal to itself, is not remembered), and how many at most
_NUMBERS = (int, float, bool)
_CONSTS_MAX = 4096


def _number_key(n):
    """The key of a Python number whose tensor is remembered (class, value, the sign of a zero), or None."""
    c = n.__class__
    if c is float:
        return None if n != n else (c, n, copysign(1.0, n))
    return (c, n, 0) if c is int or c is bool else None


def _frozen(t, tensor_cls, handle_cls):
    """A remembered number's tensor ``t`` as (type, its array copied and read-only, handle dtype), or None where
    it is not a plain interpreter tensor."""
    if t.__class__ is not tensor_cls or t.handle.__class__ is not handle_cls or t.handle.attr:
        return None
    data = t.handle.data.copy()
    data.flags.writeable = False
    return t.type, data, t.handle.dtype


def _thawed(self, frozen, handle_cls):
    """A tensor of a remembered number: a fresh handle (the fields Triton's constructor sets, validated when the
    first one was made) around the shared read-only array."""
    ty, data, hdt = frozen
    h = object.__new__(handle_cls)
    h.data, h.dtype, h.attr = data, hdt, {}
    return self.tensor(h, ty)


def _install_binary_plans(semantic_cls, interp, core):
    """The binary-operation decisions remembered per pair of types (see the module's docstring)."""
    orig = semantic_cls.binary_op_type_checking_impl
    bcast = semantic_cls.broadcast_impl_value
    if not (_source_is(orig, _BINARY_36, _BINARY_39) and _source_is(bcast, _BCAST_36, _BCAST_39)):
        return
    import dataclasses
    if [f.name for f in dataclasses.fields(interp.TensorHandle)] != ["data", "dtype", "attr"]:
        return                  # a remembered number's handle is made field by field (below)
    tensor_cls, dtype_cls, pointer_cls, block_cls = core.tensor, core.dtype, core.pointer_type, core.block_type
    builder_cls, handle_cls = interp.InterpreterBuilder, interp.TensorHandle
    plans: dict = {}
    consts: dict = {}       # (tensor type, number, flags) -> the tensor side's cast and the number's tensor

    def cast_of(x, o):
        # the scalar type Triton's function cast ``x`` to (None: none), and ``x``'s type after that cast
        t = x.type
        if o.type.scalar == t.scalar:
            return None, t
        c = o.type.scalar
        return c, (t.with_element_ty(c) if t.__class__ is block_cls else c)

    def plan_for(lhs, rhs, out):
        # what Triton's function did (its result ``out``) as replayable steps, or _NO
        (lcast, lt), (rcast, rt) = cast_of(lhs, out[0]), cast_of(rhs, out[1])
        try:
            ls, rs, flt, frt = _broadcast_steps(lt, rt, block_cls)
        except Exception:  # noqa: BLE001 -- Triton's function did not raise: not a decision taken here
            return _NO
        if flt != out[0].type or frt != out[1].type or (not ls and lcast is None and out[0] is not lhs) \
                or (not rs and rcast is None and out[1] is not rhs):
            return _NO
        return (lcast, builtins.tuple(ls), rcast, builtins.tuple(rs))

    def replay(self, x, cast, steps):
        if cast is not None:
            x = self.cast(x, cast)
        b = self.builder
        for step in steps:
            kind = step[0]
            if kind == "splat":
                x = self.tensor(b.create_splat(step[1], x.handle), step[1])
            elif kind == "expand":
                x = self.tensor(b.create_expand_dims(x.handle, 0), step[1])
            else:
                x = self.tensor(b.create_broadcast(x.handle, step[1]), step[2])
        return x

    def const_for(t, out, t_is_lhs):
        # the tensor side's cast and the number side of Triton's result, frozen to hand out again; or _NO where the
        # tensor side was not only cast (never seen: it is the number that Triton splats to the tensor's shape)
        tout, nout = (out[0], out[1]) if t_is_lhs else (out[1], out[0])
        cast, tt = cast_of(t, tout)
        frozen = _frozen(nout, tensor_cls, handle_cls)
        if tout.type != tt or (cast is None and tout is not t) or frozen is None:
            return _NO
        return cast, frozen

    def number_side(self, lhs, rhs, flags, t_is_lhs):
        # ``tensor OP number`` / ``number OP tensor``: remembered per tensor type, number (class, value, sign of a
        # zero) and flags; the number's tensor is the same every time (Triton's ``to_tensor`` /
        # ``scalar_constant``, cast and splat depend on nothing else)
        t, n = (lhs, rhs) if t_is_lhs else (rhs, lhs)
        tk, nk = _type_key(t.type, dtype_cls, pointer_cls, block_cls), _number_key(n)
        if tk is None or nk is None:
            return orig(self, lhs, rhs, *flags)
        key = (tk, nk, t_is_lhs) + flags
        ent = consts.get(key)
        if ent is None:
            out = orig(self, lhs, rhs, *flags)
            if len(consts) < _CONSTS_MAX:
                consts[key] = const_for(t, out, t_is_lhs)
            return out
        if ent is _NO:
            return orig(self, lhs, rhs, *flags)
        cast, frozen = ent
        if cast is not None:
            t = self.cast(t, cast)
        c = _thawed(self, frozen, handle_cls)
        return (t, c) if t_is_lhs else (c, t)

    def binary_op_type_checking_impl(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False, arithmetic_check=True,
                                     div_or_mod=False):
        lc, rc = lhs.__class__, rhs.__class__
        if lc is not tensor_cls or rc is not tensor_cls or self.builder.__class__ is not builder_cls:
            if self.builder.__class__ is builder_cls and ((lc is tensor_cls and rc in _NUMBERS)
                                                          or (rc is tensor_cls and lc in _NUMBERS)):
                return number_side(self, lhs, rhs, (bool(allow_lhs_ptr), bool(allow_rhs_ptr),
                                                    bool(arithmetic_check), bool(div_or_mod)), lc is tensor_cls)
            return orig(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)
        lk = _type_key(lhs.type, dtype_cls, pointer_cls, block_cls)
        rk = _type_key(rhs.type, dtype_cls, pointer_cls, block_cls)
        key = (lk, rk, bool(allow_lhs_ptr), bool(allow_rhs_ptr), bool(arithmetic_check), bool(div_or_mod))
        plan = plans.get(key) if lk is not None and rk is not None else _NO
        if plan is None:
            out = orig(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)
            plans[key] = plan_for(lhs, rhs, out)
            return out
        if plan is _NO:
            return orig(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)
        lcast, ls, rcast, rs = plan
        if lcast is None and not ls and rcast is None and not rs:
            return lhs, rhs
        return replay(self, lhs, lcast, ls), replay(self, rhs, rcast, rs)

    binary_op_type_checking_impl.plans = plans
    binary_op_type_checking_impl.consts = consts
    _replace("TritonSemantic.binary_op_type_checking_impl", semantic_cls, "binary_op_type_checking_impl",
             binary_op_type_checking_impl)

    bplans: dict = {}

    def broadcast_impl_value(self, lhs, rhs):
        if lhs.__class__ is not tensor_cls or rhs.__class__ is not tensor_cls \
                or self.builder.__class__ is not builder_cls:
            return bcast(self, lhs, rhs)
        lk = _type_key(lhs.type, dtype_cls, pointer_cls, block_cls)
        rk = _type_key(rhs.type, dtype_cls, pointer_cls, block_cls)
        key = (lk, rk)
        plan = bplans.get(key) if lk is not None and rk is not None else _NO
        if plan is None:
            out = bcast(self, lhs, rhs)
            bplans[key] = plan_for(lhs, rhs, out)      # (no casts: a broadcast keeps the scalar types)
            return out
        if plan is _NO:
            return bcast(self, lhs, rhs)
        lcast, ls, rcast, rs = plan
        if not ls and not rs:
            return lhs, rhs
        return replay(self, lhs, lcast, ls), replay(self, rhs, rcast, rs)

    broadcast_impl_value.plans = bplans
    _replace("TritonSemantic.broadcast_impl_value", semantic_cls, "broadcast_impl_value", broadcast_impl_value)
    _install_expand_dims(semantic_cls, builder_cls, tensor_cls, block_cls)
    _install_number_tensors(semantic_cls, builder_cls, tensor_cls, handle_cls)
    _install_cast_plans(semantic_cls, builder_cls, tensor_cls, lambda t: _type_key(t, dtype_cls, pointer_cls,
                                                                                  block_cls))


def _install_number_tensors(semantic_cls, builder_cls, tensor_cls, handle_cls):
    """``to_tensor`` of a Python number (``tl.load(..., other=0.0)``, ``tl.where(m, x, 0.0)``, a store's or an
    atomic's value): its scalar tensor depends on the number alone (its class, value, the sign of a zero), so the
    first call's (Triton's) is kept, its array copied and read-only, and later calls get a tensor of that array (a
    fresh handle).  A NaN, other objects, other builders and numbers past ``_CONSTS_MAX`` go to Triton's."""
    orig = semantic_cls.to_tensor
    if not _source_is(orig, _TO_TENSOR_36, _TO_TENSOR_39):
        return
    made: dict = {}

    def to_tensor(self, x, check_type=True):
        key = _number_key(x)
        if key is None or self.builder.__class__ is not builder_cls:
            return orig(self, x, check_type)
        frozen = made.get(key)
        if frozen is None:
            out = orig(self, x, check_type)
            if len(made) < _CONSTS_MAX:
                frozen = _frozen(out, tensor_cls, handle_cls)
                if frozen is not None:
                    made[key] = frozen
            return out
        return _thawed(self, frozen, handle_cls)

    to_tensor.made = made
    _replace("TritonSemantic.to_tensor", semantic_cls, "to_tensor", to_tensor)


def _install_cast_plans(semantic_cls, builder_cls, tensor_cls, key_of):
    """``TritonSemantic.cast`` (``x.to(...)``, ``tl.cast``, the implicit casts of loads, stores and arithmetic)
    decides from the two types alone; for most pairs it makes one builder call (``create_fp_trunc``,
    ``create_int_cast``, ...) on the input's handle.  The deciding call runs Triton's function and notes the
    builder calls it makes (wrappers around those methods, installed at the first cast: after the simulator's own
    replacements of them); a decision of exactly one such call, on the input's handle, whose result is the
    returned tensor's handle, is replayed (the same method, the same other arguments, the returned type).
    Anything else (no cast, two casts through fp32, a comparison with zero for bool, errors) goes to Triton's
    function every time."""
    import threading
    orig = semantic_cls.cast
    if not _source_is(orig, _CAST_36, _CAST_39) or not all(hasattr(builder_cls, n) for n in _CAST_CALLS):
        return
    rec = threading.local()
    plans: dict = {}
    wrapped: list = []

    def wrap_builder():
        for name in _CAST_CALLS:
            f = getattr(builder_cls, name)

            def noted(self, *args, _f=f, _name=name):
                out = _f(self, *args)
                log = rec.__dict__.get("log")
                if log is not None:
                    log.append((_name, args, out))
                return out
            setattr(builder_cls, name, noted)
        wrapped.append(True)

    def cast(self, input, dst_ty, fp_downcast_rounding=None):
        if input.__class__ is not tensor_cls or self.builder.__class__ is not builder_cls:
            return orig(self, input, dst_ty, fp_downcast_rounding)
        sk, dk = key_of(input.type), key_of(dst_ty)
        key = (sk, dk, fp_downcast_rounding)
        plan = plans.get(key) if sk is not None and dk is not None and fp_downcast_rounding.__class__ in \
            (str, type(None)) else _NO
        if plan is None:
            if not wrapped:
                wrap_builder()
            outer, rec.log = rec.__dict__.get("log"), []
            try:
                out = orig(self, input, dst_ty, fp_downcast_rounding)
                log = rec.log
            finally:
                rec.log = outer
            if outer is not None:
                outer.extend(log)           # a cast inside a cast being decided: the outer one sees it too
            plan = _NO
            if len(log) == 1 and out.__class__ is tensor_cls and log[0][2] is out.handle \
                    and log[0][1] and log[0][1][0] is input.handle \
                    and not any(a.__class__ is input.handle.__class__ for a in log[0][1][1:]):
                plan = (log[0][0], log[0][1][1:], out.type)
            elif out is input:
                plan = ()
            plans[key] = plan
            return out
        if plan is _NO:
            return orig(self, input, dst_ty, fp_downcast_rounding)
        if not plan:
            return input
        name, args, ty = plan
        return self.tensor(getattr(self.builder, name)(input.handle, *args), ty)

    cast.plans = plans
    _replace("TritonSemantic.cast", semantic_cls, "cast", cast)


def _install_expand_dims(semantic_cls, builder_cls, tensor_cls, block_cls):
    """``x[:, None]`` and ``tl.expand_dims`` of a block: the new shape from the block type's own ints (what
    unwrapping the tensor's ``constexpr`` shape gives back), instead of building that shape first."""
    orig = semantic_cls.expand_dims
    if _source_is(orig, _EXPAND_39):
        check_axis = True
    elif _source_is(orig, _EXPAND_36):
        check_axis = False
    else:
        return

    def expand_dims(self, input, axis):
        t = input.type
        if input.__class__ is not tensor_cls or t.__class__ is not block_cls or axis.__class__ is not int \
                or self.builder.__class__ is not builder_cls:
            return orig(self, input, axis)
        dst_shape = list(t.shape.values)         # (a block type's shape: a tl.tuple of ints)
        if check_axis and (axis < 0 or axis > len(dst_shape)):
            raise ValueError(f"invalid axis {axis}")
        dst_shape.insert(axis, 1)
        return self.tensor(self.builder.create_expand_dims(input.handle, axis), block_cls(t.scalar, dst_shape))

    _replace("TritonSemantic.expand_dims", semantic_cls, "expand_dims", expand_dims)


def install(semantic_cls, interp, core):
    """Install the replays into ``semantic_cls`` (Triton's ``TritonSemantic``)."""
    _install_binary_plans(semantic_cls, interp, core)
