"""Grounding: box parsing, scale detection, pixel conversion and metrics with known answers."""

from __future__ import annotations

import pytest

from medrobust_lib.vlm_tasks.grounding import box_iou, detect_scale, grounding_metrics, parse_box, to_pixels


@pytest.mark.parametrize(
    ("text", "box"),
    [
        ("[10, 20, 30, 40]", (10, 20, 30, 40)),
        ("The lesion is at [0.12, 0.3, 0.5, 0.75].", (0.12, 0.3, 0.5, 0.75)),
        ("(10,20),(30,40)", (10, 20, 30, 40)),
        ("from (10, 20) to (30, 40)", (10, 20, 30, 40)),
        ("<box>[5, 6, 7, 8]</box>", (5, 6, 7, 8)),
        ("<box>(5,6),(7,8)</box>", (5, 6, 7, 8)),
        ("<|object_ref_start|>tumor<|object_ref_end|><|box_start|>(123,456),(789,999)<|box_end|>",
         (123, 456, 789, 999)),
        ("first [1, 2, 3, 4] then [5, 6, 7, 8]", (1, 2, 3, 4)),
        ("(1,2),(3,4) and later [5, 6, 7, 8]", (1, 2, 3, 4)),
        ("[5, 6, 7, 8] and later (1,2),(3,4)", (5, 6, 7, 8)),
        ("No box here.", None),
        ("[1, 2, 3]", None),
        ("<box>1, 2</box>", None),
    ],
)
def test_parse_box(text: str, box: tuple[float, ...] | None) -> None:
    got = parse_box(text)
    assert got == (None if box is None else tuple(float(v) for v in box))


def test_detect_scale() -> None:
    assert detect_scale((0.1, 0.2, 0.5, 1.0), (512, 512)) == "0-1"
    assert detect_scale((100, 200, 800, 900), (512, 512)) == "0-1000"
    assert detect_scale((100, 200, 300, 400), (512, 512)) == "pixels"  # documented ambiguity
    assert detect_scale((100, 200, 1500, 1800), (2048, 2048)) == "pixels"
    assert detect_scale((100, 200, 800, 1200), (512, 512)) == "pixels"  # > 1000 cannot be 0-1000
    assert detect_scale((100, 200, 300, 400), (512, 512), declared_scale="0-1000") == "0-1000"
    with pytest.raises(ValueError, match="valid choices"):
        detect_scale((1, 2, 3, 4), (10, 10), declared_scale="percent")
    with pytest.raises(ValueError, match="height, width"):
        detect_scale((1, 2, 3, 4), (10,))


def test_to_pixels() -> None:
    assert to_pixels((0.25, 0.5, 0.75, 1.0), "0-1", (200, 400)) == (100.0, 100.0, 300.0, 200.0)
    assert to_pixels((250, 500, 750, 1000), "0-1000", (200, 400)) == (100.0, 100.0, 300.0, 200.0)
    assert to_pixels((30, 40, 10, 20), "pixels", (100, 100)) == (10.0, 20.0, 30.0, 40.0)  # sorted
    assert to_pixels((-5, -5, 150, 50), "pixels", (100, 120)) == (0.0, 0.0, 120.0, 50.0)  # clipped
    with pytest.raises(ValueError, match="valid choices"):
        to_pixels((0, 0, 1, 1), "px", (10, 10))


def test_box_iou() -> None:
    assert box_iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert box_iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert box_iou((0, 0, 10, 10), (10, 10, 20, 20)) == 0.0  # touching edges: exclusive end
    assert box_iou((0, 0, 10, 10), (2, 2, 4, 4)) == pytest.approx(4 / 100)
    assert box_iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0


def test_grounding_metrics() -> None:
    m = grounding_metrics([1.0, 0.6, 0.5, 0.2, None])
    assert m == {
        "acc@0.5": pytest.approx(3 / 5),
        "acc@0.75": pytest.approx(1 / 5),
        "mean_iou": pytest.approx(2.3 / 5),
        "n": 5,
        "n_unparseable": 1,
    }
    assert grounding_metrics([None])["mean_iou"] == 0.0
    with pytest.raises(ValueError, match="at least one"):
        grounding_metrics([])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        grounding_metrics([1.5])


def test_end_to_end_qwen_answer() -> None:
    text = "<|box_start|>(250,500),(750,1000)<|box_end|>"
    box = parse_box(text)
    assert box is not None
    scale = detect_scale(box, (200, 400), declared_scale="0-1000")
    px = to_pixels(box, scale, (200, 400))
    assert box_iou(px, (100, 100, 300, 200)) == 1.0
