# Emulates one warp's fragment math of paged_decode2's FP8 path (ldmatrix on an
# e4m3 ring, register widening, permuted k order) and checks S = Q K^T and
# O = P V against numpy. Byte value b stands for the number b (cvt is exact,
# only the index mapping is under test).
import numpy as np
rng = np.random.default_rng(0)
HD, TK, ROWS = 64, 16, 16
LDC = HD + 16          # e4m3 row stride (bytes)
LD = HD + 8            # sQ row stride (2-byte elements)

def ldsm(smem_bytes, addrs, n, trans):
    """addrs[lane] = byte address of a row (lanes 8m..8m+7 give matrix m's rows)."""
    regs = [[None] * n for _ in range(32)]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for m in range(n):
            rows = [addrs[8 * m + r] for r in range(8)]
            if not trans:
                a = rows[g] + 4 * t
                regs[lane][m] = [smem_bytes[a + i] for i in range(4)]  # 4 bytes, low first
            else:
                lo = rows[2 * t] + 2 * g
                hi = rows[2 * t + 1] + 2 * g
                regs[lane][m] = [smem_bytes[lo], smem_bytes[lo + 1], smem_bytes[hi], smem_bytes[hi + 1]]
    return regs

def mma(D, A, B):
    """D[lane][4] += A (16x16, per-lane a0..a3 as pairs) * B (16x8, per-lane b0,b1 pairs)."""
    Am = np.zeros((16, 16)); Bm = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        a = A[lane]
        Am[g, 2*t:2*t+2] = a[0]; Am[g+8, 2*t:2*t+2] = a[1]
        Am[g, 2*t+8:2*t+10] = a[2]; Am[g+8, 2*t+8:2*t+10] = a[3]
        b = B[lane]
        Bm[2*t:2*t+2, g] = b[0]; Bm[2*t+8:2*t+10, g] = b[1]
    C = Am @ Bm
    for lane in range(32):
        g, t = lane // 4, lane % 4
        D[lane][0] += C[g, 2*t]; D[lane][1] += C[g, 2*t+1]
        D[lane][2] += C[g+8, 2*t]; D[lane][3] += C[g+8, 2*t+1]

def q_col_perm(p):
    return 2 * (p >> 2) + (p & 1) + (8 if p & 2 else 0)

Q = rng.integers(-5, 6, size=(ROWS, HD)).astype(float)
K8 = rng.integers(0, 256, size=(TK, HD))
V8 = rng.integers(0, 256, size=(TK, HD))
ring = np.zeros(2 * TK * LDC, dtype=np.int64)
for k in range(TK):
    ring[k*LDC:k*LDC+HD] = K8[k]
    ring[TK*LDC + k*LDC: TK*LDC + k*LDC + HD] = V8[k]
# sQ, permuted within 16-column chunks (as the staging loop writes it)
sQ = np.zeros(ROWS * LD)
for r in range(ROWS):
    for c in range(HD):
        sQ[r*LD + (c // 16) * 16 + q_col_perm(c % 16)] = Q[r, c]

# Q fragments: ldsm4 over sQ (element addressing; sQ is 2-byte elements)
def ldsm4_elems(arr, addr_of_lane):
    regs = [[None]*4 for _ in range(32)]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for m in range(4):
            row = addr_of_lane[8*m + g]
            regs[lane][m] = [arr[row + 2*t], arr[row + 2*t + 1]]
    return regs

S = [[0.0]*4 for _ in range(32)], [[0.0]*4 for _ in range(32)]
for k in range(HD // 16):
    qaddr = [((l & 7) + ((l >> 3) & 1) * 8) * LD + k * 16 + (l >> 4) * 8 for l in range(32)]
    qf = ldsm4_elems(sQ, qaddr)
    kaddr = [((l & 7) + ((l >> 3) & 1) * 8) * LDC + k * 16 for l in range(32)]
    r = ldsm(ring, kaddr, 2, False)
    B0 = [[r[l][0][0:2], r[l][0][2:4]] for l in range(32)]  # b0 = lo pair, b1 = hi pair
    B1 = [[r[l][1][0:2], r[l][1][2:4]] for l in range(32)]
    mma(S[0], qf, B0)
    mma(S[1], qf, B1)
ref = Q @ K8.T.astype(float)   # [16 rows][16 keys]
ok = True
for lane in range(32):
    g, t = lane // 4, lane % 4
    for n in range(2):
        got = S[n][lane]
        want = [ref[g, 8*n+2*t], ref[g, 8*n+2*t+1], ref[g+8, 8*n+2*t], ref[g+8, 8*n+2*t+1]]
        ok &= np.allclose(got, want)
print("S = Q K^T:", "ok" if ok else "WRONG")

# P V: P from S's layout (random P here), A fragment from the two n-tiles.
P = rng.integers(-3, 4, size=(ROWS, TK)).astype(float)
pa = []
for lane in range(32):
    g, t = lane // 4, lane % 4
    pa.append([P[g, 2*t:2*t+2], P[g+8, 2*t:2*t+2], P[g, 8+2*t:8+2*t+2], P[g+8, 8+2*t:8+2*t+2]])
O = [[[0.0]*4 for _ in range(32)] for _ in range(HD // 8)]
def perm3120(b):  # __byte_perm(x, 0, 0x3120): bytes [0, 2, 1, 3]
    return [b[0], b[2], b[1], b[3]]
for dt in range(HD // 16):
    vaddr = [TK*LDC + ((l & 7) + ((l >> 3) & 1) * 8) * LDC + dt * 16 for l in range(32)]
    r = ldsm(ring, vaddr, 2, True)
    Be, Bo = [], []
    for l in range(32):
        p0, p1 = perm3120(r[l][0]), perm3120(r[l][1])
        Be.append([p0[0:2], p1[0:2]])
        Bo.append([p0[2:4], p1[2:4]])
    mma(O[2*dt], pa, Be)
    mma(O[2*dt+1], pa, Bo)
sO = np.full((ROWS, HD), np.nan)
for lane in range(32):
    g, t = lane // 4, lane % 4
    for c in range(HD // 16):
        e, d = O[2*c][lane], O[2*c+1][lane]
        sO[g, c*16+4*t: c*16+4*t+4] = [e[0], d[0], e[1], d[1]]
        sO[g+8, c*16+4*t: c*16+4*t+4] = [e[2], d[2], e[3], d[3]]
refO = P @ V8.astype(float)
print("O = P V:", "ok" if np.allclose(sO, refO) else "WRONG")
