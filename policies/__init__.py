"""Policies decide, tiers act: eviction, admission, compression, replication, scheduling."""
