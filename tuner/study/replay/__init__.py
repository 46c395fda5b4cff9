"""The fusion search of a replay trial: settings scored from one explained retrieval."""
