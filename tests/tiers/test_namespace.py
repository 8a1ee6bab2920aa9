"""Namespace's fields: each refused by name when of the wrong kind, before a digest is taken; the
digest of a valid namespace the same whatever integer types it was given, and the same as the
chunks already stored carry. (Its digest per field and bad sizes refused: test_core.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.tiers import namespace


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"dtype": np.dtype("float16")},
            "Namespace dtype must be a string such as 'float16', got dtype('float16')",
        ),
        ({"dtype": np.float16}, "Namespace dtype must be a string such as 'float16', got <class"),
        (
            {"model": None},
            "Namespace model must be a string (the model's name; '' if not known), got None",
        ),
        ({"revision": b"r"}, "Namespace revision must be a string"),
        ({"layout": 123}, "Namespace layout must be a string such as 'layer_major', got 123"),
        ({"format_version": "x"}, "Namespace format_version must be an int, got 'x'"),
        ({"format_version": True}, "Namespace format_version must be an int, got True"),
        ({"tensor_parallel_rank": 1.0}, "Namespace tensor_parallel_rank must be an int, got 1.0"),
        ({"tensor_parallel_rank": -1}, "Namespace tensor_parallel_rank must be in [0, 1), got -1"),
        (
            {"tensor_parallel_size": np.int64(2), "tensor_parallel_rank": np.int64(2)},
            "Namespace tensor_parallel_rank must be in [0, 2), got 2",
        ),
        ({"head_size": np.float64(64)}, "Namespace head_size must be a positive int"),
    ],
)
def test_a_field_of_the_wrong_kind_is_refused_by_name(changes, message):
    with pytest.raises(ValueError) as refused:
        namespace(**changes)
    assert message in str(refused.value)


def test_numpy_integers_are_stored_as_ints_with_the_same_digest():
    numpy_ints = namespace(
        num_layers=np.int64(2),
        page_bytes=np.uint32(2048),
        tensor_parallel_size=np.int32(2),
        tensor_parallel_rank=np.int64(1),
        format_version=np.int16(1),
    )
    plain = namespace(tensor_parallel_size=2, tensor_parallel_rank=1)
    assert numpy_ints == plain and numpy_ints.digest == plain.digest
    assert {type(numpy_ints.tensor_parallel_rank), type(numpy_ints.format_version)} == {int}


@pytest.mark.parametrize(
    "changes, digest",
    [
        ({}, "ae127ecd0b9c563af1c7d51dfaba959f"),
        ({"model": "", "revision": ""}, "968d4207e4643adc011bd40b17f1bc13"),
        (
            {"tensor_parallel_size": 4, "tensor_parallel_rank": 3},
            "20c5223ee64845ab25e8aa6356c1b4b0",
        ),
    ],
)
def test_the_digest_of_a_valid_namespace_never_changes(changes, digest):
    """Stored chunks carry it: a change would orphan every chunk already written."""
    assert namespace(**changes).digest.hex() == digest
