"""The prefix cache of engine-serve: a radix tree of token sequences the engine has run, each edge
holding the KV-pool slots of its tokens (SGLang's RadixCache, page size 1).

A request whose input begins with cached tokens prefills only the rest. In an agentic rollout every
turn after the first re-sends the whole context (prompt, earlier turns, tool output), and the n
samples of a problem share one prompt; without the cache each turn prefilled its whole context
again, ~40% of engine-serve's time in an RL step (docs/experiments/2026-12-03-slower-vm-kind.md).

Ownership: a slot is either a running request's own or the tree's. A request that reuses a prefix
locks the node where its match ends (and so every node above it) until it finishes; only unlocked
leaves are evicted, least recently used first, when the pool runs short. The tree never frees a slot
itself: evict() returns them to the caller, who owns the pool.
"""

import heapq
import itertools

import torch


class Node:
    __slots__ = ("key", "slots", "children", "parent", "lock", "last")

    def __init__(self, key, slots, parent):
        self.key = key  # the tokens on the edge from the parent (a tuple)
        self.slots = slots  # their KV slots, a LongTensor of len(key)
        self.children = {}  # first token of the child's key -> child
        self.parent = parent
        self.lock = 0  # running requests whose reused prefix ends at or below this node
        self.last = 0  # the access clock's value when last matched or inserted


def _common(key, ids, at):
    """How many leading tokens of key equal ids[at:]."""
    n = min(len(key), len(ids) - at)
    if tuple(ids[at:at + n]) == key[:n]:
        return n
    i = 0
    while i < n and key[i] == ids[at + i]:
        i += 1
    return i


class RadixCache:
    def __init__(self, device="cpu"):
        self.root = Node((), None, None)
        self.root.lock = 1  # never evicted
        self.device = device
        self.tokens = 0  # tokens held by the tree
        self.locked = 0  # of those, in nodes some running request has locked
        self._clock = itertools.count(1)

    @property
    def evictable(self):
        return self.tokens - self.locked

    def _split(self, node, n):
        """Cuts node's edge after n tokens; returns the new upper part (which keeps node as its child)."""
        upper = Node(node.key[:n], node.slots[:n], node.parent)
        upper.lock, upper.last = node.lock, node.last
        upper.parent.children[upper.key[0]] = upper
        node.key, node.slots, node.parent = node.key[n:], node.slots[n:], upper
        upper.children[node.key[0]] = node
        return upper

    def _walk(self, ids):
        """Follows ids down the tree as far as they match, splitting the edge where the match ends
        inside it: (node covering exactly the matched prefix, the slot tensors along the path, length)."""
        now = next(self._clock)
        node, at, parts = self.root, 0, []
        while at < len(ids):
            child = node.children.get(ids[at])
            if child is None:
                break
            n = _common(child.key, ids, at)
            if n < len(child.key):
                child = self._split(child, n)
            child.last = now
            parts.append(child.slots)
            node, at = child, at + n
        return node, parts, at

    def match(self, ids):
        """The longest cached prefix of ids: (node, its slots as one LongTensor, its length)."""
        node, parts, n = self._walk(ids)
        slots = torch.cat(parts) if parts else torch.empty(0, dtype=torch.long, device=self.device)
        return node, slots, n

    def insert(self, ids, slots):
        """Caches ids, whose K/V sit in slots (same length). Returns (m, node): the first m tokens were
        already cached (those of the given slots that are not the tree's own stay the caller's to
        free), slots[m:] now belong to the tree, and node covers all of ids."""
        node, _, m = self._walk(ids)
        if m < len(ids):
            leaf = Node(tuple(ids[m:]), slots[m:], node)
            leaf.last = next(self._clock)
            node.children[leaf.key[0]] = leaf
            self.tokens += len(leaf.key)
            node = leaf
        return m, node

    def lock(self, node):
        while node is not self.root:
            if node.lock == 0:
                self.locked += len(node.key)
            node.lock += 1
            node = node.parent

    def unlock(self, node):
        while node is not self.root:
            node.lock -= 1
            assert node.lock >= 0, "radix cache: unlocked more often than locked"
            if node.lock == 0:
                self.locked -= len(node.key)
            node = node.parent

    def evict(self, need):
        """Drops unlocked leaves, least recently used first, until at least `need` tokens are freed
        (or nothing unlocked is left); returns the freed slot tensors."""
        order = itertools.count()
        heap = [(x.last, next(order), x) for x in self._leaves() if x.lock == 0]
        heapq.heapify(heap)
        freed, got = [], 0
        while got < need and heap:
            _, _, x = heapq.heappop(heap)
            freed.append(x.slots)
            got += len(x.key)
            self.tokens -= len(x.key)
            parent = x.parent
            del parent.children[x.key[0]]
            if parent is not self.root and not parent.children and parent.lock == 0:
                heapq.heappush(heap, (parent.last, next(order), parent))
        return freed

    def _leaves(self):
        stack, out = [self.root], []
        while stack:
            x = stack.pop()
            if x.children:
                stack.extend(x.children.values())
            elif x is not self.root:
                out.append(x)
        return out
