"""Where a study lives: Optuna storage, locks, the study queue, the result cache."""
