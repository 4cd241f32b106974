"""Simulation: trace readers, workload generators and policy replay (no bytes moved)."""
