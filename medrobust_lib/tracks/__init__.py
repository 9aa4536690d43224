"""One sub-package per asset family; one public function per asset (no Dagster)."""
