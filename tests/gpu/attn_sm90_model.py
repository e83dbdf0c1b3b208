"""CPU model of one block of attn_fwd_wgmma (kernels/cuda/attention_sm90.cu), step by step.

    python3 tests/gpu/attn_sm90_model.py        (numpy; a few seconds; prints PASS or FAIL)

What it checks: the kernel's own index math -- the swizzled tile copies, the descriptor
start addresses, LBO and SBO, the k-step offsets, the K/V double-buffer indices of both
pipelines, the diagonal mask, the online softmax, the S -> P register conversion and the
O staging -- against a float64 reference. wgmma is modelled independently of the kernel's
storage formulas, from the PTX ISA: descriptor fields, the canonical K-major and MN-major
128-byte-swizzle layouts (Swizzle<3,4,3> on byte addresses) and the m64nNk16 fragment
figures. cp.async copies are applied either when issued or at the next wait (both must
give the same answer: a read before the wait or a write over a tile still being read
would show). What it cannot check: that the hardware agrees with that reading of the
PTX ISA (the UNVERIFIED points at the top of the kernel). Keep it in step with the kernel:
it transliterates the kernel's loops.
"""
import numpy as np

THREADS, BM, BN, ROW, PANEL = 256, 128, 128, 128, 128 * 128

def bf16_round(x):
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return u

def bf16_to_f32(u):
    return (np.asarray(u, np.uint16).astype(np.uint32) << 16).view(np.float32)

def swz(a):
    return a ^ (((a >> 7) & 7) << 4)

class Smem:
    def __init__(self, n):
        self.b = np.zeros(n // 2, np.uint16)  # bf16 elements, byte address / 2
    def rd(self, addr):  # addr: array of byte addresses (even)
        return self.b[addr // 2]

def decode(d):
    start = (d & 0x3FFF) << 4
    lbo = ((d >> 16) & 0x3FFF) << 4
    sbo = ((d >> 32) & 0x3FFF) << 4
    assert (d >> 62) == 1, "expected 128B swizzle"
    assert ((d >> 49) & 7) == 0
    return start, lbo, sbo

def make_desc(saddr, lbo, sbo):
    return ((saddr & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16) | (((sbo & 0x3FFFF) >> 4) << 32) | (1 << 62)

def desc_add(d, nbytes):
    return d + (nbytes >> 4)

def kmajor(sm, d, rows, k=16):
    """rows x 16 matrix, K-major SW128: ((8,m),(T,2)):((8T,SBO),(1,T)) elements"""
    start, lbo, sbo = decode(d)
    i = np.arange(rows)[:, None]; kk = np.arange(k)[None, :]
    off = (i % 8) * 128 + (i // 8) * sbo + kk * 2
    return bf16_to_f32(sm.rd(swz(start + off)))

def mnmajor(sm, d, n, k=16):
    """16 x n matrix (k, n), MN-major SW128: ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))"""
    start, lbo, sbo = decode(d)
    kk = np.arange(k)[:, None]; nn = np.arange(n)[None, :]
    off = (nn % 64) * 2 + (nn // 64) * lbo + (kk % 8) * 128 + (kk // 8) * sbo
    return bf16_to_f32(sm.rd(swz(start + off)))

# fragment maps for one warpgroup (128 threads)
def acc_rowcol(N):
    i = np.arange(128)[:, None]; r = np.arange(N // 2)[None, :]
    w, lane = i // 32, i % 32
    g, t = lane // 4, lane % 4
    row = 16 * w + g + 8 * ((r >> 1) & 1)
    col = 8 * (r >> 2) + 2 * t + (r & 1)
    return row, col

def areg_rowcol():
    # 4 b32 registers x 2 halves -> (row, k) of the 64x16 A tile
    i = np.arange(128)[:, None, None]; q = np.arange(4)[None, :, None]; e = np.arange(2)[None, None, :]
    w, lane = i // 32, i % 32
    g, t = lane // 4, lane % 4
    row = 16 * w + g + 8 * (q & 1)
    k = 2 * t + e + 8 * (q >> 1)
    return row, k

def wgmma_ss(sm, D, da, db, scale_d, N=128):
    A = kmajor(sm, da, 64)            # 64 x 16
    B = kmajor(sm, db, N).T           # (n rows, 16 k) K-major -> 16 x N
    C = A.astype(np.float64) @ B.astype(np.float64)
    row, col = acc_rowcol(N)
    res = C[row, col].astype(np.float32)
    return res + (D if scale_d else 0)

def wgmma_rs_t(sm, D, P4, db, N):
    # P4: (128, 4) uint32 = bf16 pairs (lo = lower k)
    row, k = areg_rowcol()
    lo = (P4 & 0xFFFF).astype(np.uint16); hi = (P4 >> 16).astype(np.uint16)
    vals = np.stack([bf16_to_f32(lo), bf16_to_f32(hi)], axis=-1)  # (128,4,2)
    A = np.zeros((64, 16), np.float32)
    A[row, k] = vals
    B = mnmajor(sm, db, N)            # 16 x N
    C = A.astype(np.float64) @ B.astype(np.float64)
    r2, c2 = acc_rowcol(N)
    return D + C[r2, c2].astype(np.float32)

def shfl_xor(x, m):  # x: (128, ...) per thread
    idx = np.arange(128) ^ m
    return x[idx]

def run_cta(qkv, T, nh, nkv, HD, h, qt, b, overlap, land_at_issue, nqt):
    TILE = (HD // 64) * PANEL
    sm = Smem(5 * TILE + 1024)
    sQ = 0; sK = sQ + TILE; sV = sQ + 3 * TILE
    C3 = (nh + 2 * nkv) * HD
    kvh = h // (nh // nkv)
    q0 = qt * BM
    scale_log2 = np.float32(1.0 / np.sqrt(HD) * 1.4426950408889634)
    pending = []

    def col0(kind):
        return {'q': h * HD, 'k': (nh + kvh) * HD, 'v': (nh + nkv + kvh) * HD}[kind]

    def load_tile(stile, kind, row0):
        CH = HD // 8; RSTEP = THREADS // CH
        for tid in range(THREADS):
            c = tid % CH; r0 = tid // CH
            dst = stile + (c >> 3) * PANEL + r0 * ROW + (((c & 7) ^ (r0 & 7)) << 4)
            for k in range(BM // RSTEP):
                r = r0 + k * RSTEP
                ok = r < T - row0
                data = qkv[b, row0 + r, col0(kind) + c * 8: col0(kind) + c * 8 + 8] if ok else np.zeros(8, np.uint16)
                a = dst + k * RSTEP * ROW
                pending.append((a, data.copy()))
        if land_at_issue:
            flush()

    def flush():
        for a, data in pending:
            assert a % 16 == 0
            sm.b[a // 2: a // 2 + 8] = data
        pending.clear()

    def tiles_ready():
        flush()

    n = qt + 1
    NO = HD // 2
    res_o = []; res_lse = []
    # per warpgroup state
    st = []
    for wg in range(2):
        st.append(dict(o=np.zeros((128, NO), np.float32), s=np.zeros((128, 64), np.float32),
                       m=np.full((128, 2), -np.inf, np.float32), l=np.zeros((128, 2), np.float32),
                       p=np.zeros((128, 32), np.uint32)))
    dq = [make_desc(sQ + 64 * wg * ROW, 16, 1024) for wg in range(2)]
    dk0 = make_desc(sK, 16, 1024); dv0 = make_desc(sV, PANEL, 1024)
    dk = lambda j: desc_add(dk0, (j & 1) * TILE)
    dv = lambda j: desc_add(dv0, (j & 1) * TILE)
    i = np.arange(128); warp = i // 32; lane = i % 32; g = lane // 4; t = lane % 4

    def gemm_qk(wg, d_k):
        S = st[wg]['s']
        for kk in range(HD // 16):
            off = (kk >> 2) * PANEL + (kk & 3) * 32
            S = wgmma_ss(sm, S, desc_add(dq[wg], off), desc_add(d_k, off), kk != 0)
        st[wg]['s'] = S

    def gemm_pv(wg, d_v):
        O = st[wg]['o']; P = st[wg]['p']
        for kk in range(BN // 16):
            O = wgmma_rs_t(sm, O, P[:, 4 * kk: 4 * kk + 4], desc_add(d_v, kk * 16 * ROW), HD)
        st[wg]['o'] = O

    def softmax(wg, mask):
        S = st[wg]['s'].copy(); m = st[wg]['m']; l = st[wg]['l']
        wrow = 64 * wg + 16 * warp + g
        lim = np.stack([wrow, wrow + 8], 1)
        r_idx = (np.arange(64) >> 1) & 1
        colx = 8 * (np.arange(64) >> 2)[None, :] + 2 * t[:, None] + (np.arange(64) & 1)[None, :]
        if mask:
            S = np.where(colx > lim[:, r_idx], -np.inf, S).astype(np.float32)
        alpha = np.zeros((128, 2), np.float32); mref = np.zeros((128, 2), np.float32)
        for r in range(2):
            mx = S[:, r_idx == r].max(1)
            mx = np.maximum(mx, shfl_xor(mx, 1)); mx = np.maximum(mx, shfl_xor(mx, 2))
            mn = np.maximum(m[:, r], mx * scale_log2)
            mref[:, r] = np.where(mn == -np.inf, 0, mn)
            alpha[:, r] = np.exp2(m[:, r] - mref[:, r])
            m[:, r] = mn
            l[:, r] *= alpha[:, r]
        S = np.exp2(S * scale_log2 - mref[:, r_idx]).astype(np.float32)
        for r in range(2):
            l[:, r] += S[:, r_idx == r].sum(1)
        st[wg]['s'] = S
        return alpha

    def rescale(wg, alpha):
        O = st[wg]['o']
        ridx = (np.arange(O.shape[1]) >> 1) & 1
        st[wg]['o'] = O * alpha[:, ridx]

    def to_bf16(wg):
        S = st[wg]['s']
        lo = bf16_round(S[:, 0::2]).astype(np.uint32); hi = bf16_round(S[:, 1::2]).astype(np.uint32)
        st[wg]['p'] = lo | (hi << 16)

    load_tile(sQ, 'q', q0); load_tile(sK, 'k', 0)
    if not overlap: load_tile(sV, 'v', 0)
    if overlap:
        tiles_ready()
        if n > 1: load_tile(sK + TILE, 'k', BN)
        load_tile(sV, 'v', 0)
        for wg in range(2):
            gemm_qk(wg, dk(0)); softmax(wg, n == 1); to_bf16(wg)
        for j in range(1, n):
            tiles_ready()
            if j + 1 < n: load_tile(sK + ((j + 1) & 1) * TILE, 'k', (j + 1) * BN)
            load_tile(sV + (j & 1) * TILE, 'v', j * BN)
            for wg in range(2):
                gemm_qk(wg, dk(j)); gemm_pv(wg, dv(j - 1))
                alpha = softmax(wg, j == n - 1)
                rescale(wg, alpha); to_bf16(wg)
        tiles_ready()
        for wg in range(2):
            gemm_pv(wg, dv(n - 1))
    else:
        for j in range(n):
            tiles_ready()
            if j + 1 < n:
                load_tile(sK + ((j + 1) & 1) * TILE, 'k', (j + 1) * BN)
                load_tile(sV + ((j + 1) & 1) * TILE, 'v', (j + 1) * BN)
            for wg in range(2):
                gemm_qk(wg, dk(j)); alpha = softmax(wg, j == n - 1); rescale(wg, alpha); to_bf16(wg)
                gemm_pv(wg, dv(j))

    out = np.full((BM, HD), np.nan, np.float32); lse = np.full(BM, np.nan, np.float32)
    CH = HD // 8
    for wg in range(2):
        l = st[wg]['l'].copy(); m = st[wg]['m']
        l = l + shfl_xor(l, 1); l = l + shfl_xor(l, 2)
        inv = 1.0 / l
        wrow = 64 * wg + 16 * warp + g
        for r in range(2):
            rows = wrow + 8 * r
            sel = (t == 0) & (q0 + rows < T)
            lse[rows[sel]] = ((m[:, r] + np.log2(l[:, r])) * np.float32(0.6931471805599453))[sel]
        # stage into Q rows (generic stores into the same smem)
        O = st[wg]['o']
        for j in range(HD // 8):
            for r in range(2):
                row = wrow + 8 * r
                off = (j >> 3) * PANEL + row * ROW + (((j & 7) ^ g) << 4) + 4 * t
                lo = bf16_round(O[:, 4 * j + 2 * r] * inv[:, r]); hi = bf16_round(O[:, 4 * j + 2 * r + 1] * inv[:, r])
                sm.b[(sQ + off) // 2] = lo; sm.b[(sQ + off) // 2 + 1] = hi
        for w in range(4):
            for ln in range(32):
                for ii in range(ln, 16 * CH, 32):
                    row = 64 * wg + 16 * w + ii // CH; c = ii % CH
                    off = (c >> 3) * PANEL + row * ROW + (((c & 7) ^ (row & 7)) << 4)
                    if q0 + row < T:
                        out[row, c * 8: c * 8 + 8] = bf16_to_f32(sm.b[(sQ + off) // 2: (sQ + off) // 2 + 8])
    return out, lse

def reference(qkv, T, nh, nkv, HD, h, b):
    C3 = (nh + 2 * nkv) * HD; kvh = h // (nh // nkv)
    x = bf16_to_f32(qkv[b]).astype(np.float64)
    q = x[:, h * HD:(h + 1) * HD]; k = x[:, (nh + kvh) * HD:(nh + kvh + 1) * HD]
    v = x[:, (nh + nkv + kvh) * HD:(nh + nkv + kvh + 1) * HD]
    s = q @ k.T / np.sqrt(HD)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    mx = s.max(1, keepdims=True); e = np.exp(s - mx); sm_ = e.sum(1, keepdims=True)
    return (e / sm_) @ v, (mx[:, 0] + np.log(sm_[:, 0]))

def main():
    rng = np.random.default_rng(1)
    ok_all = True
    for (B, T, nh, nkv, HD) in [(1, 130, 2, 1, 128), (1, 300, 2, 2, 64), (2, 200, 4, 2, 128)]:
        C3 = (nh + 2 * nkv) * HD
        x = rng.standard_normal((B, T, C3)).astype(np.float32)
        x[..., :(nh + nkv) * HD] *= 1.5
        qkv = bf16_round(x)
        nqt = (T + BM - 1) // BM
        for overlap in (True, False):
            for land in (True, False):
                worst_o = worst_l = 0
                for b in range(B):
                    for h in range(nh):
                        ro, rl = reference(qkv, T, nh, nkv, HD, h, b)
                        for qt in range(nqt):
                            o, l = run_cta(qkv, T, nh, nkv, HD, h, qt, b, overlap, land, nqt)
                            q0 = qt * BM; nr = min(BM, T - q0)
                            eo = np.abs(o[:nr] - ro[q0:q0 + nr]).max() / np.abs(ro).max()
                            el = np.abs(l[:nr] - rl[q0:q0 + nr]).max()
                            assert not np.isnan(o[:nr]).any() and not np.isnan(l[:nr]).any()
                            worst_o = max(worst_o, eo); worst_l = max(worst_l, el)
                good = worst_o < 1e-2 and worst_l < 1e-3
                ok_all &= good
                print(f"B={B} T={T} nh={nh} nkv={nkv} hd={HD} overlap={overlap} copies_land_at_issue={land}: "
                      f"out {worst_o:.2e} lse {worst_l:.2e} {'ok' if good else 'FAIL'}", flush=True)
    print("PASS" if ok_all else "FAIL")

main()
