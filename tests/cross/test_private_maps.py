"""Writes by consumers that ignore read-only: a loaded file or a read-only buffer survives them.

torch has no read-only tensors and ignores DLPack's READ_ONLY flag, so whatever memory
the bridge hands it will sometimes be written. ``hb.load`` maps files copy-on-write
(container.md §8.2): such a write changes this load's private copy of the page, never
the file, never another load, and never kills the process. ``hb.loads`` and unpickling
never share the memory of a ``bytes`` object or another read-only buffer (§8.2).

Every case that writes through a loaded file runs in a child process: with a read-only
map that write is a SIGSEGV.
"""

from __future__ import annotations

import hashlib
import mmap
import pathlib
import pickle
from textwrap import dedent

import pytest

import hurray_bridge as hb
from hurray_bridge import container
from hurray_bridge import safetensors_io as sio
from tests.hurray_bridge.test_container_files import child

np = pytest.importorskip("numpy")

SUFFIXES = ["hurray", "safetensors"]


def _checkpoint(tmp_path: pathlib.Path, suffix: str) -> pathlib.Path:
    p = tmp_path / f"m.{suffix}"
    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
              "b": np.arange(4, dtype=np.float32)}
    if suffix == "hurray":
        hb.save(p, arrays)
    else:
        sio.save(p, arrays)
    return p


def _digest(p: pathlib.Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# What every torch scenario checks after its writes, in the child: the hb.Tensor of the
# same load sees them (one private map per load), a second load and the file do not.
_AFTER = """
    again = hb.load(P)
    print("original again:", np.asarray(again["w"]).ravel().tolist() == list(range(12)))
    print("same load sees it:", np.asarray(f["w"]).ravel().tolist() != list(range(12)))
"""

TORCH_WRITES = {
    "convert then mul_": """
        w = hb.convert(f["w"], "torch")
        w.mul_(2)
        assert w.flatten().tolist() == [2.0 * i for i in range(12)]
    """,
    "torch.from_dlpack then add_": """
        torch.from_dlpack(f["w"]).add_(1)
    """,
    "load_state_dict(assign=True) then an optimizer step": """
        m = torch.nn.Linear(4, 3)
        m.load_state_dict({"weight": hb.convert(f["w"], "torch"),
                           "bias": hb.convert(f["b"], "torch")[:3]}, assign=True)
        opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
        m(torch.ones(2, 4)).sum().backward()
        opt.step()
    """,
}


@pytest.mark.parametrize("scenario", TORCH_WRITES)
@pytest.mark.parametrize("suffix", SUFFIXES)
def test_torch_writes_to_a_loaded_file_stay_private(tmp_path: pathlib.Path, suffix: str,
                                                   scenario: str) -> None:
    pytest.importorskip("torch")
    p = _checkpoint(tmp_path, suffix)
    before = _digest(p)
    r = child(dedent(f"""
        import warnings
        import numpy as np, torch, hurray_bridge as hb
        warnings.simplefilter("ignore")
        P = {str(p)!r}
        f = hb.load(P)
        assert f["w"].readonly
    """) + dedent(TORCH_WRITES[scenario]) + dedent(_AFTER))
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "original again: True" in r.stdout and "same load sees it: True" in r.stdout, r.stdout
    assert _digest(p) == before  # the write never reached the file


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_consumer_ignoring_read_only_survives_a_loaded_file(tmp_path: pathlib.Path,
                                                              suffix: str) -> None:
    # What PaddlePaddle does: ask for a versioned capsule, get READ_ONLY, write anyway.
    p = _checkpoint(tmp_path, suffix)
    before = _digest(p)
    r = child(dedent(f"""
        import ctypes
        import numpy as np, hurray_bridge as hb
        from hurray_bridge._capsule import consume_capsule
        from hurray_bridge._dlpack import FLAG_READ_ONLY
        P = {str(p)!r}
        f = hb.load(P)
        view = consume_capsule(f["w"].__dlpack__(max_version=(1, 0)))
        assert view.flags & FLAG_READ_ONLY
        ctypes.memset(view.data, 0x7F, 48)
    """) + dedent(_AFTER))
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "original again: True" in r.stdout and "same load sees it: True" in r.stdout, r.stdout
    assert _digest(p) == before


def test_verified_load_is_private_too(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("torch")
    p = _checkpoint(tmp_path, "hurray")
    before = _digest(p)
    r = child(dedent(f"""
        import warnings
        import numpy as np, torch, hurray_bridge as hb
        warnings.simplefilter("ignore")
        P = {str(p)!r}
        f = hb.load(P, verify=True)
        hb.convert(f["w"], "torch").fill_(3)
    """) + dedent(_AFTER))
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "original again: True" in r.stdout, r.stdout
    assert _digest(p) == before
    container.verify(p)  # the checksums still hold


def test_read_only_shared_memory_is_private_to_each_consumer() -> None:
    from hurray_bridge.shm import attach, share

    pytest.importorskip("torch")
    with share(np.arange(8, dtype=np.int32), readonly=True) as h:
        r = child(f"""
            import pickle, warnings
            import torch, hurray_bridge as hb
            from hurray_bridge.shm import attach
            warnings.simplefilter("ignore")
            t = attach(pickle.loads({pickle.dumps(h)!r}))
            assert t.readonly
            hb.convert(t, "torch").fill_(-1)
            print("here:", hb.convert(t, "numpy").tolist())
        """)
        assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
        assert "here: [-1, -1, -1, -1, -1, -1, -1, -1]" in r.stdout, r.stdout
        assert np.asarray(attach(h)).tolist() == list(range(8))  # the segment is unchanged


# ------------------------------------------------------------------ immutable objects
def _raw() -> bytes:
    return hb.dumps({"w": np.arange(4, dtype=np.float32)})


@pytest.mark.parametrize("write", ["convert", "from_dlpack"])
def test_torch_never_writes_a_bytes_object(write: str) -> None:
    torch = pytest.importorskip("torch")
    raw = _raw()
    before = hashlib.sha256(raw).hexdigest()
    t = hb.loads(raw)["w"]
    y = hb.convert(t, "torch") if write == "convert" else torch.from_dlpack(t)
    y.add_(1)
    assert hashlib.sha256(raw).hexdigest() == before
    assert np.asarray(hb.loads(raw)["w"]).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_loads_copies_read_only_buffers_and_shares_writable_ones(
        tmp_path: pathlib.Path) -> None:
    from hurray_bridge._memory import buffer_address

    raw = _raw()
    p = tmp_path / "m.hurray"
    p.write_bytes(raw)
    with open(p, "rb") as fh:
        ro_map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        cow_map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    for ro in (raw, memoryview(bytearray(raw)).toreadonly(), ro_map):
        t = hb.loads(ro)["w"]
        base, n, _, _view = buffer_address(ro)
        assert not base <= t.data_ptr < base + n, type(ro)  # not inside the buffer
        assert not t.readonly and t.data_ptr % 64 == 0  # a fresh, aligned copy of its own
        assert np.asarray(t).tolist() == [0.0, 1.0, 2.0, 3.0]
        with pytest.raises(hb.CopyRequiredError, match=r"copy=False") as e:
            hb.loads(ro, copy=False)
        assert "bytearray" in str(e.value) and "ACCESS_COPY" in str(e.value)
    for rw in (bytearray(raw), cow_map, memoryview(bytearray(raw))):
        t = hb.loads(rw)["w"]
        base, n, _, _view = buffer_address(rw)
        assert base <= t.data_ptr < base + n and not t.readonly  # zero-copy, as before
        assert hb.loads(rw, copy=False)["w"].data_ptr == t.data_ptr


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_unpickled_bytes_are_never_shared(protocol: int) -> None:
    # In band, a read-only tensor travels as a bytes object (pickle's choice for read-only
    # memory): the receiver's tensor must not be built over it, whoever else holds it.
    t = hb.asarray(np.frombuffer(bytes(range(16)), np.uint8))
    assert t.readonly
    u = pickle.loads(pickle.dumps(t, protocol=protocol))
    assert u.readonly  # the sender's flag travels
    assert not any(isinstance(getattr(k, "obj", None), bytes) for k in u.owner), u.owner
    assert bytes(u.memoryview()) == bytes(range(16))


def test_out_of_band_bytes_are_copied_read_only_views_shared() -> None:
    torch = pytest.importorskip("torch")
    oob: list[pickle.PickleBuffer] = []
    data = pickle.dumps(hb.asarray(np.arange(4, dtype=np.int32)), protocol=5,
                        buffer_callback=oob.append)
    frozen = bytes(oob[0].raw())
    v = pickle.loads(data, buffers=[frozen])
    torch.from_dlpack(v).fill_(-1)
    assert np.frombuffer(frozen, np.int32).tolist() == [0, 1, 2, 3]
    # A read-only view of memory that is not a bytes object's (Ray's object store hands
    # out such views) stays shared and read-only, as the transport gave it.
    store = bytearray(bytes(oob[0].raw()))
    w = pickle.loads(data, buffers=[memoryview(store).toreadonly()])
    assert w.readonly and w.data_ptr == np.frombuffer(store, np.uint8).ctypes.data


# ------------------------------------------------- protected memory from other producers
# Memory the bridge did not map itself: pages mapped read-only (a write is a SIGSEGV) and
# the buffer of a bytes object (immutable, maybe shared). torch cannot mark a tensor
# read-only, so it gets a copy of them, reported; writable and merely flagged memory stays
# shared (torch's documented exception, with its notice).
PROTECTED = {
    "np.memmap(mode='r')": "np.memmap(P, dtype=np.float32, mode='r')",
    "a view of one": "np.memmap(P, dtype=np.float32, mode='r')[2:]",
    "hb.asarray of one": "hb.asarray(np.memmap(P, dtype=np.float32, mode='r'))",
    "mmap ACCESS_READ": "np.frombuffer(mmap.mmap(os.open(P, os.O_RDONLY), 0, "
                        "access=mmap.ACCESS_READ), np.float32)",
    "the bridge's own ndarray of one": "hb.convert(np.memmap(P, dtype=np.float32, mode='r'), "
                                       "'numpy')",
    "an mmap subclass": "np.frombuffer(M(os.open(P, os.O_RDONLY), 0, access=mmap.ACCESS_READ), "
                        "np.float32)",
    "np.frombuffer(bytes)": "np.frombuffer(RAW, np.float32)",
    "through a memoryview": "np.frombuffer(memoryview(RAW), np.float32)",
}


@pytest.mark.parametrize("source", PROTECTED)
def test_torch_gets_a_copy_of_protected_memory(tmp_path: pathlib.Path, source: str) -> None:
    pytest.importorskip("torch")
    p = tmp_path / "raw.f32"
    np.arange(16, dtype=np.float32).tofile(p)
    before = _digest(p)
    r = child(dedent(f"""
        import mmap, os, warnings
        import numpy as np, torch, hurray_bridge as hb
        P = {str(p)!r}
        RAW = bytes(np.arange(16, dtype=np.float32))
        class M(mmap.mmap):
            pass
        x = {PROTECTED[source]}
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            y = hb.convert(x, "torch")
        assert any(issubclass(w.category, hb.CopyWarning) and "immutable" in str(w.message)
                   for w in seen), [str(w.message) for w in seen]
        try:
            hb.convert(x, "torch", copy=False)
        except hb.CopyRequiredError as e:
            assert "copy=False" in str(e)
        else:
            raise AssertionError("copy=False shared protected memory")
        y.mul_(2)  # a SIGSEGV here if torch had the pages
        print("RAW intact:", RAW == bytes(np.arange(16, dtype=np.float32)))
    """))
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "RAW intact: True" in r.stdout, r.stdout
    assert _digest(p) == before


def test_a_quantized_tensor_over_protected_memory_reaches_torch_as_a_copy(
        tmp_path: pathlib.Path) -> None:
    pytest.importorskip("torch")
    p = tmp_path / "q.i8"
    np.arange(64, dtype=np.int8).tofile(p)
    before = _digest(p)
    r = child(dedent(f"""
        import warnings
        import numpy as np, torch, hurray_bridge as hb
        q = hb.quant.quantized(np.memmap({str(p)!r}, np.int8, mode="r"),
                               np.array([0.5], np.float32),
                               quantization=hb.Quantization(scheme=hb.QuantScheme.PER_TENSOR))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            y = hb.convert(q, "torch")
        assert any(issubclass(w.category, hb.CopyWarning) for w in seen), seen
        assert y.int_repr().tolist() == list(range(64))
        try:
            hb.convert(q, "torch", copy=False)
        except hb.CopyRequiredError:
            pass
        else:
            raise AssertionError("copy=False shared protected memory")
        y.int_repr()  # the copy is torch's own
        y.copy_(torch.quantize_per_tensor(torch.zeros(64), 0.5, 0, torch.qint8))
        print("done")
    """))
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert "done" in r.stdout
    assert _digest(p) == before


def test_flagged_read_only_memory_is_still_shared_with_torch() -> None:
    pytest.importorskip("torch")
    a = np.arange(6, dtype=np.float32)
    a.flags.writeable = False  # flagged by its owner, not protected: shared, with the notice
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        warnings.simplefilter("ignore", UserWarning)
        y = hb.convert(hb.asarray(a), "torch")
    assert y.data_ptr() == a.ctypes.data


def test_write_protected_follows_owners() -> None:
    from hurray_bridge._memory import write_protected

    raw = bytes(16)
    assert write_protected(raw) and write_protected(memoryview(raw))
    assert write_protected(np.frombuffer(raw, np.uint8)[4:])
    assert write_protected(hb.asarray(np.frombuffer(raw, np.uint8)))
    assert not write_protected(np.frombuffer(bytearray(16), np.uint8))
    assert not write_protected(np.zeros(3)) and not write_protected(None)
    anon = mmap.mmap(-1, 4096)
    view = np.frombuffer(anon, np.uint8)
    assert not write_protected(view)  # a writable map
    del view
    anon.close()
    assert not write_protected(anon)  # closed: nothing left to write
