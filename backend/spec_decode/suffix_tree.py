"""A depth-bounded suffix trie with occurrence counts: what suffix decoding looks its guesses up in.

Every substring of the inserted sequences, up to `max_depth` tokens long, is a path from the
root; a node's count is how many times that substring occurred::

    tokens  a b a b c         (max_depth 3)
    root ─ a(2) ─ b(2) ─ a(1)
         │            └─ c(1)
         ├ b(2) ─ a(1) ─ b(1)
         │      └ c(1)
         └ c(1)

So the children of the node for a context's last m tokens say what followed those m tokens, and
how often: the continuation statistics suffix decoding proposes from. Appending one token costs
O(max_depth) (each suffix still shorter than max_depth grows by one), which is what lets a
request's own tree follow its output token by token. A sequence can be taken out again (the
global tree forgets the oldest cached outputs), and nodes whose count drops to 0 are freed.

Nodes are ints into flat lists rather than objects: a request's tree over a long prompt has
tens of thousands of nodes, and a list of dicts is the cheapest shape Python offers for them.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

ROOT = 0


class SuffixTree:
    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be at least 1, got {max_depth}")
        self.max_depth = max_depth
        self._children: list[dict[int, int] | None] = [{}]
        self._counts: list[int] = [0]
        self._free: list[int] = []  # node ids released by `remove`, reused before growing

    @property
    def num_nodes(self) -> int:
        return len(self._counts) - len(self._free) - 1

    def count(self, node: int) -> int:
        return self._counts[node]

    def children(self, node: int) -> dict[int, int]:
        return self._children[node] or {}

    def child(self, node: int, token: int) -> int | None:
        kids = self._children[node]
        return None if kids is None else kids.get(token)

    def append(self, frontier: list[int], token: int) -> list[int]:
        """Extend every suffix in `frontier` by `token`; returns the new frontier.

        The frontier is the list of nodes of the sequence's current suffixes of up to max_depth
        tokens, longest first ([] for an empty sequence), so frontier[j] is the suffix of
        len(frontier) - j tokens; after the append it holds the new suffixes' nodes. Callers
        keep it between appends."""
        return self.insert((token,), frontier)

    def insert(self, tokens: Iterable[int], frontier: list[int] | None = None) -> list[int]:
        """`append` of each token in turn, from `frontier` (None: an empty sequence). The steps are
        written out in this one loop: a request's tree over its prompt is len(prompt) x max_depth of
        them, on the engine thread, and a method call per step was most of their cost (a C=16 run
        of random 256-token prompts spent ~2 % of its engine time building trees)."""
        frontier = [] if frontier is None else frontier
        children, counts, free, depth = self._children, self._counts, self._free, self.max_depth
        for token in tokens:
            grown = []
            # the longest suffix is at max_depth already and does not grow; the empty one (ROOT) does
            for node in (*frontier[max(0, len(frontier) - depth + 1):], ROOT):
                kids = children[node]
                if kids is None:
                    kids = children[node] = {}
                nxt = kids.get(token)
                if nxt is None:
                    if free:
                        nxt = free.pop()
                        children[nxt], counts[nxt] = None, 0
                    else:
                        children.append(None)
                        counts.append(0)
                        nxt = len(counts) - 1
                    kids[token] = nxt
                counts[nxt] += 1
                grown.append(nxt)
            frontier = grown
        return frontier

    def remove(self, tokens: Sequence[int]) -> None:
        """Take out one earlier `insert` of exactly `tokens` (every substring it added)."""
        n = len(tokens)
        for start in range(n):
            node = ROOT
            for token in tokens[start:min(n, start + self.max_depth)]:
                nxt = self._children[node][token]
                self._counts[nxt] -= 1
                if self._counts[nxt] == 0:
                    del self._children[node][token]
                    self._release(nxt)
                    break  # everything below it had a count <= its own: already released
                node = nxt

    def _release(self, node: int) -> None:
        stack = [node]
        while stack:
            cur = stack.pop()
            kids = self._children[cur]
            if kids:
                stack.extend(kids.values())
            self._children[cur] = None
            self._counts[cur] = 0
            self._free.append(cur)

    def find(self, pattern: Sequence[int]) -> int | None:
        """The node of `pattern` (at most max_depth tokens), or None where it never occurred."""
        node = ROOT
        for token in pattern:
            kids = self._children[node]
            node = None if kids is None else kids.get(token)
            if node is None:
                return None
        return node
