"""Tests of the storage tiers: the Tier contract over every kind, and each tier's own behaviour."""
