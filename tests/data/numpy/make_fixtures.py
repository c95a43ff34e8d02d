#!/usr/bin/python3
"""Writes the small NumPy fixtures of tests/io/test_numpy_store.cpp with NumPy itself
(numpy 1.24, Debian's python3-numpy), so the C++ readers are checked against files
the real writer produced. Values are simple formulas the test recomputes:
  a = arange(24, dtype=float32).reshape(2, 3, 4) / 8 - 1
  ids = arange(5, dtype=int64) * 1000 - 7
Run from this directory: /usr/bin/python3 make_fixtures.py
"""
import numpy as np

a = (np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 8 - 1).astype(np.float32)
ids = np.arange(5, dtype=np.int64) * 1000 - 7

np.savez("savez.npz", a=a, ids=ids)                      # stored members, zip64 local headers
np.savez_compressed("savez_compressed.npz", a=a, ids=ids)  # deflated members
np.save("fortran.npy", np.asfortranarray(a))              # fortran_order True
np.save("half.npy", a.astype(np.float16))
with open("v2.npy", "wb") as f:                           # format version 2.0 header
    np.lib.format.write_array(f, a.astype(np.float64), version=(2, 0))
with open("v3.npy", "wb") as f:                           # format version 3.0 header
    np.lib.format.write_array(f, ids.astype(np.int32), version=(3, 0))
np.save("big_endian.npy", a.astype(">f4"))
np.save("bool.npy", np.array([True, False, True]))
