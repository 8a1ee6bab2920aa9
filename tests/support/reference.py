"""A plain, obviously-correct model of the spec (lists, linear scans) to check the manager against."""

from __future__ import annotations


class PlainLRU:
    def __init__(self, capacity: int) -> None:
        self.order: list = []  # least recent first

    def insert(self, block_hash) -> None:
        self.order.append(block_hash)

    def remove(self, block_hash) -> None:
        self.order.remove(block_hash)

    def touch(self, block_hashes, is_ready) -> None:
        for block_hash in reversed(block_hashes):
            if block_hash in self.order:
                self.order.remove(block_hash)
                self.order.append(block_hash)

    def evict(self, n: int, eligible) -> list:
        victims = [h for h in self.order if h in eligible][:n]
        for victim in victims:
            self.order.remove(victim)
        return victims

    def state(self):
        return list(self.order)


class PlainARC:
    """ARC exactly as the spec words it, one list per queue, least recent first."""

    def __init__(self, capacity: int) -> None:
        self.c = capacity
        self.p = 0.0
        self.t1: list = []
        self.t2: list = []
        self.b1: list = []
        self.b2: list = []

    def insert(self, block_hash) -> None:
        self.t1.append(block_hash)
        for ghosts in (self.b1, self.b2):
            if block_hash in ghosts:
                ghosts.remove(block_hash)

    def remove(self, block_hash) -> None:
        (self.t1 if block_hash in self.t1 else self.t2).remove(block_hash)

    def touch(self, block_hashes, is_ready) -> None:
        for h in reversed(block_hashes):
            if h in self.t1:
                self.t1.remove(h)
                (self.t2 if is_ready(h) else self.t1).append(h)
            elif h in self.t2:
                self.t2.remove(h)
                self.t2.append(h)
            elif h in self.b1:
                self.p = min(self.p + max(1, len(self.b2) / len(self.b1)), self.c)
                self.b1.remove(h)
                self.b1.append(h)
            elif h in self.b2:
                self.p = max(self.p - max(1, len(self.b1) / len(self.b2)), 0)
                self.b2.remove(h)
                self.b2.append(h)

    def evict(self, n: int, eligible) -> list:
        chosen: list = []
        from_t1 = 0
        for _ in range(n):
            t1_side = [h for h in self.t1 if h in eligible and h not in chosen]
            t2_side = [h for h in self.t2 if h in eligible and h not in chosen]
            prefer_t1 = len(self.t1) - from_t1 >= int(self.p)
            if (prefer_t1 and t1_side) or not t2_side:
                chosen.append(t1_side[0])
                from_t1 += 1
            else:
                chosen.append(t2_side[0])
        for h in chosen:
            if h in self.t1:
                self.t1.remove(h)
                self.b1.append(h)
            else:
                self.t2.remove(h)
                self.b2.append(h)
        self.b1 = self.b1[-self.c :]
        self.b2 = self.b2[-self.c :]
        return chosen

    def state(self):
        return (list(self.t1), list(self.t2), list(self.b1), list(self.b2), self.p)


PLAIN_POLICIES = {"lru": PlainLRU, "arc": PlainARC}


class ReferenceManager:
    """The manager's spec with no attention to speed: dict of ref counts plus a plain policy."""

    def __init__(self, capacity: int, policy: str, store_threshold: int = 1, tracker: int = 64_000):
        self.capacity = capacity
        self.policy_name = policy
        self.policy = PLAIN_POLICIES[policy](capacity)
        self.ref: dict = {}  # hash -> ref_cnt (-1: being stored)
        self.events: list = []  # (hashes, removed)
        self.threshold = store_threshold
        self.tracker = tracker
        self.offers: list = []  # [hash, count], least recently offered first
        self.stores_skipped = 0

    def lookup(self, hashes) -> int:
        hits = 0
        for h in hashes:
            if self.ref.get(h, -1) < 0:
                break
            hits += 1
        return hits

    def _count_offers(self, hashes) -> None:
        """vLLM's rule: tracked hashes count again and are spared; when the tracker is full, a
        new hash replaces the least recently offered hash tracked before this call and not
        spared, and goes untracked when none is left."""
        spared = {h for h in hashes if any(e[0] == h for e in self.offers)}
        for h in hashes:
            if h in spared:
                entry = next(e for e in self.offers if e[0] == h)
                self.offers.remove(entry)
                self.offers.append([h, entry[1] + 1])
        replaceable = [e[0] for e in self.offers if e[0] not in spared]
        for h in hashes:
            if any(e[0] == h for e in self.offers):
                continue
            if len(self.offers) >= self.tracker:
                if not replaceable:
                    continue
                victim = replaceable.pop(0)
                self.offers = [e for e in self.offers if e[0] != victim]
            self.offers.append([h, 1])

    def touch(self, hashes) -> None:
        self.policy.touch(hashes, lambda h: self.ref[h] >= 0)

    def prepare_load(self, hashes) -> None:
        for h in hashes:
            if h not in self.ref:
                raise KeyError(h)
            if self.ref[h] < 0:
                raise ValueError(h)
        for h in hashes:
            self.ref[h] += 1

    def complete_load(self, hashes) -> None:
        remaining = dict(self.ref)
        for h in hashes:  # the first problem, in order, names the error
            if h not in remaining:
                raise KeyError(h)
            if remaining[h] <= 0:
                raise ValueError(h)
            remaining[h] -= 1
        self.ref = remaining

    def prepare_store(self, hashes):
        new = []
        for h in hashes:
            if h not in self.ref and h not in new:
                new.append(h)
        if self.threshold > 1:
            self._count_offers(hashes)
            seen = {e[0]: e[1] for e in self.offers}
            admitted = [h for h in new if seen.get(h, 0) >= self.threshold]
            self.stores_skipped += len(new) - len(admitted)
            new = admitted
        shortfall = len(new) - (self.capacity - len(self.ref))
        evicted: list = []
        if new and shortfall > 0:
            eligible = {h for h, r in self.ref.items() if r == 0 and h not in hashes}
            if len(eligible) < shortfall:
                return None
            evicted = self.policy.evict(shortfall, eligible)
            for h in evicted:
                del self.ref[h]
            self.events.append((evicted, True))
        for h in new:
            self.policy.insert(h)
            self.ref[h] = -1
        return new, evicted

    def complete_store(self, hashes, success: bool) -> None:
        done = []
        for h in hashes:
            if self.ref.get(h) == -1:
                if success:
                    self.ref[h] = 0
                else:
                    del self.ref[h]
                    self.policy.remove(h)
                done.append(h)
        if success and done:
            self.events.append((done, False))

    def reset(self) -> None:
        skipped = self.stores_skipped  # a counter: it keeps counting across resets
        self.__init__(self.capacity, self.policy_name, self.threshold, self.tracker)
        self.stores_skipped = skipped
