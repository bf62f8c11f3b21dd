"""placeholder (filled in below)"""
def enabled():
    return False
def plain_access(kind, ptrs, mask, data):
    return None
def atomic_access(phase, ptrs, mask, sem, scope, where=None):
    return None
