"""The study: storage, locks, the loop, one trial, pruning, gate solving, the result cache."""
