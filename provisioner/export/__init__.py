"""Files for the tools around the cluster, written from the spec (Slurm's topology.conf and gres.conf)."""
