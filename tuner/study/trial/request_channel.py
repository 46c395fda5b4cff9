"""The request channel (``target.channel: request``): a trial's values travel in every
search request of its batch; no file is patched and the backend is never restarted.

`RequestWriter` is the trial's `ConfigWriter` for it. The declared request
(``evaluation.request``) is production as found: the values at the bound places
(tuner.evaluation.request_binding) make a virtual config document -- ``fusion.weights.bm25:
0.5`` becomes ``{fusion: {weights: {bm25: 0.5}}}`` -- against which the search space is
checked, its baseline read and its edits applied exactly as for a config file. A trial's
"config text" is the JSON of every bound key's value, so the result cache's key, the
config snapshot and MLflow all cover the request as sent. ``write`` writes nothing:
``request_of`` renders a trial's request from its own texts, and the measure stage hands
it to that trial's batch (tuner.study.trial.measure), so the rendered request travels
with its trial and nothing holds a "current" request -- trials measured at once
(`tuner run --parallel N`, tuner.study.parallel) each send only their own values.
`RequestServe` stands in for the reload applier: nothing to apply, one health answer
(the backend's data fingerprint, and that it is up).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.config.flatten import flatten
from tuner.errors import ConfigError
from tuner.evaluation.request_binding import RequestBinding
from tuner.evaluation.spec import RequestMapping
from tuner.files import display_path

if TYPE_CHECKING:
    from tuner.config.experiment import Experiment

#: the key of a trial's one "config text" (no file of that name is ever written)
REQUEST_TEXT = Path("<request>")


class RequestWriter:
    """`ConfigWriter` of the request channel (module doc)."""

    touches_backend = False  # nothing to restore on the backend at the end of a run

    def __init__(
        self,
        space: Any,
        binding: RequestBinding,
        declared: RequestMapping,
    ) -> None:
        self.space = space
        self.binding = binding
        self.declared_request = declared
        self.declared = declared_values(binding, declared)
        self.document = unflatten(self.declared)  # checked against the space by prepare (request_document_of)

    def as_found(self, assignment: Mapping[str, Any]) -> dict[str, Any]:
        return self.space.as_found(assignment, [self.document])

    def render(self, assignment: Mapping[str, Any]) -> dict[Path, str]:
        edits: dict[str, Any] = {}
        for per_file in self.space.edits(assignment).values():
            edits.update(per_file)
        values = {**self.declared, **flatten(edits)}
        return {REQUEST_TEXT: json.dumps(values, sort_keys=True, ensure_ascii=False)}

    def write(self, texts: Mapping[Path, str]) -> None:
        return None  # the values travel in the trial's own requests (request_of)

    def request_of(self, texts: Mapping[Path, str]) -> RequestMapping:
        """The declared request with a trial's values in their bound places (its batch sends it)."""
        return self.binding.render(self.declared_request, json.loads(texts[REQUEST_TEXT]))

    def request_of_snapshot(self, snapshot: str) -> RequestMapping:
        """The request of a trial's config snapshot (its one text): what its reports show."""
        return self.request_of({REQUEST_TEXT: snapshot})

    def values_of(self, texts: Mapping[Path, str]) -> dict[str, Any]:
        """Every bound key's value in a trial's texts (what `tuner apply` shows)."""
        return dict(json.loads(texts[REQUEST_TEXT]))


@dataclass(frozen=True)
class Served:
    """What `RequestServe.apply` did (the shape of tuner.targets.reload's answer)."""

    mode: str
    reason: str
    health: Any


class RequestServe:
    """Stands in for the reload applier of the file channel: the values are in the
    requests, so a trial only asks the backend's health (up, and its data fingerprint)."""

    def __init__(self, wait_healthy: Callable[[], Any]) -> None:
        self.wait_healthy = wait_healthy

    def prepare(self, texts: Mapping[Path, str]) -> None:
        return None

    def adopt(self, texts: Mapping[Path, str], health: Any) -> str | None:
        return None  # the backend serves what each request carries

    def close(self) -> None:
        return None

    def apply(self, texts: Mapping[Path, str], *, phase: Callable[[str], Any]) -> Served:
        with phase("health"):
            health = self.wait_healthy()
        return Served("request", "", health)


def binding_of(experiment: Experiment) -> RequestBinding:
    """The experiment's ``target.request.bind`` (channel: request)."""
    if experiment.target.request is None:
        raise ConfigError(f"{experiment.source}: target.channel: request needs target.request.bind")
    return RequestBinding.parse(experiment.target.request.bind)


def declared_values(binding: RequestBinding, request: RequestMapping) -> dict[str, Any]:
    """Each bound key's value in the declared request (a URL's or header's text read as
    the value it spells)."""
    return binding.declared(request, as_type=lambda _key, text: _typed(text))


def request_document_of(experiment: Experiment, space: Any) -> dict[str, Any]:
    """The declared request's bound values as one config document, after checking that
    every key the space tunes is bound (ConfigError before any trial otherwise)."""
    binding = binding_of(experiment)
    check_bound(space, binding)
    return unflatten(declared_values(binding, experiment.evaluation.request))


def request_writer_of(experiment: Experiment, space: Any) -> RequestWriter:
    return RequestWriter(space, binding_of(experiment), experiment.evaluation.request)


def check_bound(space: Any, binding: RequestBinding) -> None:
    """Every key the search space tunes is bound to a place in the request (a key tuned
    and never sent would score every trial the same)."""
    bound = set(binding.places)
    for p in space.params:
        if p.path in bound or any(key.startswith(p.path + ".") for key in bound):
            continue
        raise ConfigError(
            f"{display_path(space.source)}: {p.name}: target.request.bind has no place for {p.path}; bind it "
            f"(target.request.bind.{p.path}: body.<path in evaluation.request.body>) or drop it from the space"
        )


def unflatten(values: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1, "a.c.0": 2}`` -> ``{"a": {"b": 1, "c": [2]}}``: a node whose keys are
    0..n-1 is a list (tuner.config.flatten's rule, reversed)."""
    tree: dict[str, Any] = {}
    for key, value in values.items():
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"target.request.bind: {key} lies under {part}, which is bound to a single value")
        node[last] = value
    return _lists(tree)


def _lists(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    items = {k: _lists(v) for k, v in node.items()}
    if items and all(k.isdigit() for k in items) and sorted(int(k) for k in items) == list(range(len(items))):
        return [items[str(i)] for i in range(len(items))]
    return items


def _typed(text: str) -> Any:
    """A value from a URL or a header as the type it spells (``60`` -> 60, ``true`` ->
    True), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text
