"""Fabric logic: expected state from the spec, checks and findings, pairwise scheduling."""
