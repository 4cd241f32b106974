"""The `kvstore` typer app: serve | plan | replay | bench | stats | config | demo | store-demo | pd-proxy.

Each command lives in its own module of `kvstore.cli` and imports its heavy dependencies (torch,
the engine, uvicorn, the store) only when it runs, so `kvstore --help` stays fast.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from kvstore.cli import bench, demo, pd_proxy, plan, replay, serve, stats, store_demo
from kvstore.cli.config_show import config_app
from kvstore.logs import set_log_level

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Tiered KV-cache store for LLM serving (GPU, host, NVMe, PFS, Redis).")


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level")] = False) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    set_log_level(logging.INFO if verbose else logging.WARNING)


app.command("serve")(serve.serve_command)
app.command("plan")(plan.plan_command)
app.command("replay", context_settings={"allow_extra_args": True})(replay.replay_command)
app.command("bench")(bench.bench_command)
app.command("stats")(stats.stats_command)
app.add_typer(config_app, name="config")
app.command("demo")(demo.demo_command)
app.command("store-demo")(store_demo.store_demo_command)

# REGISTER-COMMANDS (helpers add `app.command(...)(fn)` lines below this marker; import the
# command's module here, and its heavy dependencies inside the command function)
app.command("pd-proxy")(pd_proxy.pd_proxy_command)
