"""Request scheduling policies for the engine: FCFS, shortest-prompt-first with aging, quota/debt-bounded aging."""
