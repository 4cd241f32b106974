"""Capacity planning (`kvstore plan`): size each tier for a model, a workload and a fleet."""
