"""The running requests' K/V as dense rows, for decode.

A decode step attends every running request over its whole context. Gathering those contexts from
the slot pool each step moved the whole running K/V through memory once more than attention needs
(the gather was a fifth of a decode step on a 2-core CPU). Here each running request owns one row
of a dense (layers, rows, kv_heads, length, head_dim) tensor, filled from the pool once when it joins
and then appended to one token per step; attention reads the rows in place. The pool stays the
source of truth (the prefix cache and prefill read it): decode writes each new token to both.

Rows are kept packed, 0..B-1: a request that leaves is replaced by the last row (one row copied), so
the (B, kv_heads) dimensions of rows[:B] merge into one batch dimension as a view."""

import torch


class RunningKV:
    def __init__(self, cfg, device, dtype, budget_bytes):
        self.layers, self.kv_heads, self.head_dim = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
        self.smear = bool(cfg.rstar_key_smear)
        self.device, self.dtype = device, dtype
        self.budget = budget_bytes
        self.elem = torch.empty((), dtype=dtype).element_size()
        self.k = self.v = self.prev = None
        self.cap_rows = self.cap_len = 0
        self.serials = []  # row i holds the request with serial number serials[i]
        self.lens = []  # tokens of K/V in row i

    def _bytes(self, rows, length):
        per = self.layers * rows * self.kv_heads * self.head_dim * self.elem
        return 2 * per * length + (per if self.smear else 0)

    def fits(self, rows, length):
        """Whether `rows` rows of `length` tokens fit the memory budget (the caller falls back to the
        pool). What is needed counts, not the shape held now: _grow reshapes within the budget."""
        return self._bytes(rows, length) <= self.budget

    def _max_len(self, rows):
        """The longest rows that `rows` of them can have within the budget."""
        per = self.layers * rows * self.kv_heads * self.head_dim * self.elem
        return (self.budget - (per if self.smear else 0)) // (2 * per)

    def _grow(self, rows, length):
        if rows <= self.cap_rows and length <= self.cap_len:
            return
        # Headroom, so that most steps reallocate nothing: rows double (requests join a batch at a
        # time); length doubles, or takes all the budget leaves it. Near the budget a length of
        # exactly what was needed made every step reallocate (and zero) the rows: 2.3 million page
        # faults in one evaluation on a VM where a fault costs 12 us. A dimension that no longer fits
        # beside the other shrinks back to what is needed (a batch that was wide is now long).
        want = max(rows, 2 * self.cap_rows) if rows > self.cap_rows else self.cap_rows
        cr = want if self._max_len(want) >= length else rows
        cl = max(length, min(max(length, 2 * self.cap_len), self._max_len(cr)))
        shape = (self.layers, cr, self.kv_heads, cl, self.head_dim)
        k = torch.zeros(shape, device=self.device, dtype=self.dtype)
        v = torch.zeros(shape, device=self.device, dtype=self.dtype)
        prev = torch.zeros((self.layers, cr, self.kv_heads, self.head_dim), device=self.device,
                           dtype=self.dtype) if self.smear else None
        B, L = len(self.serials), max(self.lens, default=0)
        if B:
            k[:, :B, :, :L] = self.k[:, :B, :, :L]
            v[:, :B, :, :L] = self.v[:, :B, :, :L]
            if prev is not None:
                prev[:, :B] = self.prev[:, :B]
        self.k, self.v, self.prev, self.cap_rows, self.cap_len = k, v, prev, cr, cl

    def sync(self, running, pool, written):
        """Makes the rows hold exactly `running`: drops the rows of requests no longer in it and adds
        one for each new request, copying its first written(r) tokens' K/V from the pool. Returns the
        running requests in row order. (Rows keep serial numbers, not requests: a finished request
        is freed as soon as the engine lets go of it.)"""
        by_serial = {r.serial: r for r in running}
        i = 0
        while i < len(self.serials):
            if self.serials[i] in by_serial:
                i += 1
            else:
                self._drop(i)
        have = set(self.serials)
        new = [r for r in running if r.serial not in have]
        if new:
            ns = [written(r) for r in new]
            self._grow(len(self.serials) + len(new), max(self.lens + ns))
            for r, n in zip(new, ns):
                row = len(self.serials)
                slots = r.slots[:n]
                self.k[:, row, :, :n] = pool.k.index_select(2, slots)
                self.v[:, row, :, :n] = pool.v.index_select(2, slots)
                if self.smear:
                    self.prev[:, row] = pool.k_raw[:, :, slots[n - 1]]
                self.serials.append(r.serial)
                self.lens.append(n)
        return [by_serial[s] for s in self.serials]

    def _drop(self, i):
        last = len(self.serials) - 1
        if i != last:
            n = self.lens[last]
            self.k[:, i, :, :n] = self.k[:, last, :, :n]
            self.v[:, i, :, :n] = self.v[:, last, :, :n]
            if self.smear:
                self.prev[:, i] = self.prev[:, last]
            self.serials[i], self.lens[i] = self.serials[last], self.lens[last]
        self.serials.pop()
        self.lens.pop()

    def clear(self):
        self.serials, self.lens = [], []

    def advance(self):
        """Room for one more token in every row; returns (positions (B,), lengths after it (B,))."""
        self._grow(len(self.serials), max(self.lens) + 1)
        pos = torch.tensor(self.lens, device=self.device)
        self.lens = [n + 1 for n in self.lens]
        return pos, pos + 1
