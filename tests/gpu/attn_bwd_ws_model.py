#!/usr/bin/env python3
"""CPU model of attn_bwd_dkv_ws's index math and mbarrier protocol
(kernels/cuda/attention_bwd_sm90.cu), run by `make check` (tests/kernel_models.sh).

1. Index math, per block (kv head, key tile kt) and T, group: the steps the producer
   loads (head, q0, TMA row coordinates, lse/D rows and their +inf/0 past T) equal the
   steps attention.cu's attn_bwd_dkv_kernel (the fallback, whose dS layout both dQ kernels
   read) visits, and the dS fragments each warpgroup stores on each step equal the ones
   that kernel's 32-key slices store.
2. Protocol: the producer warp and the two consumer warpgroups (each its 4 warps' arrivals
   as one agent: the wgmma of a warpgroup keep its warps within a step of each other, and
   no warp can pass the full barrier of step j + NS before all 8 warps released step j)
   run under random interleavings with the PTX mbarrier semantics (phase parity,
   try_wait.parity(P) true once the phase of parity P completed, arrival count,
   expect_tx (lane 0, no arrival) before the TMA, complete_tx at a random later time, then
   the lanes' lse/D stores and their 32 arrivals). Checked: no
   deadlock; a slot is never rewritten (lse/D stores or TMA bytes) while a warpgroup
   still uses the step it held; every consumer reads the step it expects; every empty
   phase gets exactly 8 arrivals; nothing is left pending at the end. The kernel's
   schedule (FA3's order: step j's slot released at the top of step j + 1 when both are
   the warpgroup's), with the kernel's NS slots.
3. A negative case the model must catch (releasing skipped steps without their wait).
Tile sizes, warpgroups, slots and the barriers' arrival counts are read from the two .cu
files (tests/gpu/cu_constants.py), so a change there changes what is checked here.
Run: python3 tests/gpu/attn_bwd_ws_model.py  (exit status 0: all passed)."""
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cu_constants import constants, mbar_counts  # noqa: E402
from mbarrier_model import Mbar  # noqa: E402

WS = constants("attention_bwd_sm90.cu")  # attn_bwd_dkv_ws
KV = constants("attention.cu")           # attn_bwd_dkv_kernel, the fallback
BARS = mbar_counts("attention_bwd_sm90.cu")  # arrival counts: kv_full, full, empty
BK, BQ = WS["BK"], WS["BQ"]  # keys per dS tile, queries per step
NS = WS["cfg::NS"]           # ring slots
N_WG = WS["DKV_WS_THREADS"] // WS["WG_THREADS"] - 1  # consumer warpgroups (one producer)
WG_KEYS = BK // N_WG         # keys per consumer warpgroup
WG_WARPS = WS["WG_THREADS"] // 32
KV_BK, KV_BQ = KV["KV_BK"], KV["KV_BQ"]
KV_SLICE = KV_BK // KV["KV_NS"]  # keys per warp pair of the fallback
FRAG = math.isqrt(WS["DS_FRAG"])  # a dS fragment is FRAG x FRAG in both kernels
assert FRAG * FRAG == WS["DS_FRAG"] == KV["DS_FRAG"], "the kernels disagree on the dS fragment"
assert N_WG == 2, "the protocol below models two consumer warpgroups"


def ws_steps(kt, T, group, kvh):
    """the producer's loop: (slot-independent) per step: head, q0, lse rows"""
    k0 = kt * BK
    nqt = (T - k0 + BQ - 1) // BQ
    out = []
    hi = qs = 0
    for s in range(group * nqt):
        h, q0 = kvh * group + hi, k0 + qs * BQ
        lse_rows = [(q0 + e) if q0 + e < T else None for e in range(BQ)]
        out.append((h, q0, q0, lse_rows))  # TMA row coordinate = q0 (rows >= T: zeros)
        qs += 1
        if qs == nqt:
            qs, hi = 0, hi + 1
    return out


def ref_steps(kt, T, group, kvh):
    """attention.cu's attn_bwd_dkv_kernel: nqt = (T - k0 + KV_BQ - 1) / KV_BQ, step s:
    head kvh·group + s / nqt, queries k0 + (s % nqt)·KV_BQ"""
    k0 = kt * KV_BK
    nqt = (T - k0 + KV_BQ - 1) // KV_BQ
    out = []
    for s in range(group * nqt):
        h, q0 = kvh * group + s // nqt, k0 + (s % nqt) * KV_BQ
        lse_rows = [(q0 + e) if q0 + e < T else None for e in range(KV_BQ)]
        out.append((h, q0, q0, lse_rows))
    return out


def ref_fragments(k0, q0):
    """the dS fragments kk·(KV_BQ/FRAG) + qm attn_bwd_dkv_kernel stores on a step: the
    KV_SLICE-key slice kw (keys k0 + KV_SLICE·kw..) stores its key blocks kk when
    k0 + KV_SLICE·kw <= q0 + KV_BQ - 1"""
    per = KV_SLICE // FRAG
    return {kk * (KV_BQ // FRAG) + qm for kw in range(KV_BK // KV_SLICE)
            if k0 + KV_SLICE * kw <= q0 + KV_BQ - 1
            for kk in range(per * kw, per * kw + per) for qm in range(KV_BQ // FRAG)}


def ws_fragments(k0, q0):
    """attn_bwd_dkv_ws: warpgroup wl (keys k0 + WG_KEYS·wl..) stores when
    k0 + WG_KEYS·wl <= q0 + BQ - 1; its warp w holds key block kk = WG_WARPS·wl + w"""
    return {(WG_WARPS * wl + w) * (BQ // FRAG) + qm for wl in range(N_WG)
            if k0 + WG_KEYS * wl <= q0 + BQ - 1
            for w in range(WG_WARPS) for qm in range(BQ // FRAG)}


def check_index_math():
    n = 0
    for T in (1, 63, 64, 65, 127, 128, 129, 130, 256, 1000, 4096):
        for group in (1, 2, 4):
            for kvh in (0, 3):
                for kt in range((T + BK - 1) // BK):
                    a, b = ws_steps(kt, T, group, kvh), ref_steps(kt, T, group, kvh)
                    assert a == b, (T, group, kt)
                    assert len(a) >= 1  # nsteps >= 1: the consumer loop's for (;;)
                    k0 = kt * BK
                    for (h, q0, _, _) in a:
                        assert ws_fragments(k0, q0) == ref_fragments(k0, q0), (T, kt, q0)
                        # a warpgroup that skips: all its keys after all the step's queries
                        for wl in range(N_WG):
                            if k0 + WG_KEYS * wl > q0 + BQ - 1:
                                assert wl == 1 and q0 == k0
                    n += 1
    print(f"index math: {n} (T, group, kv head, key tile) blocks match attn_bwd_dkv_kernel")


def run_protocol(nqt, group, NS, seed):
    nsteps = nqt * group
    rnd = random.Random(seed)
    kv_full = Mbar(BARS["kv_full"])
    full = [Mbar(BARS["full"]) for _ in range(NS)]       # the producer warp's lanes
    empty = [Mbar(BARS["empty"]) for _ in range(NS)]     # the consumers' warps
    slot_step = [None] * NS     # what the slot holds (lse/D written, TMA landed)
    slot_tma_pending = [None] * NS
    in_use = [dict() for _ in range(2)]  # wg -> {slot: step}
    pending_tma = []  # (slot, step, bytes)

    def producer():
        # TMA K, V
        kv_full.arrive(1, expect_tx=2)
        pending_tma.append(("kv", None, 2))
        yield
        for s in range(nsteps):
            slot, u = s % NS, s // NS
            if u > 0:
                while not empty[slot].done((u - 1) & 1):
                    yield
            for wg in range(2):
                assert slot not in in_use[wg], f"slot {slot} rewritten while wg {wg} uses step {in_use[wg][slot]}"
            full[slot].expect_tx(2)        # lane 0: mbarrier.expect_tx, no arrival
            slot_tma_pending[slot] = s     # lane 0: the two TMA loads (Q, dO)
            pending_tma.append((slot, s, 1))
            pending_tma.append((slot, s, 1))
            yield
            slot_step[slot] = ("lse", s)   # the lanes' lse/D stores
            yield
            full[slot].arrive(32)          # every lane, after its stores (release)
            yield

    def consumer(wg):
        # the kernel's consumer loop, step for step (hi/qs folded into active())
        def active(st):  # the skip rule: warpgroup 1 skips each head's first step
            return not (wg == 1 and st % nqt == 0)

        while not kv_full.done(0):
            yield

        def slot_ready(st):
            while not full[st % NS].done((st // NS) & 1):
                yield
            # the data must be this step's
            assert slot_step[st % NS] == ("lse", st) and slot_tma_pending[st % NS] is None, \
                (wg, st, slot_step[st % NS])
            in_use[wg][st % NS] = st

        def release(st):
            assert in_use[wg].get(st % NS) == st
            del in_use[wg][st % NS]
            empty[st % NS].arrive(WG_WARPS)  # lane 0 of each of this warpgroup's warps

        state = {"step": 0}

        def skip_steps():
            while state["step"] < nsteps and not active(state["step"]):
                yield from slot_ready(state["step"])
                release(state["step"])
                state["step"] += 1
                yield

        if BUGGY_SKIP and wg == 1:  # the hazard: release skipped steps without the wait
            for st in range(nsteps):
                if not active(st):
                    empty[st % NS].arrive(WG_WARPS)
                else:
                    yield from slot_ready(st)
                    yield
                    release(st)
                yield
            return
        carried = False
        yield from skip_steps()
        if state["step"] == nsteps:
            return
        yield from slot_ready(state["step"])
        while True:
            step = state["step"]
            assert active(step)
            yield
            if carried:
                release(step - 1)
            yield  # exp, dV, dS, dK ...
            assert in_use[wg].get(step % NS) == step
            if step + 1 < nsteps and active(step + 1):
                yield from slot_ready(step + 1)
                state["step"] = step + 1
                carried = True
                continue
            release(step)
            carried = False
            state["step"] = step + 1
            yield from skip_steps()
            if state["step"] == nsteps:
                break
            yield from slot_ready(state["step"])

    agents = [producer(), consumer(0), consumer(1)]
    alive = [True] * 3
    guard = 0
    while any(alive) or pending_tma:
        guard += 1
        assert guard < 10**6, "deadlock"
        choices = [i for i in range(3) if alive[i]] + (["tma"] if pending_tma else [])
        c = rnd.choice(choices)
        if c == "tma":
            i = rnd.randrange(len(pending_tma))
            slot, s, b = pending_tma.pop(i)
            if slot == "kv":
                kv_full.complete_tx(b)
            else:
                if not any(p[0] == slot and p[1] == s for p in pending_tma):
                    slot_tma_pending[slot] = None
                full[slot].complete_tx(b)
        else:
            try:
                next(agents[c])
            except StopIteration:
                alive[c] = False
    for m in [kv_full] + full + empty:
        assert m.pending == m.count and m.tx == 0, "left pending"
    assert not in_use[0] and not in_use[1]


def check_protocol():
    n = 0
    for nqt in (1, 2, 3, 5, 8):
        for group in (1, 2, 4):
            for seed in range(40):
                run_protocol(nqt, group, NS, seed * 1000 + nqt * 10 + group)
                n += 1
    print(f"protocol: {n} random interleavings (NS {NS}, nqt 1-8, GQA 1/2/4; warpgroup 1 "
          "skips each head's first step): no deadlock, no slot rewritten in use, every phase complete")


def check_negative():
    """the model catches the hazard the first (skipping) design had: warpgroup 1 releasing
    the steps it skips without waiting for their full phase (with nqt = 1 it skips every
    step), so its arrivals complete empty phases early and the producer rewrites a slot
    that warpgroup 0 still uses"""
    global BUGGY_SKIP
    BUGGY_SKIP = True
    tripped = 0
    for seed in range(200):
        try:
            run_protocol(1, 4, NS, seed)
        except AssertionError:
            tripped += 1
    BUGGY_SKIP = False
    assert tripped > 0, "negative check did not trip"
    print(f"negative: releases without the full wait caught in {tripped}/200 interleavings")


BUGGY_SKIP = False


if __name__ == "__main__":
    check_index_math()
    check_protocol()
    check_negative()
    print("PASS")
    sys.exit(0)
