"""vLLM integration: `KVStoreConnector` (vllm_connector.py, imports vllm) over the pure-torch page copies in paged.py."""
