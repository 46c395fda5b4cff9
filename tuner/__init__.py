"""fusion-tuner: overnight Optuna tuning of hybrid search / RAG retrieval backends."""

__version__ = "0.1.0"
