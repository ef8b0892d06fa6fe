"""Run at start-up by the Python processes ``trajlake ui`` starts (this directory is first on their PYTHONPATH).

It installs the Host-header guard of ``trajlake.ui_env`` and quiets Dagster's supersession warning (see
there), then runs the environment's own ``sitecustomize`` if there is one further down the path (this
one shadows it). A start-up hook must never stop Python from starting, hence the broad excepts.
"""

import importlib.machinery
import importlib.util
import os
import sys

try:
    from trajlake.ui_env import install, quiet_warnings

    quiet_warnings()
    install()
except Exception:
    pass

try:
    _here = os.path.dirname(os.path.abspath(__file__))
    _rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
except Exception:
    pass
