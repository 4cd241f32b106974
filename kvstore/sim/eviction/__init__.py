"""Replay-only eviction policies (`pace`, Belady's `min`): `kvstore replay` runs them, a tier never does."""

from kvstore.sim.eviction.registry import is_offline, make_replay_policy, replay_only_names, replay_policy_names

__all__ = ["is_offline", "make_replay_policy", "replay_only_names", "replay_policy_names"]
