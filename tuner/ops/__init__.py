"""Operations on a study: run, worker, check, validate, apply, dashboard, demo, analysis, label queue."""
