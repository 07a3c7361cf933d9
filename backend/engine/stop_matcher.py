"""All of a request's stop strings as one Aho-Corasick automaton over characters.

Searching each stop string in the new text, and then each of its prefixes
against the text's tail to know what to hold back, cost (count x length) per
token, and (count x length^2) for the hold-back: 64 stop strings of 256
characters took ~3.4 ms per token per sequence on the engine thread, which every
other request in the batch waited for. The automaton reads each output
character once, whatever the stop strings are, and its state answers both
questions:

    node = the longest suffix of the text read so far that is a prefix of
           some stop string (a trie node)
    matches at a node  = the stop strings that end here (the node's own, then
                         its dictionary links)
    hold at a node     = length of the longest suffix that is a *proper*
                         prefix of some stop string (a node with children)

The automaton is immutable and shared by every request with the same stop
strings (cached); a request keeps only its current node. Building the largest
takes ~0.1 s, so AsyncEngine.add_request builds it on the caller's thread
(admission), and the engine thread finds it cached.
"""
from __future__ import annotations

from array import array
from collections import deque
from functools import lru_cache

_SHIFT = 21                 # code points fit in 21 bits
_MASK = (1 << _SHIFT) - 1


class StopAutomaton:
    """Built once per distinct tuple of stop strings; see `stop_automaton()`.

    Compact on purpose (64 stop strings of 256 distinct characters are 16k nodes): one dict
    of transitions keyed `node << 21 | ord(ch)` and int arrays per node, ~1.5 MB at most
    instead of ~6 MB with a dict per node."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        goto: dict[int, int] = {}
        depth, word, has_child = array("i", [0]), array("i", [-1]), bytearray(1)
        for i, s in enumerate(stops):
            node = 0
            for ch in s:
                key = node << _SHIFT | ord(ch)
                nxt = goto.get(key)
                if nxt is None:
                    nxt = len(depth)
                    goto[key] = nxt
                    has_child[node] = 1
                    depth.append(depth[node] + 1)
                    word.append(-1)
                    has_child.append(0)
                node = nxt
            if word[node] < 0:
                word[node] = i
        n = len(depth)
        fail, dict_link, hold = array("i", bytes(4 * n)), array("i", [-1]) * n, array("i", bytes(4 * n))
        # Breadth first (children of a node in key order): every node's fail target is shallower.
        by_parent: dict[int, list[tuple[int, int]]] = {}
        for key, child in goto.items():
            by_parent.setdefault(key >> _SHIFT, []).append((key & _MASK, child))
        order = deque(child for _, child in by_parent.get(0, ()))
        while order:
            node = order.popleft()
            for ch, child in by_parent.get(node, ()):
                f = fail[node]
                while f and (f << _SHIFT | ch) not in goto:
                    f = fail[f]
                target = goto.get(f << _SHIFT | ch, 0)
                fail[child] = target if target != child else 0
                order.append(child)
            f = fail[node]
            dict_link[node] = f if word[f] >= 0 else dict_link[f]
            hold[node] = depth[node] if has_child[node] else hold[f]
        self.stops, self.word, self.fail, self.dict_link, self.hold = stops, word, fail, dict_link, hold
        self._goto = goto

    def step(self, node: int, ch: str) -> int:
        goto, fail, c = self._goto, self.fail, ord(ch)
        while node and (node << _SHIFT | c) not in goto:
            node = fail[node]
        return goto.get(node << _SHIFT | c, 0)

    def matches(self, node: int) -> list[int]:
        """Indices (into the stop strings) of those that end at `node`; a duplicate string
        answers with its first index."""
        out = []
        v = node if self.word[node] >= 0 else self.dict_link[node]
        while v > 0:
            out.append(self.word[v])
            v = self.dict_link[v]
        return out


@lru_cache(maxsize=32)  # <3 MB each; requests with the same stop strings share one
def stop_automaton(stops: tuple[str, ...]) -> StopAutomaton:
    return StopAutomaton(stops)
