"""Synthetic multi-turn chat traffic in the trace format, seeded and deterministic."""

from __future__ import annotations

import heapq
from itertools import count

import numpy as np

from numbakv.traces import TraceRequest

BLOCK_TOKENS = 512  # tokens per block id, as in the Mooncake traces


def multi_turn_chat(
    sessions: int = 1500,
    system_prompts: int = 8,
    mean_turns: float = 4.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """Chat sessions that share a few system prompts and resend their growing history every turn.

    Sessions start as a Poisson process; each turn appends the previous answer and a new question to
    the context, after a random think time. System prompts are picked with Zipf-like popularity.
    """
    rng = np.random.default_rng(seed)
    ids = count()
    prompt_chains = [
        [next(ids) for _ in range(int(rng.integers(1, 5)))] for _ in range(system_prompts)
    ]
    popularity = 1.0 / np.arange(1, system_prompts + 1)
    popularity /= popularity.sum()

    # (arrival ms, session, turns left, context so far): a heap keeps every session's turns in time order.
    pending: list[tuple[int, int, int, list[int]]] = []
    start = 0.0
    for session in range(sessions):
        start += rng.exponential(200.0)
        prompt = prompt_chains[int(rng.choice(system_prompts, p=popularity))]
        turns = int(rng.geometric(1.0 / mean_turns))
        heapq.heappush(pending, (int(start), session, turns, list(prompt)))

    requests = []
    while pending:
        arrival, session, turns_left, context = heapq.heappop(pending)
        question = int(rng.integers(1, 4))
        chain = context + [next(ids) for _ in range(question)]
        answer_tokens = int(rng.integers(50, 600))
        requests.append(TraceRequest(arrival, len(chain) * BLOCK_TOKENS, answer_tokens, chain))
        if turns_left > 1:
            # The answer joins the context; the next question comes after a think time.
            grown = chain + [next(ids) for _ in range(max(1, answer_tokens // BLOCK_TOKENS))]
            think = int(rng.exponential(30_000.0))
            heapq.heappush(pending, (arrival + think, session, turns_left - 1, grown))
    return requests
