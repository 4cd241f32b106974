"""`kvstore bench serving`'s sizes: the equal-memory pool, LMCache's multi-round QA timing, the workload and model
each mode picks, and the server settings they make (no vLLM needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.serving_model import LLAMA_1B, SMALL, write_model
from bench.serving_runs import Setup, serve_spec
from bench.serving_sizes import BLOCK, CHUNK, SESSIONS, model_for, pools, workload_for
from bench.serving_workload import Workload, make_sessions, qa_times
from kvstore.errors import ConfigError
from kvstore.layout import KVLayout
from service.process import write_config


@pytest.mark.parametrize(("quick", "name"), list(SESSIONS), ids=[f"{n}-{'quick' if q else 'full'}" for q, n in SESSIONS])
def test_the_equal_memory_pool_adds_exactly_the_host_tiers_bytes(tmp_path: Path, quick: bool, name: str) -> None:
    """vllm_same_memory's pool is vLLM's own plus the bytes the daemon's config gives its host tier."""
    model, workload = model_for(quick), workload_for(quick, name)
    sizes = pools(workload, extra_tokens=1000)
    layout = KVLayout(num_layers=model.num_hidden_layers, num_kv_heads=model.num_key_value_heads,
                      head_dim=model.head_dim, dtype=model.dtype, chunk_tokens=CHUNK)
    config = write_config(tmp_path, layout=layout, host_chunks=sizes.host_chunks).read_text()
    host_bytes = int(config.split('kind = "host"\ncapacity = \'')[1].split('B')[0])
    added_bytes = (sizes.same_memory_blocks - sizes.num_blocks) * BLOCK * model.kv_bytes_per_token
    assert added_bytes == host_bytes
    assert sizes.host_chunks * CHUNK >= workload.total_kv_tokens + 1000, "the host tier holds every session"
    assert sizes.same_memory_blocks * BLOCK >= workload.total_kv_tokens, "so vLLM's equal-memory pool does too"


def test_the_equal_memory_server_gets_that_pool_in_the_models_dtype(tmp_path: Path) -> None:
    workload = workload_for(False, "mooncake")
    setup = Setup(write_model(tmp_path / "model", LLAMA_1B), LLAMA_1B, workload, pools(workload), None)
    spec = serve_spec(setup, None, num_blocks=setup.pools.same_memory_blocks)
    cmd = spec.command_line(8000)
    assert cmd[cmd.index("--num-gpu-blocks-override") + 1] == str(setup.pools.same_memory_blocks)
    assert int(cmd[cmd.index("--kv-cache-memory-bytes") + 1]) >= setup.pools.same_memory_blocks * BLOCK * 32768
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert cmd[cmd.index("--max-model-len") + 1] == str(setup.pools.max_model_len), "the same requests as the small pool"
    assert "--kv-transfer-config" not in cmd
    assert serve_spec(setup, None, omp_threads=1).environment()["OMP_NUM_THREADS"] == "1", "replicas share 2 cores"


def test_qa_users_send_at_the_asked_rate_each_round_after_the_last() -> None:
    times = qa_times(num_users=4, num_rounds=3, qps=2.0)
    assert [user[0] for user in times] == [0.0, 0.5, 1.0, 1.5], "users join 1/qps apart"
    assert all(user[1] - user[0] == user[2] - user[1] == 2.0 for user in times), "each every num_users/qps"
    sends = sorted(t for user in times for t in user)
    assert all(b - a == pytest.approx(0.5) for a, b in zip(sends, sends[1:], strict=False)), "together: qps"


def test_qa_sessions_share_the_system_prompt_and_have_histories_of_their_own() -> None:
    workload = workload_for(True, "qa")
    sessions = make_sessions(workload)
    assert len(sessions) == workload.num_sessions and workload.qps is not None
    assert len({tuple(s.context[:workload.system_tokens]) for s in sessions}) == 1
    assert len({tuple(s.context[workload.system_tokens:]) for s in sessions}) == len(sessions)
    assert [s.arrivals_s for s in sessions] == qa_times(workload.num_sessions, workload.num_turns, workload.qps)


def test_bad_workload_settings_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="use one of mooncake, qa"):
        workload_for(False, "long-doc")
    with pytest.raises(ConfigError, match="qps must be positive"):
        Workload(num_sessions=2, num_turns=2, system_tokens=8, context_tokens=8, message_tokens=8, answer_tokens=8,
                 qps=0.0)


def test_the_full_runs_model_spends_a_real_models_compute_per_kv_byte(tmp_path: Path) -> None:
    assert model_for(True) is SMALL and model_for(False) is LLAMA_1B
    assert LLAMA_1B.kv_bytes_per_token == 32 * 1024, "Llama-3.2-1B: 16 layers x 8 KV heads x 64 x 2 x bf16"
    assert LLAMA_1B.prefill_flops_per_kv_byte >= 10 * SMALL.prefill_flops_per_kv_byte
    config = json.loads((write_model(tmp_path / "m", LLAMA_1B) / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"], config["torch_dtype"]) == (2048, 16, 32, 8, 64, "bfloat16")
