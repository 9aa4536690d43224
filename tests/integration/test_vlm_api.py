"""An OpenAI-compatible endpoint named in the suite YAML is evaluated with no code change: a
local HTTP server on 127.0.0.1 plays the model; failures are counted rows outside every
denominator; a re-run keeps the answered rows and retries only the failed ones."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from medrobust_lib.config import Suite, load_suite
from medrobust_lib.config.taxonomy import TaxonomyConfig
from medrobust_lib.store import results
from medrobust_lib.store.completeness import partition_error_share
from medrobust_lib.store.marts import build_mart, connect_readonly
from medrobust_lib.store.schema import VLM_TABLE
from medrobust_lib.tracks.datasets import build_clean_index
from medrobust_lib.tracks.vlm.evaluate import ROW_KEY, evaluate_clean, evaluate_perturbed
from tests.http_fakes import FakeEndpoint, completion, prompt_of, read_json, send_json, serving
from tests.suite_helpers import write_suite


class _Fake(FakeEndpoint):
    hits = 0
    organ_fails = True
    """Whether the anatomy questions ("Which organ ...") get HTTP 500 (an outage of part of the service)."""
    organ_hits = 0
    fail_with_image: str | None = None
    """Requests with an image whose text contains this string get HTTP 500."""
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        body = read_json(self)
        with _Fake.lock:
            _Fake.hits += 1
        with_image = isinstance(body["messages"][-1]["content"], list)
        text = prompt_of(body)
        status, payload = 200, None
        if _Fake.fail_with_image is not None and with_image and _Fake.fail_with_image in text:
            status, payload = 500, {"error": "overloaded"}
        elif text.startswith("A model answered a multiple-choice question"):
            payload = completion("C")
        elif "In which part" in text:  # lesion-location MC: an answer the rules cannot parse
            payload = completion("somewhere near the edge")
        elif text.startswith("Rewrite the following yes/no question"):
            q = text.split("Question: ", 1)[1].strip()
            lines = [f"In this image, {q[0].lower()}{q[1:]}", "What is shown here?", f"Honestly, {q[0].lower()}{q[1:]}"]
            payload = completion("\n".join(lines))
        elif "Which organ" in text and _Fake.organ_fails:
            with _Fake.lock:
                _Fake.organ_hits += 1
            status, payload = 500, {"error": "overloaded"}  # every anatomy MC question fails
        elif "yes or no" in text:
            top = [{"token": "Yes", "logprob": -0.2}, {"token": "No", "logprob": -1.8}]
            lp = {"content": [{"token": "Yes", "logprob": -0.2, "top_logprobs": top}]}
            payload = completion("Yes", logprobs=lp if body.get("logprobs") else None)
        else:
            payload = completion("B" if "letter" in text else "[0.1, 0.1, 0.5, 0.5]" if "box" in text
                                 else "CT image of the chest showing a small lesion.")
        send_json(self, payload, status)


@pytest.fixture
def endpoint() -> Iterator[str]:
    with serving(_Fake) as url:
        yield url


@pytest.fixture
def api_suite(tmp_path: Path, demo_root: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Suite:
    monkeypatch.setenv("FAKE_VLM_KEY", "sk-test-secret")
    vlm = {"models": [{"id": "fake-gpt", "kind": "api",
                       "api": {"model": "fake-gpt", "base_url": endpoint, "api_key_env": "FAKE_VLM_KEY",
                               "max_retries": 1, "backoff_base_s": 0.01, "backoff_max_s": 0.02,
                               "timeout_s": 5, "concurrency": 4}}],
           "split": "all"}
    suite = load_suite(write_suite(tmp_path, demo_root, modalities=["ct"], vlm=vlm))
    build_clean_index(suite, "ct")
    return suite


def test_api_model_from_yaml(api_suite: Suite) -> None:
    s = api_suite
    _Fake.hits = 0
    out = evaluate_clean(s, "fake-gpt", "ct")
    first = _Fake.hits
    df = results.read_table(s.results_dir, VLM_TABLE)
    assert out.n_rows == len(df) and first > 0
    anatomy = df[df["record_id"].isin(df[df["outcome"] == "error"]["record_id"])]
    # infrastructure failures are not answers: no prediction, no score
    assert len(anatomy) > 0 and anatomy["correct"].isna().all() and anatomy["task"].eq("vqa_mc").all()
    assert anatomy["prediction"].isna().all()
    assert anatomy["error"].str.contains("http_error").all()
    yn = df[df["task"] == "vqa_yesno"]
    assert yn["source"].eq("logprobs").all() and yn["parsed"].eq("yes").all()
    assert yn["margin"].round(6).eq(1.6).all()
    mc_ok = df[(df["task"] == "vqa_mc") & (df["outcome"] == "ok")]
    assert mc_ok["parsed"].eq("B").all()
    gr = df[df["task"] == "grounding"]
    assert gr["box_scale"].eq("0-1").all() and gr["outcome"].eq("ok").all()
    unp = df[df["outcome"] == "unparseable"]
    assert len(unp) > 0 and unp["judge_model"].isna().all()  # the judge is off by default
    # the key never reaches a row
    assert not df.astype(str).apply(lambda c: c.str.contains("sk-test-secret")).any().any()
    # a re-run keeps the answered rows (0 HTTP calls for them) and retries only the failures
    n_failed = int((df["outcome"] == "error").sum())
    _Fake.hits = 0
    again = evaluate_clean(s, "fake-gpt", "ct")
    assert again.n_rows == out.n_rows and again.n_reused == out.n_rows - n_failed
    assert _Fake.hits == n_failed * 2  # failed requests are not cached: each is retried once again
    df2 = results.read_table(s.results_dir, VLM_TABLE)
    assert len(df2) == len(df) and int((df2["outcome"] == "error").sum()) == n_failed


def _identity(df: pd.DataFrame) -> pd.DataFrame:
    """The rows' keys and answers, sorted, for comparing two reads of a partition."""
    cols = [*ROW_KEY, "outcome", "prediction", "parsed", "correct"]
    return df[cols].astype(str).sort_values(list(ROW_KEY)).reset_index(drop=True)


def test_outage_marks_the_partition_incomplete_and_a_rerun_retries_only_the_errors(
        api_suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    """First run: the anatomy questions fail (HTTP 500 after the retry) -> error rows, the partition's
    error share is above max_error_share, its check fails and the mart leaves it out. An interrupted
    re-run leaves the stored rows as they were. The service recovers: the re-run sends requests for
    the error rows only, keeps every other row unchanged, and the partition becomes complete."""
    s = api_suite
    part = {"model": "fake-gpt", "run": "clean", "modality": "ct", "level": 0}
    _Fake.organ_fails, _Fake.hits, _Fake.organ_hits = True, 0, 0
    try:
        first = evaluate_clean(s, "fake-gpt", "ct")
        df1 = results.read_partition(s.results_dir, VLM_TABLE, part)
        errors = df1[df1["outcome"] == "error"]
        n_err = len(errors)
        assert n_err > 0 and _Fake.organ_hits == 2 * n_err and first.outcomes["error"] == n_err
        share = partition_error_share(s.results_dir, VLM_TABLE, part, s.max_error_share)
        attempted = int((~df1["outcome"].str.startswith("excluded:")).sum())
        assert (share.n_error, share.n_attempted) == (n_err, attempted)
        assert share.error_share == pytest.approx(n_err / attempted) and share.error_share > 0.02
        assert not share.complete
        build_mart(s.results_dir, s.mart_path, s.max_error_share)
        con = connect_readonly(s.mart_path)
        try:
            assert con.execute("select model, modality, level, n_error from incomplete_partitions").fetchall() == [
                ("fake-gpt", "ct", 0, n_err)]
            assert con.execute("select count(*) from vlm_by_level").fetchall() == [(0,)]
        finally:
            con.close()

        # an interrupted re-run (killed while asking) writes nothing: the stored rows stay as they were
        _Fake.organ_fails = False
        from medrobust_lib.tracks.vlm import evaluate as vlm_mod

        def killed(*args: Any, **kwargs: Any) -> Any:
            raise KeyboardInterrupt

        with monkeypatch.context() as mp:
            mp.setattr(vlm_mod, "ask", killed)
            with pytest.raises(KeyboardInterrupt):
                evaluate_clean(s, "fake-gpt", "ct")
        pd.testing.assert_frame_equal(_identity(results.read_partition(s.results_dir, VLM_TABLE, part)),
                                      _identity(df1))

        # the service is back: only the error rows are asked again
        _Fake.hits = 0
        again = evaluate_clean(s, "fake-gpt", "ct")
        assert _Fake.hits == n_err and again.n_reused == len(df1) - n_err
        df2 = results.read_partition(s.results_dir, VLM_TABLE, part)
        assert len(df2) == len(df1) and not df2.duplicated(list(ROW_KEY)).any()
        assert (df2["outcome"] != "error").all()
        keep = ~df1["outcome"].eq("error")
        kept_keys = set(map(tuple, df1.loc[keep, list(ROW_KEY)].astype(str).to_numpy()))
        before = _identity(df1[keep])
        after = _identity(df2[[tuple(k) in kept_keys for k in df2[list(ROW_KEY)].astype(str).to_numpy()]])
        pd.testing.assert_frame_equal(after, before)  # the answered rows are kept as they were
        retried = df2[df2["record_id"].isin(errors["record_id"])]
        assert retried["outcome"].eq("ok").all() and retried["parsed"].eq("B").all()
        assert partition_error_share(s.results_dir, VLM_TABLE, part, s.max_error_share).complete

        # a third run has nothing to retry: no request at all
        _Fake.hits = 0
        evaluate_clean(s, "fake-gpt", "ct")
        assert _Fake.hits == 0
        pd.testing.assert_frame_equal(_identity(results.read_partition(s.results_dir, VLM_TABLE, part)),
                                      _identity(df2))
    finally:
        _Fake.organ_fails = True


def test_perturbed_rerun_retries_only_the_errors(api_suite: Suite) -> None:
    """The same on a perturbed partition (regenerated images): errors retried, nothing duplicated."""
    from medrobust_lib.tracks.perturbed import build_perturbed

    s = api_suite.model_copy(update={"perturbations": api_suite.perturbations.model_copy(
        update={"include": ["gaussian_noise"], "levels": [2]})})
    build_perturbed(s, "ct", 2)
    part = {"model": "fake-gpt", "run": "perturbation", "modality": "ct", "level": 2}
    _Fake.organ_fails = True
    try:
        evaluate_perturbed(s, "fake-gpt", "ct", 2)
        df1 = results.read_partition(s.results_dir, VLM_TABLE, part)
        n_err = int((df1["outcome"] == "error").sum())
        assert n_err > 0 and set(df1["perturbation"]) == {"gaussian_noise"}
        _Fake.organ_fails, _Fake.hits = False, 0
        again = evaluate_perturbed(s, "fake-gpt", "ct", 2)
        assert _Fake.hits == n_err and again.n_reused == len(df1) - n_err
        df2 = results.read_partition(s.results_dir, VLM_TABLE, part)
        assert len(df2) == len(df1) and not df2.duplicated(list(ROW_KEY)).any() and (df2["outcome"] != "error").all()
    finally:
        _Fake.organ_fails = True


def test_taxonomy_rerun_retries_only_the_images_with_errors(api_suite: Suite) -> None:
    """Taxonomy partitions follow the same rule: an outage on one question wording gives error rows
    (share above the limit: incomplete); the re-run scores only the images that have an error row
    and keeps every other row as it was."""
    from medrobust_lib.store.schema import TAXONOMY_TABLE
    from medrobust_lib.tracks.taxonomy import evaluate as tx
    from medrobust_lib.tracks.vlm.items import load_items

    s = api_suite.model_copy(update={"taxonomy": TaxonomyConfig.model_validate(
        {"configs": [{"id": "fake", "model": "fake-gpt"}], "min_paraphrases": 2, "split": "all"})})
    part = {"config": "fake", "run": "clean", "modality": "ct", "level": 0}
    key = list(tx.ROW_KEY)
    tx.compute_baselines(s, "fake", "ct")
    questions = Counter(it.question for it in load_items(s).items if it.task == "vqa_yesno" and it.modality == "ct")
    _Fake.fail_with_image = questions.most_common(1)[0][0]  # a wording asked about several images
    try:
        first = tx.evaluate(s, "fake", "ct", 0)
    finally:
        _Fake.fail_with_image = None
    df1 = results.read_partition(s.results_dir, TAXONOMY_TABLE, part)
    err = df1[df1["outcome"] == "error"]
    assert 0 < len(err) < len(df1) and first.outcomes["error"] == len(err)
    assert not partition_error_share(s.results_dir, TAXONOMY_TABLE, part, s.max_error_share).complete
    bad_images = set(zip(err["dataset"], err["sample_id"], strict=True))
    again = tx.evaluate(s, "fake", "ct", 0)
    assert again.n_images == len(bad_images) < first.n_images  # only images with an error row
    df2 = results.read_partition(s.results_dir, TAXONOMY_TABLE, part)
    assert len(df2) == len(df1) and not df2.duplicated(key).any() and (df2["outcome"] == "ok").all()
    ok1 = df1[df1["outcome"] == "ok"].set_index(key).sort_index()
    ok2 = df2.set_index(key).loc[ok1.index].sort_index()
    pd.testing.assert_series_equal(ok2["quadrant"], ok1["quadrant"])
    assert partition_error_share(s.results_dir, TAXONOMY_TABLE, part, s.max_error_share).complete
    assert tx.evaluate(s, "fake", "ct", 0).n_images == 0  # nothing left to retry
    # the endpoint returns top log-probabilities: the API model's rows carry the screening signals
    from medrobust_lib.taxonomy.confidence_screening import NOT_AVAILABLE, screening_stats

    screening = screening_stats(df2)
    assert len(screening) and (screening["n_no_signal"] == 0).all() and NOT_AVAILABLE not in set(screening["status"])


def test_api_paraphraser_feeds_the_taxonomy(api_suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    from medrobust_lib.tracks.taxonomy import evaluate as tx
    from medrobust_lib.tracks.vlm.items import load_items

    s = api_suite.model_copy(update={"taxonomy": TaxonomyConfig.model_validate(
        {"configs": [{"id": "fake", "model": "fake-gpt"}], "min_paraphrases": 8, "api_paraphraser": "fake-gpt"})})
    items = [it for it in load_items(s).items if it.task == "vqa_yesno"][:3]
    _Fake.hits = 0
    variants, audit = tx.paraphrase_sets(s, items)
    assert _Fake.hits == 3
    for it in items:
        vs = variants[it.record_id]
        assert len(vs) - 1 >= 8 and vs[0] == (it.question, 1)
        assert any(t.startswith("In this image,") and p == 1 for t, p in vs)
        assert not any(t == "What is shown here?" for t, _ in vs)  # rejected by the equivalence filter
    reasons = {a["reason"] for a in audit if not a["accepted"]}
    assert "low_overlap" in reasons and sum(a["accepted"] for a in audit) == 2 * 3
    _Fake.hits = 0
    again, _ = tx.paraphrase_sets(s, items)
    assert again == variants and _Fake.hits == 0  # cached


def test_optional_judge_is_recorded_separately(api_suite: Suite) -> None:
    s = api_suite.model_copy(update={"vlm": api_suite.vlm.model_copy(update={"judge": "fake-gpt"})})
    evaluate_clean(s, "fake-gpt", "ct")
    df = results.read_table(s.results_dir, VLM_TABLE)
    unp = df[df["outcome"] == "unparseable"]
    assert len(unp) > 0 and unp["judge_model"].eq("fake-gpt").all() and unp["judge_parsed"].eq("C").all()
    assert unp["correct"].eq(0.0).all()  # the rule-based score is unchanged
    assert set(unp["judge_correct"]) <= {0.0, 1.0}
    assert df[df["outcome"] != "unparseable"]["judge_model"].isna().all()
