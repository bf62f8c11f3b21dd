# Sourced from the repository root by the GPU scripts: makes `ditron` AND `ditron.kernels` resolve to THIS tree.
# `ditron.kernels` maps to kernels/ through the editable install's finder, so PYTHONPATH alone is not enough: an
# editable install of another checkout left on the machine would answer `import ditron.kernels` with that tree's
# kernels (it happened on a lent GPU machine on 2026-12-07).  Installs this tree (editable, no deps) otherwise.
if ! python3 - <<'PY' 2>/dev/null
import os, sys
import ditron, ditron.kernels
here = os.path.realpath(os.getcwd()) + os.sep
sys.exit(0 if all(os.path.realpath(m.__file__).startswith(here) for m in (ditron, ditron.kernels)) else 1)
PY
then
  echo "== installing ditron from $PWD (pip install -e .)"
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || { echo "== cannot install ditron from $PWD"; exit 1; }
fi
