"""`kvstore pd-proxy`: an OpenAI-compatible front that sends each request's prompt to a prefill instance
and its answer to a decode instance (prefill/decode disaggregation through kvstore).

    config.py    ProxyConfig and the `[NODE=]URL` instance grammar
    pool.py      the instances of one role: health, in-flight counts, least-loaded choice
    bodies.py    the prefill and decode request bodies made from the client's
    upstream.py  one upstream call (prefill, decode, streamed decode) and its failure kinds
    placement.py which prefill and decode instance: load, and kvstore's cluster route when configured
    handoff.py   one request's prefill -> decode flow with its fallbacks
    health.py    the background /health poller
    state.py     what the routes share, and admission (the in-flight cap)
    metrics.py   counters and gauges as Prometheus text
    app.py       the FastAPI app: routes, auth, body and in-flight limits
"""
