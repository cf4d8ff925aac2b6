"""The compiled file readers where a load goes wrong half way, or is re-entered.

hb.load's compiled readers (``_speedups_c/st_header.c``, ``hry_index.c``) build every
tensor over the map before the metadata block is read, and keep the answers of
``describe`` in caches shared by every load. Each case here once read freed or unmapped
memory, so each runs in a child process: a crash is a failed test, not a lost suite.
"""

from __future__ import annotations

import pathlib

import pytest

from hurray_bridge.files.safetensors_header import compiled_reader
from tests.hurray_bridge.test_container_files import child

pytest.importorskip("numpy")

pytestmark = pytest.mark.skipif(not compiled_reader(), reason="the compiled module is not built")

# A load refused at its metadata block, after its tensors were built; then every tensor
# still reachable from the traceback's frames is read.
_READ_FRAMES = """
        try:
            hb.load(PATH)
        except hb.FormatError as e:
            seen = 0
            tb = e.__traceback__
            while tb is not None:
                for value in list(tb.tb_frame.f_locals.values()):
                    for t in (value.values() if isinstance(value, dict) else [value]):
                        if isinstance(t, hb.Tensor) and t.nbytes:
                            seen += 1
                            bytes(t.memoryview(t.buffers[0].role))
                    if type(value).__name__ == "MapOwner":
                        assert "closed" in repr(value), repr(value)
                tb = tb.tb_next
            print("read", seen)
        else:
            raise SystemExit("the load was not refused")
"""


def test_a_safetensors_load_refused_at_its_metadata_leaves_no_tensor_over_the_closed_map(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "m.safetensors"
    code = f"""
        import struct
        import hurray_bridge as hb
        PATH = {str(path)!r}
        h = (b'{{"a":{{"dtype":"U8","shape":[4096],"data_offsets":[0,4096]}},'
             b'"__metadata__":{{"k":"v","k":"w"}}}}')
        with open(PATH, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"\\x07" * 4096)
    """ + _READ_FRAMES
    r = child(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "read 0"


def test_a_hurray_load_refused_at_its_metadata_leaves_no_tensor_over_the_closed_map(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "m.hurray"
    # a metadata key that is not UTF-8, with the index and header checksums made right
    code = f"""
        import struct, zlib
        import numpy as np
        import hurray_bridge as hb
        from hurray_bridge.files.format import HEADER
        PATH = {str(path)!r}
        hb.save(PATH, {{"a": np.full(4096, 7, np.uint8)}}, metadata={{"k": "v"}})
        raw = bytearray(open(PATH, "rb").read())
        f = list(HEADER.unpack_from(raw, 0))
        m_off, m_len = f[8], f[9]
        raw[raw.index(b"k", m_off, m_off + m_len)] = 0xFF
        f[14] = zlib.crc32(raw[128:m_off + m_len]); HEADER.pack_into(raw, 0, *f)
        f[16] = zlib.crc32(raw[:124]); HEADER.pack_into(raw, 0, *f)
        open(PATH, "wb").write(raw)
    """ + _READ_FRAMES
    r = child(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "read 0"


def test_a_cache_emptied_while_an_entry_is_read_leaves_its_answer_alive() -> None:
    # A collection during a tensor's allocation runs a callback that loads headers of
    # 5,000 new shapes: the shared cache of describe's answers is emptied under the
    # reader, whose answer (fresh tuples, held nowhere else) must stay alive.
    code = """
        import ctypes, gc, random
        import hurray_bridge as hb
        from hurray_bridge.files import safetensors_header as sh
        hb.load  # the compiled module builds tensors once the package is set up
        read = sh._compiled
        buf = bytearray(1 << 16)
        base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        def describe(shape, st):
            r = sh.describe.__wrapped__(shape, st)
            if r is not None:
                d, nb = sh._descriptor.__wrapped__(shape, st)
                r = (d, tuple(int(x) for x in shape), int(nb) + 0, r[3])
            return r
        counter = [10**6]
        def flood():
            for _ in range(5):
                members = []
                for k in range(1000):
                    counter[0] += 1
                    members.append(b'"t%d":{"dtype":"U8","shape":[%d],"data_offsets":[0,0]}'
                                   % (k, counter[0]))
                read(b"{" + b",".join(members) + b"}", 1, base, None, describe, None, 64)
        busy = [False]
        def on_gc(phase, info):
            if phase == "start" and not busy[0]:
                busy[0] = True
                try:
                    flood()
                finally:
                    busy[0] = False
        gc.callbacks.append(on_gc)
        gc.set_threshold(1, 1, 1)
        wrong = read_some = 0
        for i in range(300):
            n = random.randrange(1, 60000)
            h = b'{"a":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (n, n)
            got = read(h, n, base, None, describe, None, 64)
            if got is None:  # declined (the flood can interrupt it): Python would read it
                continue
            read_some += 1
            t = got[0]["a"]
            wrong += t.shape != (n,) or t._desc.shape != (n,) or t.nbytes != n
        gc.callbacks.clear()
        print("wrong", wrong, read_some > 100)
    """
    r = child(code, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "wrong 0 True"


def test_a_tensor_whose_descriptor_slot_was_deleted_is_refused_by_numpy_not_crashed(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "m.hurray"
    code = f"""
        import numpy as np
        import hurray_bridge as hb
        hb.save({str(path)!r}, {{"x": np.arange(8, dtype=np.float32)}})
        t = hb.load({str(path)!r})["x"]
        del t._desc
        try:
            np.asarray(t)
        except AttributeError:
            print("refused")
    """
    r = child(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "refused"
