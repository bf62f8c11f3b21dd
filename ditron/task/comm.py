"""Communication tasks (filled in below)."""
