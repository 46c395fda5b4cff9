"""The data layer: query sets, qrels, runs, the label cache, declared input files."""
