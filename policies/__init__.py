"""Policies decide, tiers act: eviction, admission, compression (the engine's request order lives in connector/engine/scheduling)."""
