"""Golden descriptor vectors (docs/impl/compliance.md), checked byte for byte."""

from __future__ import annotations

import json
import pathlib

import pytest

import hurray_bridge as hb
from tests.vectors.generate import fields, vectors

HERE = pathlib.Path(__file__).resolve().parents[1] / "vectors"
NAMES = sorted(p.stem for p in HERE.glob("*.bin"))
REQUIRED = {"shape_0", "shape_3_0_5", "rank_0", "rank_64", "dynamic_batch",
            "per_axis_quant_axis_size_0", "empty_csr_nnz_0", "empty_int4"}


def test_required_vectors_exist() -> None:
    assert REQUIRED <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_vector_decodes_to_expected_fields(name: str) -> None:
    raw = (HERE / f"{name}.bin").read_bytes()
    expected = json.loads((HERE / f"{name}.json").read_text())
    assert fields(raw) == expected


@pytest.mark.parametrize("name", NAMES)
def test_encoder_reproduces_vector_byte_for_byte(name: str) -> None:
    raw = (HERE / f"{name}.bin").read_bytes()
    d = vectors()[name]
    assert d.to_bytes() == raw
    assert hb.Descriptor.from_bytes(raw) == d
