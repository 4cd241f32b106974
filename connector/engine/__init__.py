"""A small real engine: block pool, scheduler, Llama-style model with paged attention, sampler, metrics."""
