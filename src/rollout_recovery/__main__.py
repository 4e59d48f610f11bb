"""``python -m rollout_recovery`` runs the command line."""

from .cli import main

main()
