"""LMCache integration: a remote storage plugin (plugin.py, imports lmcache) that keeps LMCache's chunks in kvstore."""
