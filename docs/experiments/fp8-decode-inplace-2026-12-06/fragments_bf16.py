# Validates the emulator's ldmatrix model on the bf16 path (known good on GPUs):
# elements are 2-byte; emulate with element-indexed arrays.
import numpy as np
rng = np.random.default_rng(1)
HD, TK, ROWS = 64, 16, 16
LD = HD + 8
exec(open(__file__.replace('_bf16', '_fp8')).read().split("def q_col_perm")[0])  # ldsm (byte), mma
def ldsm_el(arr, addrs, n, trans):
    regs = [[None]*n for _ in range(32)]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for m in range(n):
            rows = [addrs[8*m + r] for r in range(8)]
            if not trans: regs[lane][m] = [arr[rows[g] + 2*t], arr[rows[g] + 2*t + 1]]
            else: regs[lane][m] = [arr[rows[2*t] + g], arr[rows[2*t+1] + g]]
    return regs
Q = rng.integers(-5, 6, size=(ROWS, HD)).astype(float)
K = rng.integers(-5, 6, size=(TK, HD)).astype(float)
V = rng.integers(-5, 6, size=(TK, HD)).astype(float)
sQ = np.zeros(ROWS*LD); sK = np.zeros(TK*LD); sV = np.zeros(TK*LD)
for r in range(16): sQ[r*LD:r*LD+HD] = Q[r]; sK[r*LD:r*LD+HD] = K[r]; sV[r*LD:r*LD+HD] = V[r]
a_row = lambda l: (l & 7) + ((l >> 3) & 1) * 8; a_col = lambda l: (l >> 4) * 8
k_row = lambda l: (l & 7) + (l >> 4) * 8; k_col = lambda l: ((l >> 3) & 1) * 8
S = [[[0.0]*4 for _ in range(32)] for _ in range(2)]
for k in range(HD // 16):
    a = ldsm_el(sQ, [a_row(l)*LD + k*16 + a_col(l) for l in range(32)], 4, False)
    b = ldsm_el(sK, [k_row(l)*LD + k*16 + k_col(l) for l in range(32)], 4, False)
    mma(S[0], a, [[b[l][0], b[l][1]] for l in range(32)])
    mma(S[1], a, [[b[l][2], b[l][3]] for l in range(32)])
ref = Q @ K.T
ok = all(np.allclose(S[n][l], [ref[l//4, 8*n+2*(l%4)], ref[l//4, 8*n+2*(l%4)+1], ref[l//4+8, 8*n+2*(l%4)], ref[l//4+8, 8*n+2*(l%4)+1]]) for n in range(2) for l in range(32))
print("bf16 S:", ok)
P = rng.integers(-3, 4, size=(ROWS, TK)).astype(float)
pa = [[P[l//4, 2*(l%4):2*(l%4)+2], P[l//4+8, 2*(l%4):2*(l%4)+2], P[l//4, 8+2*(l%4):10+2*(l%4)], P[l//4+8, 8+2*(l%4):10+2*(l%4)]] for l in range(32)]
O = [[[0.0]*4 for _ in range(32)] for _ in range(HD//8)]
for dt in range(HD // 16):
    b = ldsm_el(sV, [a_row(l)*LD + dt*16 + a_col(l) for l in range(32)], 4, True)
    mma(O[2*dt], pa, [[b[l][0], b[l][1]] for l in range(32)])
    mma(O[2*dt+1], pa, [[b[l][2], b[l][3]] for l in range(32)])
refO = P @ V
ok = all(np.allclose(O[n][l], [refO[l//4, 8*n+2*(l%4)], refO[l//4, 8*n+2*(l%4)+1], refO[l//4+8, 8*n+2*(l%4)], refO[l//4+8, 8*n+2*(l%4)+1]]) for n in range(HD//8) for l in range(32))
print("bf16 O:", ok)
