"""Reinf: a local-first assistant that learns from your 1-5 ratings."""
import os

# OpenMP's default "active" wait makes torch's threads spin against each other on a busy
# machine: a demo-model decode step took 290 ms spinning and 3.5 ms passive (2 shared
# cores). Set before anything imports torch; a person's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
