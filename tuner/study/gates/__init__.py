"""Post-retrieval gates solved from one retrieval (pure numpy)."""
