#!/usr/bin/env python3
"""CPU model of attn_bwd_dq_ws's index math and mbarrier protocol
(kernels/cuda/attention_bwd_sm90.cu, dQ variants 3-5), for checking by reading what
cannot run here (no GPU in the session that wrote it).

1. Index math, per block (head, 128-query tile qt) and T (every T in 1..4096), GQA 1/2/4:
   - the consumer's op sequence (a literal transcription of the kernel's run(): loads,
     issues, waits, K releases; OV and !OV, nlast 4 and 8) issues exactly the products of
     attn_bwd_dq_wgmma<HD, 2, 2>: key tiles 0..qt in order, 8 k-steps each, 4 on the
     diagonal tile of an even Q (s == qt, Q = 2qt: warpgroup 0), nothing for a warpgroup
     without queries (Q >= nq64);
   - step s's fragments are loaded before step s's issue, and each A register set is
     rewritten only after the wait that covers the group reading it;
   - the producers' copies: K rows s·128.. of kv head h / (nh / nkv) (TMA, rows past T
     zero-filled, as load_tile), dS at (ds_tile_base(Q) + s)·DS_TILE, the tiles and
     addresses variant 0 copies from, the bytes copied cover every fragment the consumer
     reads, and lie inside what the dK/dV pass wrote (attn_bwd_dkv_ws's store rule) and
     inside the head's ds_head tiles; expect_tx equals the bytes copied;
   - the queries stored are q0 + 64·wl + r < T, as variant 0.
2. Protocol: the K producer (lane 0 of warp 8), the dS producer (lane 0 of warp 9) and the
   consumer warps (each of the 4·nwg warps its own agent; a warpgroup's wgmma group is
   complete only after all 4 warps issued it, in order, at a random later time; a warp's
   wait<N> returns once at most N of the groups it issued are incomplete) under random
   interleavings with the PTX mbarrier semantics (phase parity, arrival counts,
   arrive.expect_tx, complete_tx when a copy lands, at a random later time). Checked: no
   deadlock; a K slot is never written (TMA issue or landing) while a wgmma group that
   reads it may run, nor a dS slot while a warp still has to load the step it holds;
   every load and every wgmma group (at issue and at completion) sees its own step's
   data; the dq staging (the warpgroup's own dS tile of the last step's dS slot, after
   the named barrier) overlaps no pending copy and no later copy, and no warp of the
   warpgroup still has loads to do; every phase complete at the end.
   Rings NK 3 / ND 4, 3 / 2, and also 2 / 2; OV and !OV; nwg 1 and 2; nsteps 1-9.
3. Negative cases (the model must catch them): K released by warpgroup 0 right after
   each issue (before the wait), one warp releasing dS before its loads, dq staged in
   the last step's K slot (as attn_bwd_dq_wgmma stages in a K tile: here the other
   warpgroup's wgmma may still read it).
   (Staging without the named barrier is not caught: under the model's assumption that a
   group completes only after all 4 warps issued it, a warp past its last wait knows the
   other warps loaded their fragments; the kernel keeps the barrier because PTX does not
   spell that out.)
Run: python3 tests/gpu/attn_bwd_dq_ws_model.py  (exit status 0: all passed)."""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mbarrier_model import Mbar  # noqa: E402

BK, BQ, DS_TILE, DS_FRAG = 128, 64, 128 * 64, 256
TILE_BYTES = DS_TILE * 2


def ds_tile_base(Q):
    m = Q >> 1
    return (m + 1) * (m + 1) if Q & 1 else m * (m + 1)


def consumer_ops(nsteps, OV, nlast):
    """the kernel's run(nlast), op for op"""
    ops = []
    load = lambda a, s, n: ops.append(("load", a, s, n))
    issue = lambda a, s, n: ops.append(("issue", a, s, n))
    wait = lambda n: ops.append(("wait", n))
    relk = lambda s, pred: ops.append(("relk", s, pred))
    if OV:
        if nsteps == 1:
            load(0, 0, nlast)
            issue(0, 0, nlast)
        else:
            load(0, 0, 8)
            s = 0
            while True:
                issue(0, s, 8)
                wait(1)
                relk(s - 1, s > 0)
                if s + 2 == nsteps:
                    load(1, s + 1, nlast)
                    issue(1, s + 1, nlast)
                    break
                load(1, s + 1, 8)
                issue(1, s + 1, 8)
                wait(1)
                relk(s, True)
                if s + 3 == nsteps:
                    load(0, s + 2, nlast)
                    issue(0, s + 2, nlast)
                    break
                load(0, s + 2, 8)
                s += 2
    else:
        for s in range(nsteps - 1):
            load(0, s, 8)
            issue(0, s, 8)
            wait(0)
            relk(s, True)
        load(0, nsteps - 1, nlast)
        issue(0, nsteps - 1, nlast)
    wait(0)
    return ops


def v0_products(qt, wl, nq64):
    """attn_bwd_dq_wgmma<HD, 2, 2>: (key tile, k-steps) in order for warpgroup wl"""
    Q = 2 * qt + wl
    if Q >= nq64:
        return []
    return [(s, 4 if (s == qt and (Q & 1) == 0) else 8) for s in range(qt + 1)]


def v0_copies(qt, nq64, T):
    """variant 0's issue(s): (s, K rows, [(tile index, bytes)])"""
    out = []
    for s in range(qt + 1):
        tiles = []
        for qh in range(2):
            Q = 2 * qt + qh
            if Q >= nq64:
                break
            tiles.append((ds_tile_base(Q) + s, TILE_BYTES))
        out.append((s, [r if r < T else None for r in range(s * BK, s * BK + BK)], tiles))
    return out


def ws_copies(qt, nq64, T):
    """the producers: (s, K rows of the TMA box (zeros past T), [(tile index, bytes)]), expect_tx"""
    nwg = 2 if 2 * qt + 1 < nq64 else 1
    out = []
    for s in range(qt + 1):
        n0 = DS_TILE if s == qt else 2 * DS_TILE
        n1 = 2 * DS_TILE
        tiles = [(ds_tile_base(2 * qt) + s, n0)]
        if nwg == 2:
            tiles.append((ds_tile_base(2 * qt + 1) + s, n1))
        expect = n0 + n1 if nwg == 2 else n0
        assert expect == sum(b for _, b in tiles)
        out.append((s, [r if r < T else None for r in range(s * BK, s * BK + BK)], tiles))
    return out, nwg


def dkv_written_bytes(Q, kt, nq64):
    """bytes of dS tile (Q, kt) attn_bwd_dkv_ws stores: warpgroup wk's fragments
    (4wk + w)·4 + qm, i.e. bytes [wk·8 KiB, wk·8 KiB + 8 KiB), when its first key
    kt·128 + 64·wk <= the step's last query Q·64 + 63 (and the step exists: Q < nq64)"""
    if Q >= nq64 or Q * BQ < kt * BK:
        return 0
    hi = 0
    for wk in range(2):
        if kt * BK + 64 * wk <= Q * BQ + BQ - 1:
            hi = (wk + 1) * DS_TILE  # bytes: 8 KiB per warpgroup half
    return hi


def check_index_math():
    nblk = 0
    for T in range(1, 4097):
        nq64 = (T + BQ - 1) // BQ
        ds_head = ds_tile_base(nq64)
        ny = (T + BK - 1) // BK
        for by in range(ny):
            qt = ny - 1 - by
            q0 = 2 * qt * BQ
            assert q0 < T and qt * BK <= q0
            ref = v0_copies(qt, nq64, T)
            got, nwg = ws_copies(qt, nq64, T)
            assert [(s, rows) for s, rows, _ in ref] == [(s, rows) for s, rows, _ in got]
            for (s, _, rt), (_, _, gt) in zip(ref, got):
                assert [i for i, _ in rt] == [i for i, _ in gt], (T, qt, s)  # same tiles
                for qh, (i, b) in enumerate(gt):
                    Q = 2 * qt + qh
                    assert 0 <= i < ds_head and s <= Q >> 1
                    assert i == ds_tile_base(Q) + s
                    assert b <= dkv_written_bytes(Q, s, nq64), (T, qt, s, qh, b)
            for wl in range(2):
                prods = v0_products(qt, wl, nq64)
                active = wl < nwg
                assert active == bool(prods)
                if not active:
                    continue
                nlast = 4 if wl == 0 else 8
                for OV in (True, False):
                    if T > 600 and not OV:
                        continue  # the !OV sequence is trivial; spare the time
                    ops = consumer_ops(qt + 1, OV, nlast)
                    issued = [(o[2], o[3]) for o in ops if o[0] == "issue"]
                    assert issued == prods, (T, qt, wl, OV)
                    # loads before issues, same step and count; A sets rewritten only
                    # after the group reading them was waited for
                    pending = []  # (a set, step) of groups possibly incomplete, oldest first
                    loaded = {}
                    for o in ops:
                        if o[0] == "load":
                            _, a, s, n = o
                            assert all(p[0] != a for p in pending), ("A set rewritten in flight", T, qt, wl)
                            loaded[a] = (s, n)
                            # the fragments read lie inside the bytes copied
                            assert 4 * n * DS_FRAG * 2 <= got[s][2][wl][1]
                        elif o[0] == "issue":
                            _, a, s, n = o
                            assert loaded.get(a) == (s, n)
                            pending.append((a, s))
                        elif o[0] == "wait":
                            while len(pending) > o[1]:
                                pending.pop(0)
                        elif o[0] == "relk" and o[2]:
                            assert all(p[1] != o[1] for p in pending), "K released in flight"
                    assert not pending
                stored = [q0 + 64 * wl + r for r in range(64) if r < T - q0 - 64 * wl]
                assert stored == [q for q in range(q0 + 64 * wl, q0 + 64 * wl + 64) if q < T]
            nblk += 1
    # GQA: the K columns (kv head of query head h) and the dS head offset
    for nh, nkv in ((8, 8), (8, 4), (8, 2), (32, 8)):
        for h in range(nh):
            kvh = h // (nh // nkv)
            assert kvh == h * nkv // nh  # query heads h..: group-major, as the forward
            for HD in (64, 128):
                cols = [(nh + kvh) * HD + 64 * p + c for p in range(HD // 64) for c in range(64)]
                assert cols == [(nh + kvh) * HD + c for c in range(HD)]
    print(f"index math: {nblk} (T in 1..4096, query tile) blocks: products, copies and stores "
          "match attn_bwd_dq_wgmma<HD, 2, 2>; GQA 1/2/4 K columns")


BUG = None  # None, "relk_early", "reld_early", "stage_in_k"


def run_protocol(nsteps, nwg, NK, ND, OV, seed):
    rnd = random.Random(seed)
    kfull = [Mbar(1) for _ in range(NK)]
    kempty = [Mbar(4 * nwg) for _ in range(NK)]
    dfull = [Mbar(1) for _ in range(ND)]
    dempty = [Mbar(4 * nwg) for _ in range(ND)]
    kslot = [None] * NK            # the step whose K rows the slot holds (landed)
    dslot = [None] * ND            # the step whose dS tiles the slot holds (landed)
    pending = []                   # copies in flight: (ring, slot, step, bytes)
    d_readers = [set() for _ in range(ND)]  # warps that still have to load the slot's step
    staged = [set() for _ in range(ND)]     # warpgroups staging dq in the slot
    loads_left = {}                # warp -> loads still to do
    groups = [[] for _ in range(nwg)]       # per warpgroup: [step, K slot, issuers, complete]
    bar_count = [0] * nwg

    def k_in_use(slot):
        return any(g[1] == slot and not g[3] for wg in range(nwg) for g in groups[wg])

    def producer_k():
        for s in range(nsteps):
            slot, u = s % NK, s // NK
            if u > 0:
                while not kempty[slot].done((u - 1) & 1):
                    yield
            assert not k_in_use(slot), f"K slot {slot} rewritten while a wgmma group reads it"
            kfull[slot].arrive(1, expect_tx=2)
            kslot[slot] = ("writing", s)
            pending.append(("k", slot, s, 1))
            pending.append(("k", slot, s, 1))  # one TMA box per 64-column panel
            yield

    def producer_d():
        for s in range(nsteps):
            slot, u = s % ND, s // ND
            if u > 0:
                while not dempty[slot].done((u - 1) & 1):
                    yield
            assert not d_readers[slot], f"dS slot {slot} rewritten before warps {d_readers[slot]} loaded"
            assert not staged[slot], "dS slot rewritten while dq is staged in it"
            n = nwg  # one bulk copy per active warpgroup
            dfull[slot].arrive(1, expect_tx=n)
            dslot[slot] = ("writing", s)
            d_readers[slot] = {(wg, w) for wg in range(nwg) for w in range(4)}
            for _ in range(n):
                pending.append(("d", slot, s, 1))
            yield

    def consumer(wg, w):
        nlast = 4 if wg == 0 else 8
        me = (wg, w)
        my_groups = []  # indices into groups[wg] of the groups this warp issued
        loads_left[me] = nsteps
        for op in consumer_ops(nsteps, OV, nlast):
            kind = op[0]
            if kind == "load":
                _, a, s, n = op
                slot = s % ND
                while not dfull[slot].done((s // ND) & 1):
                    yield
                if BUG == "reld_early" and wg == 0 and w == 0:
                    d_readers[slot].discard(me)
                    dempty[slot].arrive(1)  # released first ...
                    yield
                    assert dslot[slot] == s, f"warp {me} loads step {s} from a slot holding {dslot[slot]}"
                    loads_left[me] -= 1
                    yield
                    continue
                assert dslot[slot] == s, f"warp {me} loads step {s} from a slot holding {dslot[slot]}"
                loads_left[me] -= 1
                yield
                d_readers[slot].discard(me)   # __syncwarp; lane 0 arrives
                dempty[slot].arrive(1)
                yield
            elif kind == "issue":
                _, a, s, n = op
                slot = s % NK
                while not kfull[slot].done((s // NK) & 1):
                    yield
                assert kslot[slot] == s, f"wgmma of step {s} reads a K slot holding {kslot[slot]}"
                gl = groups[wg]
                idx = len(my_groups)
                if idx == len(gl):
                    gl.append([s, slot, set(), False])
                g = gl[idx]
                assert g[0] == s
                g[2].add(w)
                my_groups.append(idx)
                if BUG == "relk_early" and wg == 0:  # the whole warpgroup
                    kempty[slot].arrive(1)
                yield
            elif kind == "wait":
                while sum(1 for i in my_groups if not groups[wg][i][3]) > op[1]:
                    yield
            elif kind == "relk":
                _, s, pred = op
                if pred and not (BUG == "relk_early" and wg == 0):
                    kempty[s % NK].arrive(1)
                yield
        # epilogue: named barrier of the warpgroup, then the staging writes
        bar_count[wg] += 1
        while bar_count[wg] < 4:
            yield
        if BUG == "stage_in_k":  # the K slot of the last step: read by both warpgroups
            slot = (nsteps - 1) % NK
            assert not any(g[1] == slot and not g[3] for g in groups[1 - wg]) if nwg == 2 else True, \
                "staging dq in a K slot the other warpgroup's wgmma still reads"
            yield
            return
        slot = (nsteps - 1) % ND
        assert all(loads_left[(wg, x)] == 0 for x in range(4) if (wg, x) in loads_left) and \
            len([x for x in range(4) if (wg, x) in loads_left]) == 4, \
            "staging while a warp of the warpgroup still loads fragments"
        assert not any(p[0] == "d" and p[1] == slot for p in pending), "staging over a pending copy"
        staged[slot].add(wg)
        yield

    agents = [producer_k(), producer_d()] + [consumer(wg, w) for wg in range(nwg) for w in range(4)]
    alive = [True] * len(agents)
    guard = 0
    while any(alive) or pending or any(not g[3] for gl in groups for g in gl):
        guard += 1
        assert guard < 10**6, "deadlock"
        choices = [i for i in range(len(agents)) if alive[i]]
        if pending:
            choices.append("copy")
        # a group completes only after all 4 warps issued it, oldest first
        for wg in range(nwg):
            for g in groups[wg]:
                if not g[3]:
                    if len(g[2]) == 4:
                        choices.append(("wgmma", wg))
                    break
        c = rnd.choice(choices)
        if c == "copy":
            ring, slot, s, b = pending.pop(rnd.randrange(len(pending)))
            if ring == "k":
                assert not k_in_use(slot) or kslot[slot] == ("writing", s), "K landing in use"
                if not any(p[0] == "k" and p[1] == slot for p in pending):
                    kslot[slot] = s
                kfull[slot].complete_tx(b)
            else:
                assert not staged[slot], "copy landing on staged dq"
                if not any(p[0] == "d" and p[1] == slot for p in pending):
                    dslot[slot] = s
                dfull[slot].complete_tx(b)
        elif isinstance(c, tuple):
            wg = c[1]
            g = next(g for g in groups[wg] if not g[3])
            assert kslot[g[1]] == g[0], f"K slot {g[1]} changed under the wgmma of step {g[0]}"
            g[3] = True
        else:
            try:
                next(agents[c])
            except StopIteration:
                alive[c] = False
    for m in kfull + kempty + dfull + dempty:
        assert m.tx == 0, "tx left pending"
    for m in kfull + dfull:
        assert m.pending == m.count, "full phase left incomplete"
    # every group issued and completed, every warp loaded every step
    for wg in range(nwg):
        assert len(groups[wg]) == nsteps and all(g[3] for g in groups[wg])
    assert all(v == 0 for v in loads_left.values())


def check_protocol():
    n = 0
    for NK, ND in ((3, 4), (3, 2), (2, 2)):
        for OV in (True, False):
            for nsteps in range(1, 10):
                for nwg in (1, 2):
                    for seed in range(12):
                        run_protocol(nsteps, nwg, NK, ND, OV, seed * 7919 + nsteps * 31 + nwg)
                        n += 1
    print(f"protocol: {n} random interleavings (rings 3/4, 3/2, 2/2; OV and not; nsteps 1-9; "
          "nwg 1, 2): no deadlock, no slot rewritten in use, every read sees its step")


def check_negative():
    global BUG
    for bug, args in (("relk_early", (6, 2, 2, 2, True)), ("reld_early", (6, 2, 3, 2, True)),
                      ("stage_in_k", (3, 2, 3, 4, True))):
        BUG = bug
        tripped = 0
        for seed in range(300):
            try:
                run_protocol(*args, seed)
            except AssertionError:
                tripped += 1
        BUG = None
        assert tripped > 0, f"negative check {bug} did not trip"
        print(f"negative: {bug} caught in {tripped}/300 interleavings")


if __name__ == "__main__":
    check_index_math()
    check_protocol()
    check_negative()
    print("PASS")
    sys.exit(0)
