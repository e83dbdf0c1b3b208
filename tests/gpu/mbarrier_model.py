"""A CPU model of one Hopper mbarrier (arrival count, transaction bytes, phase parity), for
the protocol models of the warp-specialised attention kernels (attn_bwd_ws_model.py)."""


class Mbar:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, n=1, expect_tx=0):  # mbarrier.arrive(.expect_tx)
        assert self.pending >= n, "more arrivals than the phase's count"
        self.tx += expect_tx
        self.pending -= n
        self._maybe_complete()

    def expect_tx(self, b):  # mbarrier.expect_tx: bytes, no arrival
        self.tx += b

    def complete_tx(self, b):  # a copy's bytes landing
        self.tx -= b
        assert self.tx >= 0, "tx underflow"
        self._maybe_complete()

    def done(self, parity):  # try_wait.parity
        return (self.phase & 1) != parity
