"""One name per parameter for people: the study seen through tuner.study.storage.user_view
lists config keys only (``fusion.weights.bm25``), never the samplers' coordinates
(``fusion.weights:bm25``), while the storage itself keeps the coordinates the samplers
need. Checked on a real SQLite study whose trials are suggested and recorded as the trial
runner does (SearchSpace.suggest, record_applied_params), through the view itself,
`tuner report`'s importances and trials.csv, and optuna-dashboard's own WSGI app as
`tuner dashboard` serves it (its param importances and study detail API)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from support.constrained_study import constrained_study
from support.optuna_dashboard import optuna_dashboard

from tuner.config.space.kind import is_coordinate
from tuner.config.space.loading import load_space
from tuner.ops import analysis
from tuner.ops.dashboard_server import dashboard_app
from tuner.optuna_adapter import contains, storage_of, study_id_of, trial_id_of
from tuner.study.storage.user_view import UserView, envelope, user_study
from tuner.study.trial.applied_params import record_applied_params

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = [
    pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
    pytest.mark.filterwarnings("ignore:Some regimes for parameter:UserWarning"),  # PED-ANOVA on 24 trials
]

# Three sources: a stick-breaking coordinate is then not the weight it encodes.
SPACE = """\
params:
  fusion.weights: {type: simplex, components: [bm25, dense, sparse]}
  fallback.windows_days:
    type: ordered
    length: 2
    first: {low: 7, high: 60}
    gap: {low: 1, high: 200}
  fusion.rrf_k: {type: int, low: 1, high: 200}
"""
CONFIG_KEYS = {
    "fusion.weights.bm25",
    "fusion.weights.dense",
    "fusion.weights.sparse",
    "fallback.windows_days.0",
    "fallback.windows_days.1",
    "fusion.rrf_k",
}
COORDINATES = {"fusion.weights:bm25", "fusion.weights:dense", "fallback.windows_days:first",
               "fallback.windows_days:gap1"}
N_TRIALS = 24


@pytest.fixture(scope="module")
def study_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("user-view")
    (root / "space.yaml").write_text(SPACE)
    space = load_space(root / "space.yaml")
    url = f"sqlite:///{root / 'study.db'}"
    # made in memory, then copied: told call by call on SQLite the two studies took 18-24 s
    study = optuna.create_study(study_name="keys", direction="maximize", sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(N_TRIALS):
        trial = study.ask()
        assignment = space.suggest(trial)
        skipped = record_applied_params(trial, assignment, space.distributions())
        assert skipped == []
        # the bm25 weight decides the score: the importances must name it
        study.tell(trial, 10 * assignment["fusion.weights"]["bm25"] + 0.001 * assignment["fusion.rrf_k"])
    # "bare", the same trials again: optuna-dashboard caches importances per study id
    # in the process, so the bare storage's dashboard gets a study of its own
    for name in ("keys", "bare"):
        optuna.copy_study(from_study_name="keys", from_storage=storage_of(study), to_storage=url, to_study_name=name)
    return url


@pytest.fixture
def study(study_url: str) -> optuna.Study:
    return optuna.load_study(study_name="keys", storage=study_url)


def test_the_storage_keeps_the_samplers_coordinates(study: optuna.Study) -> None:
    # what the samplers learn from stays as it was: the view changes nothing underneath
    for t in study.trials:
        assert COORDINATES <= set(t.params)
        assert CONFIG_KEYS <= set(t.params)


def test_the_view_lists_config_keys_only_with_the_applied_values(study: optuna.Study) -> None:
    raw = {t.number: t for t in study.trials}
    seen = user_study(study).trials
    assert len(seen) == N_TRIALS
    for t in seen:
        assert set(t.params) == CONFIG_KEYS, t.number
        assert not any(is_coordinate(n) for n in t.distributions)
        assert {n: raw[t.number].params[n] for n in CONFIG_KEYS} == t.params  # the values written to the config
        assert t.values == raw[t.number].values and t.user_attrs == raw[t.number].user_attrs
    # one distribution per key across the trials (the importance evaluators need it),
    # holding every trial's value
    for name in CONFIG_KEYS:
        dists = {repr(t.distributions[name]) for t in seen}
        assert len(dists) == 1, name
        dist = seen[0].distributions[name]
        assert all(contains(dist, t.params[name]) for t in seen), name
    assert set(user_study(study).best_trial.params) == CONFIG_KEYS
    one = UserView(storage_of(study)).get_trial(trial_id_of(study.trials[0]))
    assert set(one.params) == CONFIG_KEYS


def test_envelope_of_one_point_and_declared_distributions() -> None:
    assert envelope([FloatDistribution(0.2, 0.2), FloatDistribution(0.7, 0.7)]) == FloatDistribution(0.2, 0.7)
    assert envelope([IntDistribution(3, 3), IntDistribution(1, 10, step=3)]) == IntDistribution(1, 10)
    same = FloatDistribution(0.0, 1.0, step=0.05)
    assert envelope([same, same]) == same
    assert envelope([FloatDistribution(0.2, 0.2), IntDistribution(1, 1)]) is None


def test_writes_go_through_the_view(study: optuna.Study) -> None:
    # the dashboard's own writes (a note, a study attr) reach the storage
    view = UserView(storage_of(study))
    view.set_study_user_attr(study_id_of(study), "seen_by", "dashboard")
    assert optuna.load_study(study_name="keys", storage=storage_of(study)).user_attrs["seen_by"] == "dashboard"


def test_report_importances_and_csv_name_config_keys_only(study: optuna.Study, tmp_path: Path) -> None:
    imp = analysis.param_importances(study)
    assert imp and set(imp) <= CONFIG_KEYS
    assert next(iter(imp)) in {"fusion.weights.bm25", "fusion.weights.dense", "fusion.weights.sparse"}
    paths = analysis.write_study_report(analysis.trials_frame(study.trials), tmp_path, study_name="keys",
                                        objective="value", maximize=True, importances=imp)
    header = paths.csv.read_text().splitlines()[0].split(",")
    assert not [c for c in header if c.startswith(analysis.PARAM_PREFIX) or is_coordinate(c)]
    assert {"fusion.weights.bm25", "fusion.rrf_k"} <= set(header)


def _get(app: Any, path: str) -> tuple[str, Any]:
    """One GET to a WSGI app, as a server would make it: (status, JSON body)."""
    from wsgiref.util import setup_testing_defaults

    path, _, query = path.partition("?")
    environ: dict[str, Any] = {"PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": "GET",
                               "wsgi.errors": io.StringIO()}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    return status[0], json.loads(body)


def _names(study_url: str, study_id: int, app: Any) -> dict[str, set[str]]:
    status, imp = _get(app, f"/api/studies/{study_id}/param_importances")
    assert status.startswith("200"), imp
    status, detail = _get(app, f"/api/studies/{study_id}")
    assert status.startswith("200"), detail
    return {
        "importance": {p["name"] for p in imp["param_importances"][0]},
        "union": {p["name"] for p in detail["union_search_space"]},
        "intersection": {p["name"] for p in detail["intersection_search_space"]},
        "trial params": {p["name"] for t in detail["trials"] for p in t["params"]},
    }


def test_optuna_dashboard_as_tuner_serves_it_lists_config_keys_only(study: optuna.Study, study_url: str) -> None:
    names = _names(study_url, study_id_of(study), dashboard_app(study_url))
    assert names["importance"] and names["importance"] <= CONFIG_KEYS, names
    assert names["union"] == names["intersection"] == names["trial params"] == CONFIG_KEYS, names


def test_optuna_dashboard_on_the_bare_storage_lists_coordinates(study: optuna.Study, study_url: str) -> None:
    # why the view exists: on the storage itself the dashboard lists the samplers'
    # coordinates beside the config keys (the importance plot ranks only them)
    import optuna_dashboard

    bare = optuna.load_study(study_name="bare", storage=study_url)
    names = _names(study_url, study_id_of(bare), optuna_dashboard.wsgi(study_url))
    assert COORDINATES <= names["trial params"] and COORDINATES <= names["union"]
    assert names["importance"] & COORDINATES, names



def _best_numbers(app: Any, study: optuna.Study) -> list[int]:
    status, detail = _get(app, f"/api/studies/{study_id_of(study)}")
    assert status.startswith("200"), detail
    return [t["number"] for t in detail["best_trials"]]


def test_the_best_trial_card_names_the_best_feasible_trial(tmp_path: Path) -> None:
    """optuna-dashboard's Best Trial card and badge come from the study answer's
    ``best_trials``: served as `tuner dashboard` serves it, the best *feasible* trial."""
    import optuna_dashboard

    url = f"sqlite:///{tmp_path / 'study.db'}"
    # trial 1 scores highest but breaks its constraint; trial 2 is the best feasible one
    study = constrained_study(url, "card", [(0.30, -0.05), (0.47, 0.20), (0.41, 0.0), (0.35, -0.1)])
    assert _best_numbers(optuna_dashboard.wsgi(url), study) == [1]  # the dashboard on its own: the top score
    assert _best_numbers(dashboard_app(url), study) == [2]
    view = UserView(storage_of(study))
    assert view.get_best_trial(study_id_of(study)).number == 2
    assert user_study(study).best_trial.number == 2 == study.best_trial.number  # Optuna's own rule agrees


def test_with_no_feasible_trial_the_card_is_empty_and_the_page_still_answers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = constrained_study(url, "none", [(0.30, 0.05), (0.47, 0.20)])
    assert _best_numbers(dashboard_app(url), study) == []
    status, detail = _get(dashboard_app(url), f"/api/studies/{study_id_of(study)}?after=1")
    assert status.startswith("200") and [t["number"] for t in detail["trials"]] == [1]
    # Optuna's storage contract still holds for other readers: the best value, ValueError on no COMPLETE trial
    assert UserView(storage_of(study)).get_best_trial(study_id_of(study)).number == 1
    empty = optuna.create_study(storage=url, study_name="empty", direction="maximize")
    with pytest.raises(ValueError):
        UserView(storage_of(empty)).get_best_trial(study_id_of(empty))
    assert _best_numbers(dashboard_app(url), empty) == []


def test_tuner_optuna_dashboard_serves_config_keys_over_http(study: optuna.Study, study_url: str,
                                                             tmp_path: Path) -> None:
    # the process `tuner dashboard` starts (tuner.ops.dashboard_specs), over real HTTP
    import httpx

    with optuna_dashboard(study_url, artifact_dir=tmp_path / "artifacts") as page:
        base = page.removesuffix("/dashboard/")
        answer = httpx.get(f"{base}/api/studies/{study_id_of(study)}/param_importances", timeout=60)
        assert answer.status_code == 200, answer.text
        names = {p["name"] for p in answer.json()["param_importances"][0]}
        assert names and names <= CONFIG_KEYS, names
        page_answer = httpx.get(page, timeout=30)
        assert page_answer.status_code == 200 and "<html" in page_answer.text.lower()


def test_a_port_in_use_and_a_dead_storage_are_one_line_errors(study_url: str) -> None:
    import socket

    from tuner.errors import ConfigError, StudyError
    from tuner.ops.dashboard_server import listen

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"cannot listen on 127.0.0.1:{port} .*; pick another --port"):
            listen(dashboard_app(study_url), host="127.0.0.1", port=port)
    with pytest.raises(StudyError, match=r"storage postgresql://u:\*\*\*@127.0.0.1:1/db: cannot open it .*check the URL"):
        dashboard_app("postgresql://u:secret@127.0.0.1:1/db")
