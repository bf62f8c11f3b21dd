"""ditron's distributed IR: op specs, ops, modules, verifier, text form."""
from .ops import OPS, Module, Op, OpSpec, spec_table, type_text, verify
from .recorder import active, record, recording

__all__ = ["OPS", "Module", "Op", "OpSpec", "spec_table", "type_text", "verify", "active", "record", "recording"]
