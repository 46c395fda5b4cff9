"""One trial, end to end: the runner and its collaborators (cache lookup, measure, scoring, records)."""
