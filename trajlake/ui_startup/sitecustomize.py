"""Run at start-up by the Python processes ``trajlake ui`` starts (this directory is first on their PYTHONPATH).

It installs the Host-header guard of ``trajlake.ui_env`` and quiets Dagster's supersession warning (see
there); a start-up hook must never stop Python from starting, hence the broad except.
"""

try:
    from trajlake.ui_env import install, quiet_warnings

    quiet_warnings()
    install()
except Exception:
    pass
