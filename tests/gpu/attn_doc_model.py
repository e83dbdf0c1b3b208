#!/usr/bin/env python3
"""CPU model of the document-mask tile rules of the attention kernels
(kernels/cuda/attention_doc.cuh, used by attention.cu, attention_sm90.cu and
attention_bwd_sm90.cu), run by `make check` (tests/kernel_models.sh).

For random document layouts (single tokens, documents spanning tiles, several per tile, a
document at T - 1, one document) and T around the tile sizes:
1. doc_query_end, the kernels' 32-way warp search, transliterated: equals a linear scan,
   for every key k.
2. Forward: every (query, key) pair the mask keeps lies in a key tile the kernel visits
   (Hopper: 128 x 128 tiles from doc_first_key(q0) / 128; mma.sync: 64-key steps from
   doc_first_key(q0) / 64, a warp of 32 rows skipping the steps before its first row's
   first key), and the tiles that skip the element-wise document mask (they start at or
   after the last row's first key) hold no pair it would drop.
3. Backward: every kept pair lies in a 64-query step the dK/dV kernels visit (from k0 to
   doc_query_end of the tile's last key) and, when the step's document-mask flag is off,
   needs no masking; attention.cu's per-key-row cut (a binary search of the step's first
   keys) equals a count; the dS fragments both dQ kernels read (wgmma: 128-key tiles from
   doc_first_key(64Q) / 128 per warpgroup; mma.sync: 64-key steps from the block's first
   tile, a warp skipping those before its own tile's) are all written by the dK/dV pass,
   and they cover every kept pair of their rows.
4. Negative cases the model must catch: a dQ kernel starting at its block's first tile
   for both warpgroups, and a search that stops one round early.
The tiles and steps are read from the .cu files (tests/gpu/cu_constants.py), so a change
there changes what is checked here.
Run: python3 tests/gpu/attn_doc_model.py  (exit status 0: all passed)."""
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cu_constants import constants  # noqa: E402

MMA = constants("attention.cu")          # the mma.sync kernels and the dK/dV fallback
HOPPER = constants("attention_sm90.cu")  # the Hopper forward
HOPPER_BWD = constants("attention_bwd_sm90.cu")
BK, BQ = MMA["KV_BK"], MMA["KV_BQ"]  # dK/dV key tile, query step (dS tile: BK keys x BQ queries)
assert (HOPPER_BWD["BK"], HOPPER_BWD["BQ"]) == (BK, BQ), "the dK/dV kernels' dS tiles differ"
SLICE = BK // MMA["KV_NS"]           # keys per 32-key slice of the dK/dV pass (its warp pairs)
FRAG = math.isqrt(MMA["DS_FRAG"])    # a dS fragment: FRAG x FRAG
FWD_BM = HOPPER["BM"]                # Hopper forward tile (BM == BN)
assert HOPPER["BN"] == FWD_BM, "the model takes the Hopper forward's tiles square"
MMA_BR, MMA_BC = MMA["FWD_BR"], MMA["FWD_BC"]  # mma.sync forward block rows, key step
MMA_WARPS = MMA["FWD_THREADS"] // 32
MMA_ROWS = MMA_BR // MMA_WARPS       # query rows per warp
DQ_BR, DQ_BC = MMA["DQ_BR"], MMA["DQ_BC"]  # mma.sync dQ block rows, key step
DQ_WARPS = MMA["DQ_THREADS"] // 32


def layout(T, kind, maxlen, rnd):
    """tests/doc_layout.h's doc_layout"""
    row, t = [0] * T, 0
    while t < T:
        if kind == "one":
            n = T
        elif kind == "short":
            n = 1 + rnd.randrange(2)
        elif kind == "fixed":
            n = maxlen
        else:
            n = 1 + rnd.randrange(maxlen)
        if kind == "last" and t + n >= T - 1:
            n = T - 1 - t if T - 1 - t > 0 else 1
        for i in range(t, min(t + n, T)):
            row[i] = t
        t += n
    return row


def first_key(row, t):
    return min(row[t], t)


def query_end(row, T, k, early=False):
    """doc_query_end: 32 probes per round over [lo, hi]"""
    lo, hi = min(k + 1, T), T
    while lo < hi:
        step = (hi - lo + 31) // 32
        after = [p < hi and row[p] > k for p in (lo + lane * step for lane in range(32))]
        if not any(after):
            lo += (hi - 1 - lo) // step * step + 1
        else:
            f = after.index(True)
            hi = lo + f * step
            if f > 0:
                lo += (f - 1) * step + 1
        if early and step > 1 and lo < hi:
            return hi  # the broken search of the negative case
    return lo


def query_end_scan(row, T, k):
    for t in range(max(k + 1, 0), T):
        if row[t] > k:
            return t
    return T


def step_cut(lo, kr):
    """attn_bwd_dkv_kernel's binary search: the first query of a step whose first key
    follows key kr (64 when none)"""
    c, half = 0, BQ // 2
    while half > 0:
        if lo[c + half - 1] <= kr:
            c += half
        half >>= 1
    return BQ if lo[c] <= kr and c == BQ - 1 else c


def kept(row, i, j):
    return j <= i and row[j] == row[i]  # the same document: they share a first token


def check_forward(row, T):
    # Hopper: tile qt visits key tiles jb..qt; LOW mask where k0 < low_last
    for qt in range((T + FWD_BM - 1) // FWD_BM):
        q0 = qt * FWD_BM
        jb = first_key(row, q0) // FWD_BM
        low_last = first_key(row, min(q0 + FWD_BM - 1, T - 1))
        rows = range(q0, min(q0 + FWD_BM, T))
        for i in rows:
            for j in range(0, i + 1):
                if kept(row, i, j):
                    assert jb <= j // FWD_BM <= qt, ("hopper fwd skipped a kept pair", i, j)
        for kt in range(jb, qt + 1):
            k0 = kt * FWD_BM
            if k0 >= low_last:  # no document mask on this tile
                for i in rows:
                    for j in range(k0, min(k0 + FWD_BM, i + 1)):
                        assert kept(row, i, j), ("hopper fwd tile unmasked", i, j)
    # mma.sync: block kt0, per warp skip, per warp LOW flag
    for qb in range((T + MMA_BR - 1) // MMA_BR):
        q0 = qb * MMA_BR
        kt0 = first_key(row, q0) // MMA_BC
        for w in range(MMA_WARPS):
            wq0 = q0 + MMA_ROWS * w
            if wq0 >= T:
                continue
            wfirst = first_key(row, min(wq0, T - 1))
            wlast = first_key(row, min(wq0 + MMA_ROWS - 1, T - 1))
            rows = range(wq0, min(wq0 + MMA_ROWS, T))
            seen = set()
            for kt in range(kt0, (min(q0 + MMA_BR - 1, T - 1)) // MMA_BC + 1):
                k0 = kt * MMA_BC
                if k0 > wq0 + MMA_ROWS - 1 or k0 + MMA_BC - 1 < wfirst:
                    continue
                seen.add(kt)
                if not k0 < wlast:
                    for i in rows:
                        for j in range(k0, min(k0 + MMA_BC, i + 1)):
                            assert kept(row, i, j), ("mma fwd tile unmasked", i, j)
            for i in rows:
                for j in range(0, i + 1):
                    if kept(row, i, j):
                        assert j // MMA_BC in seen, ("mma fwd skipped a kept pair", i, j)


def dkv_written(row, T):
    """the dS fragments (Q, kt, kk, qm) the dK/dV pass writes, and its coverage"""
    written = set()
    for kt in range((T + BK - 1) // BK):
        k0 = kt * BK
        q_end = query_end(row, T, k0 + BK - 1)
        nqt = (q_end - k0 + BQ - 1) // BQ
        steps = [k0 + s * BQ for s in range(nqt)]
        for q0 in steps:
            lo = [first_key(row, q) if q < T else T for q in range(q0, q0 + BQ)]
            for kr in range(k0, k0 + BK):  # attention.cu's per-key-row cut of the step
                assert step_cut(lo, kr) == sum(1 for v in lo if v <= kr), ("cut", kr, q0)
            per = SLICE // FRAG  # key blocks per slice
            for kw in range(BK // SLICE):  # the slices (attention.cu; the Hopper warpgroups agree)
                klo = k0 + SLICE * kw
                if klo <= q0 + BQ - 1:
                    for kk in range(per * kw, per * kw + per):
                        for qm in range(BQ // FRAG):
                            written.add((q0 // BQ, kt, kk, qm))
                if not klo < lo[BQ - 1]:  # the document flag off: nothing to drop
                    for kr in range(klo, min(klo + SLICE, T)):
                        for q in range(q0, min(q0 + BQ, T)):
                            assert not (kr <= q and not kept(row, q, kr)), ("dkv unmasked", kr, q)
        for j in range(k0, min(k0 + BK, T)):
            for i in range(j, T):
                if kept(row, i, j):
                    assert any(q0 <= i < q0 + BQ for q0 in steps), ("dkv skipped", i, j)
    return written


def dq_reads_wgmma(row, T, both_from_block=False):
    reads = set()
    nq64 = (T + BQ - 1) // BQ
    for qt in range((T + 127) // 128):
        q0 = 2 * qt * BQ
        kb = first_key(row, q0) // BK
        for wl in range(2):
            Q = 2 * qt + wl
            if Q >= nq64:
                continue
            kw = kb if both_from_block else first_key(row, Q * BQ) // BK
            for kt in range(kb, qt + 1):
                if kt < kw:
                    continue
                nk = 4 if kt == qt and Q % 2 == 0 else 8
                for kk in range(nk):
                    for w in range(4):
                        reads.add((Q, kt, kk, w))
    return reads


def dq_reads_mma(row, T):
    reads = set()
    nq64 = (T + BQ - 1) // BQ
    for qt in range((T + DQ_BR - 1) // DQ_BR):
        q0 = qt * DQ_BR
        nsteps = min(2 * qt + 2, (T + DQ_BC - 1) // DQ_BC)
        s0 = 2 * (first_key(row, q0) // BK)
        for w in range(DQ_WARPS):
            wq0 = q0 + (DQ_BR // DQ_WARPS) * w
            if wq0 >= T:
                continue
            Q = 2 * qt + (w >> 1)
            assert Q < nq64
            ws0 = 2 * (first_key(row, q0 + (w >> 1) * BQ) // BK)
            for s in range(s0, nsteps):
                if s < ws0:
                    continue
                k1 = s * DQ_BC
                for kkl in range(4):
                    if k1 + 16 * kkl > wq0 + 31:
                        break
                    for mt in range(2):
                        reads.add((Q, s >> 1, 4 * (s & 1) + kkl, 2 * (w & 1) + mt))
    return reads


def covers(reads, row, T):
    """every kept pair (query i, key j) lies in a fragment read for i's rows"""
    have = {}
    for (Q, kt, kk, qm) in reads:
        have.setdefault((Q, qm), set()).add(kt * 8 + kk)
    for i in range(T):
        blocks = have.get((i // BQ, (i % BQ) // 16), set())
        for j in range(i + 1):
            if kept(row, i, j):
                assert j // 16 in blocks, ("dq skipped a kept pair", i, j)


def check_layout(row, T):
    for k in range(-1, T + 1):
        assert query_end(row, T, k) == query_end_scan(row, T, k), ("search", T, k)
    check_forward(row, T)
    written = dkv_written(row, T)
    for reads in (dq_reads_wgmma(row, T), dq_reads_mma(row, T)):
        missing = reads - written
        assert not missing, ("dq reads an unwritten fragment", sorted(missing)[:4])
        covers(reads, row, T)


def main():
    rnd = random.Random(20251201)
    n = 0
    kinds = [("one", 1), ("short", 2), ("random", 40), ("random", 150), ("last", 100),
             ("fixed", 64), ("fixed", 128), ("random", 300)]
    for T in (1, 2, 63, 64, 65, 127, 128, 129, 130, 200, 257, 300, 520):
        for kind, maxlen in kinds:
            check_layout(layout(T, kind, maxlen, rnd), T)
            n += 1
    for _ in range(3):
        T = 1000
        check_layout(layout(T, "random", 300, rnd), T)
        n += 1
    print(f"doc mask: {n} layouts: search exact, every kept pair visited, unmasked tiles clean, "
          "dQ reads only written fragments and covers its rows")
    # all zeros: the causal ranges
    for T in (1, 129, 1000):
        row = [0] * T
        assert all(query_end(row, T, k) == T for k in range(T))
    # negative cases
    row = layout(520, "random", 40, rnd)
    missing = dq_reads_wgmma(row, 520, both_from_block=True) - dkv_written(row, 520)
    assert missing, "negative case (dQ from the block's first tile) not caught"
    caught = False
    for T in (300, 520, 1000):
        row = layout(T, "random", 30, rnd)
        caught |= any(query_end(row, T, k, early=True) != query_end_scan(row, T, k) for k in range(T))
    assert caught, "negative case (early search) not caught"
    print("negative: dQ reading from its block's first tile and a truncated search are caught")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
