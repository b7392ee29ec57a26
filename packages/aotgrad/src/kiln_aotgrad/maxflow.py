"""A small max-flow / min-cut (Edmonds-Karp: shortest augmenting paths by BFS).

The partitioner's flow networks have a few thousand vertices and most capacities infinite;
augmenting paths are as many as the saved tensors, so BFS-based augmentation is plenty.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Hashable

__all__ = ["FlowNetwork", "INF"]

INF = math.inf


class FlowNetwork:
    """A directed graph with capacities; ``min_cut(s, t)`` gives the source side of a
    minimum s-t cut (the vertices still reachable from ``s`` in the residual graph)."""

    def __init__(self) -> None:
        self._index: dict[Hashable, int] = {}
        self._names: list[Hashable] = []
        self._adj: list[list[int]] = []  # vertex -> edge ids
        self._to: list[int] = []
        self._cap: list[float] = []  # residual capacity; edge e ^ 1 is its reverse

    def __repr__(self) -> str:
        return f"FlowNetwork({len(self._names)} vertices, {len(self._to) // 2} edges)"

    def vertex(self, name: Hashable) -> int:
        v = self._index.get(name)
        if v is None:
            v = self._index[name] = len(self._names)
            self._names.append(name)
            self._adj.append([])
        return v

    def add_edge(self, u: Hashable, v: Hashable, capacity: float) -> None:
        if capacity < 0:
            raise ValueError(f"negative capacity {capacity} on {u!r} -> {v!r}")
        a, b = self.vertex(u), self.vertex(v)
        self._adj[a].append(len(self._to))
        self._to.append(b)
        self._cap.append(capacity)
        self._adj[b].append(len(self._to))
        self._to.append(a)
        self._cap.append(0.0)

    def max_flow(self, source: Hashable, sink: Hashable) -> float:
        s, t = self.vertex(source), self.vertex(sink)
        total = 0.0
        while True:
            parent_edge, _ = self._bfs(s, t)
            if t not in parent_edge:
                return total
            # bottleneck along the path
            flow, v = INF, t
            while v != s:
                e = parent_edge[v]
                flow = min(flow, self._cap[e])
                v = self._to[e ^ 1]
            if flow == INF:
                raise ValueError("the network has an infinite-capacity path from source to sink")
            v = t
            while v != s:
                e = parent_edge[v]
                self._cap[e] -= flow
                self._cap[e ^ 1] += flow
                v = self._to[e ^ 1]
            total += flow

    def min_cut(self, source: Hashable, sink: Hashable) -> set[Hashable]:
        """Run max-flow, then return the names on the source side of a minimum cut."""
        self.max_flow(source, sink)
        _, seen = self._bfs(self.vertex(source))
        return {self._names[v] for v in seen}

    def _bfs(self, s: int, t: int | None = None) -> tuple[dict[int, int], set[int]]:
        """Breadth-first search over edges with residual capacity from ``s``: the edge that
        reached each vertex and the vertices reached; stops when it reaches ``t``."""
        parent_edge: dict[int, int] = {}
        seen = {s}
        queue = collections.deque([s])
        while queue:
            u = queue.popleft()
            for e in self._adj[u]:
                w = self._to[e]
                if w not in seen and self._cap[e] > 0:
                    seen.add(w)
                    parent_edge[w] = e
                    if w == t:
                        return parent_edge, seen
                    queue.append(w)
        return parent_edge, seen
