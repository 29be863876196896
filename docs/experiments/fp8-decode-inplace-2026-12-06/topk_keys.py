# Checks moe.cu's top-k keys (topk_key / topk_key_logit) over every bf16 bit
# pattern: the 16-bit order key sorts like the f32 value of the bf16 (equal
# keys exactly for equal values, -0 with +0), NaN lies below every number,
# and decoding a key gives back the value. With 0xffff - expert in the low
# half, the largest 32-bit key is the largest logit, ties to the lower id.
#   python3 -m venv v && v/bin/pip install numpy && v/bin/python topk_keys.py
import numpy as np

b = np.arange(65536, dtype=np.uint32)
f = np.frombuffer((b << 16).astype(np.uint32).tobytes(), dtype=np.float32)
nan = np.isnan(f)
bb = np.where(b == 0x8000, 0, b)
o = np.where((bb & 0x7FFF) > 0x7F80, 0, np.where(bb & 0x8000, (~bb) & 0xFFFF, bb | 0x8000))
assert (o[nan] == 0).all(), "NaN not lowest"
fv, ov = f[~nan], o[~nan].astype(np.int64)
idx = np.argsort(fv, kind="stable")
df, do = np.diff(fv[idx]), np.diff(ov[idx])
assert ((df > 0) == (do > 0)).all() and ((df == 0) == (do == 0)).all(), "key order differs from value order"
dec = np.where(o & 0x8000, o & 0x7FFF, (~o) & 0xFFFF)
fd = np.frombuffer((dec.astype(np.uint32) << 16).tobytes(), dtype=np.float32)
assert (fd[~nan] == f[~nan]).all(), "decode"
assert o[~nan].min() > 0, "a number's key is 0"
print(f"ok: {(~nan).sum()} non-NaN bf16 values; smallest number key {o[~nan].min():#06x}")

# One warp's topk_token_n<NV> emulated (lane l holds experts l + 32 i) against
# a plain top-k of the bf16 values (ties to the lower id), over random rows
# with many ties (logits drawn from a few bf16 values), E from 1 to 512.
rng = np.random.default_rng(0)
def to_bits(x):  # f32 -> bf16 bits (round to nearest even)
    u = np.frombuffer(np.asarray(x, np.float32).tobytes(), np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)
def key(bits, e):
    bb = np.where(bits == 0x8000, 0, bits)
    o = np.where((bb & 0x7FFF) > 0x7F80, 0, np.where(bb & 0x8000, (~bb) & 0xFFFF, bb | 0x8000))
    return (o.astype(np.uint64) << 16) | (0xFFFF - e)
for trial in range(3000):
    E = int(rng.integers(1, 513)); K = int(rng.integers(1, min(E, 32) + 1))
    NV = 4 if E <= 128 else 8 if E <= 256 else 32
    pool = rng.normal(size=int(rng.integers(1, 6))).astype(np.float32)
    bits = to_bits(rng.choice(pool, E) * rng.choice([1.0, -1.0, 0.0], E))
    keys = np.zeros((32, NV), np.uint64)  # lane, slot
    for lane in range(32):
        for i in range(NV):
            e = lane + 32 * i
            if e < E: keys[lane, i] = key(bits[e:e + 1], e)[0]
    got = []
    for _ in range(K):
        best = keys.max()  # each lane's max, then the warp's
        keys[keys == best] = 0
        got.append(0xFFFF - int(best & 0xFFFF))
    vals = np.frombuffer((bits << 16).astype(np.uint32).tobytes(), np.float32)
    want = sorted(range(E), key=lambda e: (-vals[e], e))[:K]
    assert got == want, (E, K, got, want)
print("ok: emulated warp top-k equals the plain top-k over 3000 tied rows")
