"""The engine-facing API (KVConnector over a TieredStore) and a small paged continuous-batching engine."""
