"""Search spaces: which config keys a study tunes, and how (search_space/*.yaml).

A search space is data. Each entry of ``params`` names a dotted path into one of the
target's config files and says how to sample it::

    file: 0                          # default config file (index into target.config_files, or a path)
    params:
      fusion.method: {type: categorical, choices: [rrf, linear]}
      fusion.rrf_k:  {type: int, low: 5, high: 200, log: true, when: {fusion.method: rrf}}
      fusion.weights: {type: simplex, components: [bm25, dense]}
      fallback.windows_days:
        type: ordered
        length: 2
        first: {low: 7, high: 60}
        gap: {low: 1, high: 180}
      rag.min_confidence: {type: float, low: 0.2, high: 0.9, gate: confidence}   # solved per trial
    fixed:
      sources.bm25.depth: 100

Public API (used by the study and ``tuner apply``)::

    loading.load_space(path, config_files=()) -> SearchSpace
    SearchSpace.validate_against(configs, names=()) -> list[str]      # warnings; ConfigError on errors
    SearchSpace.suggest(trial) -> Assignment                           # includes fixed values
    SearchSpace.params_for(assignment) -> dict[str, Any]               # for study.enqueue_trial
    SearchSpace.current_assignment(configs) -> Assignment              # the baseline: the file's values
    SearchSpace.as_found(assignment, configs) -> Assignment            # unchanged keys carry the file's values
    SearchSpace.distributions() -> dict[str, BaseDistribution]         # every Optuna param it may suggest
    SearchSpace.distributions_for(params) -> dict[str, BaseDistribution]  # for create_trial(params=...)
    SearchSpace.edits(assignment) -> dict[int, dict[str, Any]]         # file index -> {dotted path: value}
    SearchSpace.active(name, assignment) -> bool
    SearchSpace.post_retrieval -> frozenset[str]                       # gate-only param names
    ParamSpec.gate -> "confidence" | "min_score" | None                # a gate's role

Optuna parameters are an internal encoding of an assignment: a scalar param is one
Optuna param of the same name and value; a ``simplex`` is stick-broken (simplex.py); an
``ordered`` group is a first value and gaps or ratios (ordered.py).

A parameter with ``when: {other: value | [values]}`` is active only when every named
parameter is active and has one of those values; an inactive parameter is neither
suggested nor written (the config keeps its value).

A *gate* (``gate: confidence`` or ``gate: min_score``, which implies ``post_retrieval``)
only filters what one retrieval returned, so tuner.study.gates.threshold solves it per trial
instead of sampling it. On the reference backend's own keys (``gates.REFERENCE_GATES``)
``post_retrieval: true`` alone implies the role.

Modules, bottom up: ``values`` (comparing config values), ``distributions`` (Optuna
helpers), ``gates`` (gate roles), ``kind`` (the parameter-kind interface), one module
per family of kinds (``scalars``, ``simplex``, ``ordered``), ``params`` (the kind union
and ParamSpec), ``checks`` (cross-param checks), ``searchspace`` (SearchSpace),
``loading`` (load_space).
"""
