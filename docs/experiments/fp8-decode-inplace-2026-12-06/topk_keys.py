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
