"""The parts of `kvstore bench serving` and the `vllm serve` harness that run without vLLM: the trace's
conversations, the sessions built from them, the pool sizing, the server's command line, metrics parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bench_serve import PrefixRepetition
from bench.serving_client import RunResult, percentile
from bench.serving_model import write_model
from bench.serving_sizes import BLOCK, POOL_SHARE, SESSIONS, pool_blocks
from bench.serving_workload import Workload, conversation_times, make_sessions
from bench.vllm_server import CONNECTOR_CLASS, CONNECTOR_MODULE, Completion, ServeSpec, parse_metrics
from kvstore.errors import ConfigError


def test_conversations_from_the_trace_have_their_turns_in_time_order() -> None:
    sessions = conversation_times("mooncake-sample", 12, 3)
    assert len(sessions) == 12
    for times in sessions:
        assert len(times) == 3
        assert times == sorted(times) and times[0] < times[-1], "later turns arrive later"


def test_asking_for_more_conversations_than_the_trace_holds_names_the_count() -> None:
    with pytest.raises(ConfigError, match=r"has \d+ conversations of 3\+ turns, 5000 asked; ask for fewer"):
        conversation_times("mooncake-sample", 5000, 3)


@pytest.mark.parametrize("workload", list(SESSIONS.values()), ids=[f"{w}-{'quick' if q else 'full'}" for q, w in SESSIONS])
def test_sessions_share_the_system_prompt_and_outgrow_vllms_pool(workload: Workload) -> None:
    sessions = make_sessions(workload)
    system = sessions[0].context[:workload.system_tokens]
    assert all(s.context[:workload.system_tokens] == system for s in sessions)
    assert len({tuple(s.context) for s in sessions}) == len(sessions), "each context its own"
    assert all(len(s.messages) == workload.num_turns for s in sessions)
    assert workload.total_kv_tokens >= POOL_SHARE * pool_blocks(workload) * BLOCK
    assert pool_blocks(workload) * BLOCK >= 2 * workload.longest_prompt_tokens, "vLLM can run several at once"


def test_a_pool_too_small_for_one_session_is_refused_with_the_fix() -> None:
    lonely = Workload(num_sessions=2, num_turns=2, system_tokens=64, context_tokens=512, message_tokens=32,
                      answer_tokens=16)
    with pytest.raises(ConfigError, match="add sessions or shorten them"):
        pool_blocks(lonely)


def test_prefix_repetition_covers_the_asked_tokens() -> None:
    dataset = PrefixRepetition.covering(4000, prefix_tokens=1024)
    assert dataset.num_prefixes == 4 and dataset.num_prompts == 8
    assert dataset.num_prefixes * dataset.prefix_tokens >= 4000
    assert dataset.arguments()[dataset.arguments().index("--num-prompts") + 1] == "8"


def test_serve_command_carries_the_connector_and_its_settings(tmp_path: Path) -> None:
    model = write_model(tmp_path / "model")
    spec = ServeSpec(model_dir=model, block_size=32, connector={"url": "http://127.0.0.1:1", "chunk_tokens": 64},
                     num_blocks=100, prefix_caching=True)
    cmd = spec.command_line(8000)
    transfer = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert (transfer["kv_connector"], transfer["kv_connector_module_path"]) == (CONNECTOR_CLASS, CONNECTOR_MODULE)
    assert transfer["kv_load_failure_policy"] == "recompute"
    assert transfer["kv_connector_extra_config"] == {"url": "http://127.0.0.1:1", "chunk_tokens": 64}
    assert cmd[cmd.index("--num-gpu-blocks-override") + 1] == "100"
    assert "--enable-prefix-caching" in cmd and "--skip-tokenizer-init" not in cmd, "the model dir has a tokenizer"
    assert spec.environment()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1", "vLLM's default process layout"
    alone = ServeSpec(model_dir=model, block_size=32).command_line(8000)
    assert "--kv-transfer-config" not in alone and "--no-enable-prefix-caching" in alone


def test_bad_serve_settings_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="has no config.json"):
        ServeSpec(model_dir=tmp_path)
    model = write_model(tmp_path / "model")
    with pytest.raises(ValueError, match="not a multiple of block_size 32; use a multiple such as 32"):
        ServeSpec(model_dir=model, block_size=32, connector={"url": "http://x", "chunk_tokens": 48})


def test_the_word_tokenizer_round_trips_any_ids(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(write_model(tmp_path / "model")))
    ids = [5, 1000, 3, 77, 1023, 3]
    assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids
    assert tokenizer.vocab_size == 1024


def test_metrics_and_percentiles() -> None:
    text = ('# HELP x\nvllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 256.0\n'
            'vllm:num_requests_running{engine="0"} 2\n')
    assert parse_metrics(text) == {'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"}': 256.0,
                                   'vllm:num_requests_running{engine="0"}': 2.0}
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == pytest.approx(4.6)
    assert percentile([7.0], 99) == 7.0


def test_the_summary_splits_first_turns_from_later_ones() -> None:
    def answer(ttft_s: float) -> Completion:
        return Completion(token_ids=[5, 6, 7], num_prompt_tokens=10, num_cached_tokens=4, ttft_s=ttft_s, latency_s=ttft_s + 1)

    result = RunResult([answer(4.0), answer(1.0), answer(6.0), answer(3.0)], num_failed=0, wall_s=2.0, turns=[0, 1, 0, 2])
    summary = result.summary()
    assert summary["ttft_first_turns"] == 5.0 and summary["ttft_later_turns"] == 2.0
    assert summary["ttft_mean"] == 3.5 and summary["tpot_mean"] == 0.5 and summary["throughput"] == 6.0
