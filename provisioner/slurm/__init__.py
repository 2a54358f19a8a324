"""Slurm: partition membership (spec and swaps), and the controller's commands (drain, resume, partitions)."""
