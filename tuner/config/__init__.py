"""The configuration layer: YAML files, the search space, experiments, config patching."""
