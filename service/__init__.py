"""The kvstore sidecar daemon: FastAPI control plane, shared-memory data plane, auth, tenants, metrics."""
