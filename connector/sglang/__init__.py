"""SGLang integration: a HiCache storage backend (hicache.py, imports sglang) that keeps SGLang's pages in kvstore."""
