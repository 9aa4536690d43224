"""Asset checks shared by several asset families."""

from typing import Any

import dagster as dg

from medrobust_lib.store.completeness import partition_error_share

ERROR_SHARE_CHECK = "error_share"


def error_share_spec(asset_key: list[str]) -> dg.AssetCheckSpec:
    """The ``error_share`` check of a partitioned asset that writes VLM or taxonomy answers."""
    return dg.AssetCheckSpec(
        ERROR_SHARE_CHECK, asset=dg.AssetKey(asset_key),
        description="Share of infrastructure errors (transport, retries exhausted, cache, out of memory, "
                    "exceptions) among the partition's attempted rows; fails (ERROR) above the suite's "
                    "max_error_share. The mart marks a failing partition complete = false and leaves it out of "
                    "every view until a re-run, which retries only the error rows.")


def error_share_result(suite: Any, table: str, asset_key: list[str], partition: dict[str, object]
                       ) -> dg.AssetCheckResult:
    """Evaluate ``error_share`` on the rows the asset just wrote to ``partition`` of ``table``."""
    share = partition_error_share(suite.results_dir, table, partition, suite.max_error_share)
    meta = {k: (None if isinstance(v, float) and v != v else v) for k, v in share.metadata().items()}
    return dg.AssetCheckResult(check_name=ERROR_SHARE_CHECK, asset_key=dg.AssetKey(asset_key), passed=share.complete,
                               severity=dg.AssetCheckSeverity.ERROR,
                               metadata={k: v for k, v in meta.items() if v is not None})
