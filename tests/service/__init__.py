"""Tests of the sidecar daemon (service/) and its client (connector/client.py and its data paths)."""
