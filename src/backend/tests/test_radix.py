"""radix: the prefix cache's tree on its own: matching splits edges, insertion reports what was cached
already, locks keep nodes, eviction goes least recently used first and frees parents after children."""

import unittest

import common  # noqa: F401  (puts rstar_backend on the path)
import torch

from rstar_backend.radix import RadixCache


def slots(*xs):
    return torch.tensor(xs, dtype=torch.long)


class RadixTest(unittest.TestCase):
    def test_an_empty_tree_matches_nothing(self):
        t = RadixCache()
        node, s, n = t.match([1, 2, 3])
        self.assertIs(node, t.root)
        self.assertEqual((n, s.tolist()), (0, []))

    def test_a_match_inside_an_edge_splits_it_and_returns_the_prefix_slots(self):
        t = RadixCache()
        m, _ = t.insert([1, 2, 3, 4], slots(10, 11, 12, 13))
        self.assertEqual((m, t.tokens), (0, 4))
        node, s, n = t.match([1, 2, 9])
        self.assertEqual((n, s.tolist()), (2, [10, 11]))
        self.assertEqual(node.key, (1, 2))
        # the rest of the old edge hangs below, still matched whole
        _, s, n = t.match([1, 2, 3, 4, 5])
        self.assertEqual((n, s.tolist()), (4, [10, 11, 12, 13]))
        self.assertEqual(t.tokens, 4)

    def test_insert_reports_the_part_already_cached(self):
        t = RadixCache()
        t.insert([1, 2, 3], slots(10, 11, 12))
        m, node = t.insert([1, 2, 3, 7, 8], slots(20, 21, 22, 23, 24))
        self.assertEqual(m, 3)  # slots 20-22 stay the caller's; 23, 24 are the tree's now
        self.assertEqual(t.tokens, 5)
        self.assertEqual(t.match([1, 2, 3, 7, 8])[1].tolist(), [10, 11, 12, 23, 24])
        self.assertEqual(node.key, (7, 8))
        m, _ = t.insert([1, 2, 5], slots(30, 31, 32))  # a branch off the middle of an edge
        self.assertEqual((m, t.tokens), (2, 6))
        self.assertEqual(t.match([1, 2, 5])[1].tolist(), [10, 11, 32])

    def test_locked_nodes_are_not_evicted_and_lru_goes_first(self):
        t = RadixCache()
        t.insert([1, 2], slots(1, 2))
        t.insert([3, 4], slots(3, 4))
        t.insert([5, 6], slots(5, 6))
        t.match([1, 2])  # [3, 4] is now the least recently used
        held, _, _ = t.match([5, 6])
        t.lock(held)
        self.assertEqual((t.locked, t.evictable), (2, 4))
        freed = t.evict(1)
        self.assertEqual([x.tolist() for x in freed], [[3, 4]])
        freed = t.evict(100)
        self.assertEqual([x.tolist() for x in freed], [[1, 2]])  # [5, 6] is locked
        self.assertEqual((t.tokens, t.evictable), (2, 0))
        t.unlock(held)
        self.assertEqual([x.tolist() for x in t.evict(100)], [[5, 6]])
        self.assertEqual((t.tokens, t.locked), (0, 0))

    def test_a_lock_holds_the_whole_path_and_a_parent_goes_after_its_children(self):
        t = RadixCache()
        t.insert([1, 2, 3, 4], slots(1, 2, 3, 4))
        t.insert([1, 2, 7], slots(9, 9, 7))
        node, _, _ = t.match([1, 2, 3, 4])
        t.lock(node)
        self.assertEqual(t.locked, 4)  # [1, 2] and [3, 4]
        self.assertEqual([x.tolist() for x in t.evict(100)], [[7]])
        t.unlock(node)
        freed = t.evict(100)
        self.assertEqual([x.tolist() for x in freed], [[3, 4], [1, 2]])
        self.assertEqual(t.tokens, 0)

    def test_unlocking_more_than_locked_is_caught(self):
        t = RadixCache()
        _, node = t.insert([1], slots(1))
        with self.assertRaises(AssertionError):
            t.unlock(node)


if __name__ == "__main__":
    unittest.main()
