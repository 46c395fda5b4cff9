"""fusion_backend: the reference hybrid search service that fusion-tuner tunes.

BM25 + dense (LSA) retrieval, RRF / linear fusion, a confidence handoff gate, a
citation threshold and progressive date fallback, all driven by ``config.yaml``.
Start it with ``python -m fusion_backend serve --config PATH``.
"""

__version__ = "0.1.0"
