"""`fitprof._batch.batch_size` on the batch shapes the frameworks hand to callbacks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fitprof._batch import batch_samples, batch_size
from fitprof.throughput import WorkLog


class Shaped:
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (np.zeros((32, 4)), 32),
        ((np.zeros((7, 3)), np.zeros(7)), 7),
        ([np.zeros((5,)), np.zeros((5, 2))], 5),
        ((np.zeros((7, 3)), np.zeros(2)), 7),  # the first array decides, not the last
        ([np.float32(1.0), np.zeros((4, 2))], 4),  # a scalar first: the next item's
        (((np.zeros((3,)),), np.zeros((5,))), 3),  # nested first: depth first
        ([Shaped((-1, 2)), np.zeros((6,))], 6),  # a negative leading dimension is no batch size: the next item's
        ({"input_ids": np.zeros((3, 128)), "labels": np.zeros((3,))}, 3),
        ({"meta": "x", "x": (np.zeros((9, 2)),)}, 9),
        (np.float32(1.0), None),
        ("text", None),
        ([], None),
        (None, None),
        ([[[[[[[[[[np.zeros((4,))]]]]]]]]]], None),
    ],
)
def test_batch_size_reads_the_leading_dimension_of_the_first_array(batch: object, expected: int | None) -> None:
    assert batch_size(batch) == expected


def test_torch_tensor_batch() -> None:
    torch = pytest.importorskip("torch")
    assert batch_size((torch.zeros(16, 3, 8, 8), torch.zeros(16, dtype=torch.long))) == 16


def test_unknown_leading_dimension_is_none() -> None:
    class Symbolic:
        shape = (None, 4)

    assert batch_size(Symbolic()) is None


def test_a_list_of_variable_size_images_beside_their_targets_counts_the_images() -> None:
    images = [np.zeros((3, 20 + i, 30 - i)) for i in range(8)]
    assert batch_samples((images, np.zeros(8))) == (8, "")
    assert batch_samples({"image": images, "label": np.zeros((8, 1))}) == (8, "")


def test_a_dataclass_is_looked_into_field_by_field() -> None:
    @dataclasses.dataclass
    class Batch:
        name: str
        x: object
        y: object

    assert batch_samples(Batch("b", np.zeros((5, 2)), np.zeros(5))) == (5, "")
    assert batch_samples([Batch("b", None, np.zeros((6, 1)))]) == (6, "")
    assert batch_size(Batch) is None  # the class itself holds no batch


def test_an_ambiguous_collection_counts_the_first_array_and_says_so() -> None:
    n, note = batch_samples((np.zeros((7, 3)), np.zeros(2)))
    assert n == 7 and "leading dimensions 2, 7" in note and "ambiguous collection" in note


def test_no_count_says_what_the_batch_was() -> None:
    n, note = batch_samples(object())
    assert n is None and "(a object)" in note


def test_the_work_log_tells_an_ambiguous_or_unknown_count_and_keeps_the_count() -> None:
    told: list[str] = []
    log = WorkLog(None, lambda m: None, warn_samples=told.append)
    log.add_step((np.zeros((7, 3)), np.zeros(2)))
    log.add_step(object())
    log.add_step((np.zeros((7, 3)), np.zeros(7)))
    assert len(told) == 2
    assert told[0].startswith("fitprof: the batch's arrays disagree on its size") and "dataclasses" in told[0]
    assert told[1].startswith("fitprof: the samples per step are unknown here: fitprof could not read")
    assert log.work().samples_per_step != log.work().samples_per_step  # NaN: one step's count is unknown
