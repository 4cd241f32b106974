"""Run vLLM's own `LLM` on CPU in this process, driven by a JSON spec (for bench/vllm.py and tests/integration).

    python -m bench.vllm_engine SPEC.json OUT.json

SPEC: {"model_dir", "block_size", "max_tokens", "dtype" (default "float32"), "custom_ops" (vLLM's, optional),
       "connector": {extra config} | null,
       "steps": [{"generate": [PROMPT, ...], "flush": true, "max_tokens": N} | {"wait_for": "PATH", "ready": "PATH"}
                 | {"sleep": SECONDS} | {"generate_until_cached": PROMPT, "timeout_s": 120}]}
       PROMPT: [token ids] or {"prompt_token_ids": [...], "cache_salt": "..."} (vLLM's TokensPrompt)
       "flush" (default true): wait for the connector's saves after the step (false with a frozen daemon);
       "max_tokens": this step's own (1: its ttft_s is the time to the first token)
       "generate_until_cached": PROMPT again (its saves flushed after each try) until vLLM reports cached
       tokens or timeout_s passed; its results are the tries, the last one cached unless time ran out
       "disable_hybrid_kv_cache_manager": true converts sliding-window layers to full attention (vLLM's flag)
OUT:  {"results": [[{"token_ids", "num_cached_tokens", "ttft_s"}, ...] per generate step], "errors": [...]}
A subprocess per engine keeps vLLM's process-global state (its distributed env) out of pytest.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# vLLM's settings for one in-process engine on CPU; in the environment before vLLM is imported (main sets any
# not given; tests/integration's engine fork server imports vLLM under them).
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def make_llm(spec: dict[str, Any]) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    transfer = None
    if spec.get("connector") is not None:
        transfer = KVTransferConfig(kv_connector="KVStoreConnector", kv_connector_module_path="connector.vllm.vllm_connector",
                                    kv_role="kv_both", kv_load_failure_policy="recompute",
                                    kv_connector_extra_config=spec["connector"])
    if spec.get("offload") is not None:  # vLLM's own offloading connector, for the bench's comparison
        transfer = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                    kv_connector_extra_config=spec["offload"])
    events = None
    if spec.get("kv_events") is not None:  # vLLM's KV event publisher (the connector's events ride on it)
        from vllm.config import KVEventsConfig

        events = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", **spec["kv_events"])
    return LLM(model=spec["model_dir"], load_format=spec.get("load_format", "dummy"), skip_tokenizer_init=True,
               dtype=spec.get("dtype", "float32"), block_size=spec["block_size"],
               max_model_len=spec.get("max_model_len", 4096), enforce_eager=True,
               enable_prefix_caching=spec.get("prefix_caching", False), kv_transfer_config=transfer,
               kv_events_config=events, seed=0,
               disable_hybrid_kv_cache_manager=spec.get("disable_hybrid_kv_cache_manager"),
               **({"compilation_config": {"custom_ops": spec["custom_ops"]}} if "custom_ops" in spec else {}))


def generate(llm: Any, prompts: list[Any], max_tokens: int) -> list[dict[str, Any]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False)
    results = []
    for prompt in prompts:  # one at a time: each TTFT is its own prefill
        start = time.perf_counter()
        tokens_prompt = prompt if isinstance(prompt, dict) else {"prompt_token_ids": prompt}
        (out,) = llm.generate([tokens_prompt], params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        results.append({"token_ids": list(out.outputs[0].token_ids), "num_cached_tokens": out.num_cached_tokens,
                        "ttft_s": elapsed})
    return results


def flush_saves() -> None:
    """Wait for the kvstore connector's background saves (the engine runs in this process)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    from connector.vllm.vllm_connector import KVStoreConnector

    if has_kv_transfer_group():
        connector = get_kv_transfer_group()
        if isinstance(connector, KVStoreConnector):
            connector.flush()


def generate_until_cached(llm: Any, prompt: Any, max_tokens: int, timeout_s: float) -> list[dict[str, Any]]:
    """`prompt` until it has cached tokens (e.g. the store answers again after an outage) or timeout_s passed."""
    deadline = time.monotonic() + timeout_s
    tries = generate(llm, [prompt], max_tokens)
    while tries[-1]["num_cached_tokens"] == 0 and time.monotonic() < deadline:
        flush_saves()
        time.sleep(0.2)
        tries += generate(llm, [prompt], max_tokens)
    return tries


def main(spec_path: str, out_path: str) -> None:
    for name, value in ENGINE_ENV.items():
        os.environ.setdefault(name, value)
    spec = json.loads(Path(spec_path).read_text())
    llm = make_llm(spec)
    report: dict[str, Any] = {"results": []}
    for step in spec["steps"]:
        if "generate" in step:
            report["results"].append(generate(llm, step["generate"], step.get("max_tokens", spec["max_tokens"])))
            if step.get("flush", True):
                flush_saves()
        elif "generate_until_cached" in step:
            report["results"].append(generate_until_cached(llm, step["generate_until_cached"], spec["max_tokens"],
                                                           float(step.get("timeout_s", 120))))
        elif "sleep" in step:
            time.sleep(float(step["sleep"]))
        else:
            Path(step["ready"]).touch()
            deadline = time.monotonic() + 300
            while not Path(step["wait_for"]).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    Path(out_path).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
