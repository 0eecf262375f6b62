"""Safety evidence for tenure's leases: histories, checkers, workloads, faults, controls.

Not part of the installed library: run from the repository root with
``python -m safety ...`` (see ``SAFETY.md``).
"""
