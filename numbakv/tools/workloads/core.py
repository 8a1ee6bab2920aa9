"""Synthetic traffic in the trace format, seeded and deterministic (`python3 -m numbakv.workloads`
writes one to a file: numbakv.tools.workloads.command)."""

from __future__ import annotations

import heapq
from itertools import count

import numpy as np

from numbakv.tools.traces import TraceRequest

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


def mixed_traffic(
    requests: int = 12_000,
    system_prompts: int = 16,
    documents: int = 3_000,
    zipf_exponent: float = 1.1,
    session_share: float = 0.5,
    document_share: float = 0.3,
    mean_turns: float = 5.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """A mix of multi-turn sessions, questions about shared documents, and one-off long prompts.

    - sessions (`session_share` of requests) start on one of a few system prompts (Zipf popularity)
      and resend their growing history every turn; a busy service interleaves many of them;
    - document questions (`document_share`) read a document picked with Zipf popularity from a
      library of `documents`, each always behind the same system prompt, plus a fresh question;
    - the rest are one-off prompts (pasted files, batch jobs) that are never seen again.
    """
    rng = np.random.default_rng(seed)
    ids = count()
    prompt_chains = [
        [next(ids) for _ in range(int(rng.integers(1, 9)))] for _ in range(system_prompts)
    ]
    prompt_popularity = _zipf(system_prompts, zipf_exponent)
    document_prompt = rng.choice(system_prompts, size=documents, p=prompt_popularity)
    document_length = rng.integers(2, 33, size=documents)
    document_chains: dict[int, list[int]] = {}
    document_popularity = _zipf(documents, zipf_exponent)
    open_sessions: list[tuple[list[int], int]] = []  # (context, turns left)

    trace = []
    arrival = 0.0
    for _ in range(requests):
        arrival += rng.exponential(300.0)
        kind = rng.random()
        if kind < session_share:
            # A new session about once per mean_turns session requests, else any open one goes on.
            if not open_sessions or rng.random() < 1.0 / mean_turns:
                prompt = prompt_chains[int(rng.choice(system_prompts, p=prompt_popularity))]
                open_sessions.append((list(prompt), int(rng.geometric(1.0 / mean_turns))))
            index = int(rng.integers(len(open_sessions)))
            context, turns_left = open_sessions[index]
            chain = context + [next(ids) for _ in range(int(rng.integers(1, 4)))]
            if turns_left > 1:
                answer = [next(ids) for _ in range(int(rng.integers(1, 3)))]
                open_sessions[index] = (chain + answer, turns_left - 1)
            else:
                open_sessions[index] = open_sessions[-1]
                open_sessions.pop()
        elif kind < session_share + document_share:
            document = int(rng.choice(documents, p=document_popularity))
            if document not in document_chains:
                prefix = prompt_chains[int(document_prompt[document])]
                document_chains[document] = prefix + [
                    next(ids) for _ in range(int(document_length[document]))
                ]
            chain = document_chains[document] + [next(ids)]
        else:
            chain = [next(ids) for _ in range(int(rng.integers(8, 129)))]
        output_tokens = int(rng.integers(20, 800))
        trace.append(TraceRequest(int(arrival), len(chain) * BLOCK_TOKENS, output_tokens, chain))
    return trace


def _zipf(n: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** exponent
    return weights / weights.sum()


def document_traffic(seed: int = 0) -> list[TraceRequest]:
    """Mostly questions over a large document library with a flatter popularity (RAG-like)."""
    return mixed_traffic(
        session_share=0.2, document_share=0.6, documents=6_000, zipf_exponent=0.9, seed=seed
    )


def document_loop(
    requests: int = 12_000, documents: int = 1_000, random_share: float = 0.2, seed: int = 0
) -> list[TraceRequest]:
    """A batch job sweeping a fixed document set in order, again and again, with some reads at
    random in between (an evaluation harness, an agent re-reading a corpus): a loop of about
    25,000 blocks, where the block used longest ago is the next one needed."""
    rng = np.random.default_rng(seed)
    ids = count()
    document_chains = [
        [next(ids) for _ in range(int(rng.integers(10, 41)))] for _ in range(documents)
    ]
    trace = []
    arrival = 0.0
    for position in range(requests):
        arrival += rng.exponential(300.0)
        at_random = rng.random() < random_share
        document = int(rng.integers(documents)) if at_random else position % documents
        chain = document_chains[document] + [next(ids)]  # the document, then a fresh question
        output_tokens = int(rng.integers(20, 800))
        trace.append(TraceRequest(int(arrival), len(chain) * BLOCK_TOKENS, output_tokens, chain))
    return trace


WORKLOADS = {
    "chat": multi_turn_chat,
    "mixed": mixed_traffic,
    "documents": document_traffic,
    "loop": document_loop,
}
