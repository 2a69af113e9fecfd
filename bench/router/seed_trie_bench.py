"""Side-by-side baseline for router_bench: the seed router's Python string radix trie.

A re-implementation of the seed's StringRadixTrie (slime router, radix_tree.py), kept faithful
on purpose, defects included: no edge splitting (every prompt hangs off the root and lookups
scan the root's children with startswith), tokens of existing nodes skipped by count without
comparison, versions set only on newly created nodes, and a GC that scans the tree and asserts
that no child is newer than its parent. It replays the same workload the same way as
router_bench (bench/router/cache_bench.h): turn k looks up system + user_1 + ... + user_k,
tokenizes the rest with the same word splitter (same ids), appends the assistant text as
generated tokens and inserts the whole text at weight version 1 + index // per_version.
Only lookup and insert calls are timed. Memory is a deep sys.getsizeof of the trie.

Usage: python3 seed_trie_bench.py --workload /tmp/workload.jsonl [--limit N]
"""
import argparse
import json
import sys
import threading
import time


class MatchResult:
    def __init__(self, matched_prefix, token_ids, logp, loss_mask, remaining_string, last_node):
        self.matched_prefix = matched_prefix
        self.token_ids = token_ids
        self.logp = logp
        self.loss_mask = loss_mask
        self.remaining_string = remaining_string
        self.last_node = last_node


class StringTreeNode:
    counter = 0

    def __init__(self):
        self.children = []
        self.parent = None
        self.string_key = ""
        self.token_ids = None
        self.logp = None
        self.loss_mask = None
        self.last_access_time = time.monotonic()
        self.access_count = 0
        self.ref_count = 0
        self.weight_version = None
        self.id = StringTreeNode.counter
        StringTreeNode.counter += 1

    @property
    def has_value(self):
        return self.token_ids is not None

    def touch(self):
        self.last_access_time = time.monotonic()
        self.access_count += 1


class StringRadixTrie:
    def __init__(self, max_cache_size=10000, gc_threshold_k=5):
        self.max_cache_size = max_cache_size
        self.gc_threshold_k = gc_threshold_k
        self.root = StringTreeNode()
        self.root.ref_count = 1
        self.total_entries = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.cur_cache_size = 0
        self._lock = threading.RLock()

    def find_longest_prefix(self, text):
        with self._lock:
            if not text:
                return MatchResult("", [], [], [], text, self.root)
            tokens, logp, mask = [], [], []
            matched = ""
            node = self.root
            rest = text
            while rest:
                best, best_len = None, 0
                for child in node.children:  # complete startswith matches only
                    if rest.startswith(child.string_key) and len(child.string_key) > best_len:
                        best, best_len = child, len(child.string_key)
                if best is None:
                    break
                best.touch()
                node = best
                matched += best.string_key
                rest = rest[best_len:]
                if best.has_value:
                    tokens.extend(best.token_ids)
                    logp.extend(best.logp)
                    if best.loss_mask is not None:
                        mask.extend(best.loss_mask)
                    else:
                        mask.extend([1] * len(best.token_ids))
                    self.cache_hits += 1  # per matched node, not per query
            if not tokens:
                self.cache_misses += 1
            return MatchResult(matched, tokens, logp, mask, rest, node)

    def insert(self, text, token_ids, logp=None, loss_mask=None, weight_version=None):
        with self._lock:
            if not text or not token_ids:
                return False
            if logp is not None and len(logp) != len(token_ids):
                return False
            if loss_mask is not None and len(loss_mask) != len(token_ids):
                return False
            if logp is None:
                logp = [0.0] * len(token_ids)
            if loss_mask is None:
                loss_mask = [0] * len(token_ids)
            result = self._insert(text, token_ids, logp, loss_mask, weight_version)
            if self.cur_cache_size > self.max_cache_size and weight_version is not None:
                self.gc_by_weight_version(weight_version)
            return result

    def _insert(self, text, token_ids, logp, loss_mask, weight_version):
        node = self.root
        rest = text
        rest_tokens, rest_logp, rest_mask = token_ids[:], logp[:], loss_mask[:]
        traversed = [node]
        new_node = None
        while rest:
            best, best_len = None, 0
            for child in node.children:
                if rest.startswith(child.string_key) and len(child.string_key) > best_len:
                    best, best_len = child, len(child.string_key)
            if best is not None:
                node = best
                traversed.append(node)
                rest = rest[best_len:]
                if best.has_value:  # skipped by count, never compared
                    skip = len(best.token_ids)
                    rest_tokens = rest_tokens[skip:]
                    rest_logp = rest_logp[skip:]
                    rest_mask = rest_mask[skip:]
            else:
                new_node = StringTreeNode()
                new_node.parent = node
                new_node.string_key = rest
                if rest_tokens:
                    new_node.token_ids = rest_tokens
                    new_node.logp = rest_logp
                    new_node.loss_mask = rest_mask
                    new_node.touch()
                    self.cur_cache_size += len(rest_tokens)
                node.children.append(new_node)
                traversed.append(new_node)
                self.total_entries += 1
                break
        if rest == "" and not node.has_value and rest_tokens:
            node.token_ids = rest_tokens
            node.logp = rest_logp
            node.loss_mask = rest_mask
            node.touch()
            self.cur_cache_size += len(rest_tokens)
        if weight_version is not None and new_node:  # only the new node gets a version
            new_node.weight_version = weight_version
        return True

    def _remove_subtree(self, node):
        if node is self.root:
            return 0
        removed = 0
        for child in list(node.children):
            removed += self._remove_subtree(child)
        if node.has_value:
            removed += 1
            self.cur_cache_size -= len(node.token_ids)
        if node.parent and node in node.parent.children:
            node.parent.children.remove(node)
            self.total_entries -= 1
        return removed

    def gc_by_weight_version(self, current_weight_version=None):
        with self._lock:
            if current_weight_version is None:
                return 0
            threshold = current_weight_version - self.gc_threshold_k
            outdated = []

            def check(node):  # full tree scan
                if node is self.root:
                    for child in node.children:
                        check(child)
                    return
                if node.weight_version is not None and node.weight_version <= threshold and node.has_value:
                    outdated.append(node)
                    return
                for child in node.children:
                    check(child)

            check(self.root)
            removed = 0
            for node in outdated:
                self._validate_subtree_weight_versions(node)
                removed += self._remove_subtree(node)
            return removed

    def _validate_subtree_weight_versions(self, node):
        def validate(cur, parent_version):
            if cur.weight_version is not None and parent_version is not None:
                assert cur.weight_version <= parent_version, (
                    f"Child node weight_version {cur.weight_version} > parent weight_version {parent_version}")
            for child in cur.children:
                validate(child, cur.weight_version)

        validate(node, node.weight_version)


def fnv1a(data):
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def tokenize(text, mask, ids, masks, logps):
    """Same word splitter and ids as router_bench; prompt logprobs are 0.0 as in the seed."""
    i, n = 0, len(text)
    while i < n:
        j = i
        while j < n and text[j] in " \n\t\r":
            j += 1
        while j < n and text[j] not in " \n\t\r":
            j += 1
        while j < n and text[j] in " \n\t\r":
            j += 1
        tid = fnv1a(text[i:j].encode()) % 151936
        ids.append(tid)
        masks.append(mask)
        logps.append(-0.001 * (tid % 1000 + 1) if mask == 1 else 0.0)
        i = j


def deep_size(root):
    seen = set()
    total = 0
    text_bytes = 0
    nodes = 0
    stack = [root]
    while stack:
        node = stack.pop()
        nodes += 1
        text_bytes += len(node.string_key.encode())
        objs = [node, node.__dict__, node.children, node.string_key, node.last_access_time,
                node.access_count, node.ref_count, node.weight_version, node.id]
        for lst in (node.token_ids, node.logp, node.loss_mask):
            if lst is not None:
                objs.append(lst)
                objs.extend(lst)
        for o in objs:
            if o is not None and id(o) not in seen:
                seen.add(id(o))
                total += sys.getsizeof(o)
        stack.extend(node.children)
    return total, text_bytes, nodes - 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--max-cache-size", type=int, default=1 << 40)
    ap.add_argument("--gc-threshold-k", type=int, default=5)
    ap.add_argument("--trajectories-per-version", type=int, default=1000)
    ap.add_argument("--limit", type=int, default=0)
    a = ap.parse_args()
    workload = []
    with open(a.workload) as f:
        for line in f:
            if line.strip():
                workload.append(json.loads(line))
            if a.limit and len(workload) >= a.limit:
                break

    trie = StringRadixTrie(max_cache_size=a.max_cache_size, gc_threshold_k=a.gc_threshold_k)
    lookup_s = insert_s = 0.0
    lookups = inserts = hits = misses = prompt_tokens = reused = 0
    version = 0
    start = time.perf_counter()
    for index, traj in enumerate(workload):
        version = 1 + index // a.trajectories_per_version
        text = traj["system"]
        for turn in traj["turns"]:
            text += turn["user"]
            t0 = time.perf_counter()
            m = trie.find_longest_prefix(text)
            lookup_s += time.perf_counter() - t0
            lookups += 1
            if m.token_ids:
                hits += 1
            else:
                misses += 1
            ids, masks, logps = list(m.token_ids), list(m.loss_mask), list(m.logp)
            reused += len(ids)
            tokenize(m.remaining_string, 0, ids, masks, logps)
            prompt_tokens += len(ids)
            tokenize(turn["assistant"], 1, ids, masks, logps)
            text += turn["assistant"]
            t0 = time.perf_counter()
            try:
                trie.insert(text, ids, logps, masks, weight_version=version)
            except AssertionError as e:
                print(f"seed trie: GC assertion at trajectory {index}: {e}")
                sys.exit(1)
            insert_s += time.perf_counter() - t0
            inserts += 1
    wall = time.perf_counter() - start
    heap, text_bytes, nodes = deep_size(trie.root)
    tokens = max(trie.cur_cache_size, 1)
    print("== seed string radix trie (Python re-implementation) ==")
    print("tokenizer: word splitter (word + trailing whitespace = 1 token, FNV-1a id), not the model "
          "tokenizer: the figures measure the cache alone")
    print(f"trajectories {len(workload)}, turns {lookups}, weight versions 1..{version}, "
          f"max_cache_size {a.max_cache_size}, gc_threshold_k {a.gc_threshold_k}")
    print(f"insert ops/s          {inserts / insert_s:12.0f}  ({inserts} inserts, {insert_s:.3f} s)")
    print(f"lookup ops/s          {lookups / lookup_s:12.0f}  ({lookups} lookups, {lookup_s:.3f} s)")
    print(f"hit rate              {hits / max(lookups, 1):12.4f}  ({hits} hits, {misses} misses; "
          f"the seed's own counter says {trie.cache_hits} hits, {trie.cache_misses} misses)")
    print(f"prompt tokens reused  {reused / max(prompt_tokens, 1):12.4f}  ({reused} of {prompt_tokens})")
    print(f"cached tokens         {trie.cur_cache_size:12d}  ({text_bytes} text bytes, {nodes} nodes)")
    print(f"heap bytes/token      {heap / tokens:12.2f}  ({heap} bytes in all, deep sys.getsizeof)")
    print(f"overhead bytes/token  {heap / tokens - 13:12.2f}  (beyond 13 B of token data; text bytes "
          f"{text_bytes / tokens:.2f} of it)")
    print(f"replay wall time      {wall:12.3f} s (tokenization included)")


if __name__ == "__main__":
    main()
