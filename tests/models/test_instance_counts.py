"""Per-box counts against an instance map (:mod:`medrobust_lib.models.instance_counts`): equal to
the dense K x H x W computation, including repeated targets, ids absent from the map, the
background id, empty masks and no boxes."""

from __future__ import annotations

import pytest
import torch

from medrobust_lib.models.instance_counts import box_counts, dense_box_counts


def _case(seed: int, k: int, h: int, w: int, n_inst: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    instances = torch.randint(0, n_inst + 1, (h, w), generator=g, dtype=torch.int32)
    masks = torch.rand(k, h, w, generator=g) > 0.6
    ids = torch.randint(0, n_inst + 3, (k,), generator=g, dtype=torch.int32)  # some absent, some 0
    return masks, instances, ids


@pytest.mark.parametrize(("seed", "k", "h", "w", "n_inst"), [(0, 1, 5, 7, 1), (1, 9, 16, 16, 4), (2, 40, 33, 21, 60),
                                                             (3, 125, 64, 64, 125)])
def test_equal_to_the_dense_counts(seed: int, k: int, h: int, w: int, n_inst: int) -> None:
    masks, instances, ids = _case(seed, k, h, w, n_inst)
    ids[0] = ids[-1]  # two boxes on one instance
    got = box_counts(masks, instances, ids)
    assert got.dtype == torch.int64 and got.shape == (k, 3)
    assert torch.equal(got, dense_box_counts(masks, instances, ids))
    assert int(got[:, 0].sum()) > 0  # the cases have overlaps to count


def test_edge_cases() -> None:
    instances = torch.tensor([[0, 2, 2], [5, 5, 0]], dtype=torch.int32)
    masks = torch.zeros(3, 2, 3, dtype=torch.bool)
    masks[0, 0, 1:] = True  # exactly instance 2
    masks[1, 1, 0] = True  # half of instance 5
    ids = torch.tensor([2, 5, 9], dtype=torch.int32)  # 9 is not in the map
    assert box_counts(masks, instances, ids).tolist() == [[2, 2, 2], [1, 1, 2], [0, 0, 0]]
    empty = box_counts(masks[:0], instances, ids[:0])
    assert empty.shape == (0, 3)
    negative = torch.tensor([-1, 2, 5], dtype=torch.int32)  # the dense fallback
    assert torch.equal(box_counts(masks, instances, negative), dense_box_counts(masks, instances, negative))
