"""The live evaluator of a trial: the experiment's query set run against the search
API (tuner.evaluation.run_batch) with the search calls timed (``BatchTiming.window_s``), and the
per-trial reports (tuner.report.write_reports); ``spec_fingerprint`` is the part of the
evaluation settings that keys the result cache.

It sits in tuner.study (not tuner.evaluation) because it writes reports (tuner.report),
records the preflight (tuner.study.preflight) and turns a stop into TrialInterrupted
(tuner.study.stop).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tuner.errors import EvaluationError
from tuner.study.preflight import PreflightReport
from tuner.study.stop import StopFlag, TrialInterrupted

if TYPE_CHECKING:
    from tuner.config.experiment import Experiment
    from tuner.data.dataset import QuerySet
    from tuner.evaluation.client import Abort
    from tuner.evaluation.mapping import RequestTemplates
    from tuner.evaluation.spec import EvalSpec, RequestMapping
    from tuner.report.build import Detail
    from tuner.report.report_worker import ReportWorker
    from tuner.report.writer import PrCurve


#: the per-request specs and built requests a live evaluator keeps (the latest ones)
_KEPT_REQUESTS = 8


class LiveEvaluator:
    """`BatchEvaluator` over the live search API (tuner.evaluation.run_batch) and the
    per-trial reports (tuner.report.write_reports)."""

    def __init__(
        self, experiment: Experiment, queries: QuerySet, qrels: Mapping[str, Mapping[str, int]], labels_fp: str
    ) -> None:
        self.experiment = experiment
        self.spec = experiment.evaluation
        self.queries = queries
        self.qrels = qrels
        # A subset (the tune split) shares its parent's content hash; its query ids keep
        # its cached results apart from the whole set's.
        ids = hashlib.sha256("\n".join(queries.query_ids).encode()).hexdigest()[:16]
        self.dataset_hash = f"{queries.content_hash}:{ids}"
        self.labels_fingerprint = labels_fp
        self.spec_fingerprint = spec_fingerprint(self.spec)
        #: trials measured at once against the backend (`tuner run --parallel N`): each batch
        #: gets ``evaluation.concurrency // share`` (at least 1) of the concurrency budget
        self.share = 1
        # The queries' requests per request sent (channel: request: one per trial's values),
        # built at a batch's start and kept for the few latest: a study re-sends the same ones.
        self._built: dict[str, tuple[EvalSpec, RequestTemplates]] = {}
        self._built_lock = threading.Lock()
        # The last batch's timing, per thread: parallel trials (tuner.study.parallel) each
        # measure on a thread of their own and read their own batch's window.
        self._timing = threading.local()
        #: channel: request: a trial's request from its config snapshot (tuner.study.trial.request_channel),
        #: so its reports show the request it sent, not the declared one
        self.request_of_snapshot: Callable[[str], RequestMapping] | None = None
        #: the preflight of the run (tuner.study.preflight), recorded in every report's context
        self.preflight: PreflightReport | None = None
        #: the batch's abort check and the run's stop flag (build_runner sets both)
        self.abort: Abort | None = None
        self.stop: StopFlag | None = None
        #: writes the trials' reports in a helper process (tuner.report.report_worker); close() ends it
        self.report_worker: ReportWorker | None = None

    @property
    def last_search_seconds(self) -> float:
        """Seconds from the first request sent to the last answer read, of this thread's last batch."""
        return float(getattr(self._timing, "search_s", 0.0))

    @property
    def last_handling_seconds(self) -> float:
        """Of that window, the event loop's time on the answers (decode, map, score): tuner time."""
        return float(getattr(self._timing, "handling_s", 0.0))

    def batch_spec(self, request: RequestMapping | None = None) -> tuple[EvalSpec, RequestTemplates]:
        """The spec a batch runs under and its queries' requests: the declared request, or
        (channel: request) the trial's own ``request``, which travels with the trial and is
        never stored as the evaluator's "current" one; the concurrency is this batch's share."""
        from tuner.evaluation.mapping import RequestTemplates

        key = "" if request is None else request.model_dump_json()
        with self._built_lock:
            hit = self._built.get(key)
        if hit is not None:
            return hit
        update: dict[str, Any] = {} if request is None else {"request": request}
        if self.share > 1:
            update["concurrency"] = max(1, self.spec.concurrency // self.share)
        spec = self.spec.model_copy(update=update) if update else self.spec
        built = (spec, RequestTemplates(spec, self.queries))
        with self._built_lock:
            while len(self._built) >= _KEPT_REQUESTS:
                self._built.pop(next(iter(self._built)))
            self._built[key] = built
        return built

    def evaluate(
        self, *, order_seed: int, on_result: Any, defer: bool = False, request: RequestMapping | None = None
    ) -> Any:
        """The batch's BatchResult; with ``defer``, a callable that finishes its scoring and
        checks it (a trial's ``end`` stage calls it, off the backend's critical path).
        ``request``: the trial's rendered request (channel: request), else the declared one."""
        from tuner.evaluation import run_batch
        from tuner.evaluation.batch import BatchAborted, BatchTiming
        from tuner.study.preflight import empty_share_problem

        timing = BatchTiming()
        try:
            spec, templates = self.batch_spec(request)
            pending = run_batch(
                spec,
                self.queries,
                self.qrels,
                order_seed=order_seed,
                on_result=on_result,
                abort=self.abort,
                timing=timing,
                defer=True,
                templates=templates,
            )
        except BatchAborted as exc:
            stop = self.stop
            if stop is not None and stop.is_set() and exc.reason.startswith(stop.reason):
                raise TrialInterrupted(exc.reason) from exc  # a stop, not the config's failure
            raise
        finally:
            self._timing.search_s, self._timing.handling_s = timing.window_s, timing.handling_s

        # A mostly empty batch is a broken request or mapping, not a config that scores 0:
        # failing the trial keeps the 0 out of the sampler's model and under the failure budget.
        # Checked here, before the scoring, so a pipelined study sees the failure at once.
        problem = empty_share_problem(*pending.empty_in_scope(), spec)
        if problem is not None:
            raise EvaluationError(
                f"{problem}; a broken request or response mapping, not a bad config "
                "(tuner check EXPERIMENT shows a raw response); raise evaluation.max_empty_share "
                "if empty results are expected"
            )
        return pending.finish if defer else pending.finish()

    def explain(
        self,
        *,
        request_fields: Mapping[str, Any],
        reader: Any,
        order_seed: int,
        request: RequestMapping | None = None,
    ) -> Any:
        """The explained retrieval of fusion replay (tuner.evaluation.explain_batch.ExplainedBatch),
        timed and stopped like ``evaluate``; ``request`` as there (channel: request)."""
        from tuner.evaluation.batch import BatchAborted, BatchTiming
        from tuner.evaluation.explain_batch import run_explained

        timing = BatchTiming()
        try:
            return run_explained(
                self.batch_spec(request)[0],
                self.queries,
                self.qrels,
                request_fields=request_fields,
                reader=reader,
                order_seed=order_seed,
                abort=self.abort,
                timing=timing,
            )
        except BatchAborted as exc:
            stop = self.stop
            if stop is not None and stop.is_set() and exc.reason.startswith(stop.reason):
                raise TrialInterrupted(exc.reason) from exc
            raise
        finally:
            self._timing.search_s, self._timing.handling_s = timing.window_s, timing.handling_s

    def report_paths(self, result: Any, out_dir: Path, *, detail: str = "full") -> dict[str, Path]:
        """The names tuner.report.write_reports gives its files (stem "report") at ``detail``."""
        from tuner.report.writer import pr_curve_action

        paths = {
            "json": out_dir / "report.json",
            "markdown": out_dir / "report.md",
            "per_query_csv": out_dir / "report_per_query.csv",
        }
        if getattr(result, "threshold_sweep", None) is not None and pr_curve_action(cast("Detail", detail)) != "omit":
            paths["pr_curve_png"] = out_dir / "report_pr_curve.png"
        return paths

    def write_reports(
        self,
        result: Any,
        out_dir: Path,
        *,
        context: Mapping[str, Any],
        config_snapshot: str,
        detail: str = "full",
        pr_curve: str | None = None,
    ) -> dict[str, Path]:
        from tuner.report import ReportContext, write_reports

        spec = self.spec
        if self.request_of_snapshot is not None:
            spec = spec.model_copy(update={"request": self.request_of_snapshot(config_snapshot)})
        ctx = ReportContext(
            title=f"Study {context.get('study')} - trial {context.get('trial')}",
            labels_fingerprint=self.labels_fingerprint,
            labels_db=str(self.experiment.dataset.labels_db),
            url=spec.request.url,
            queries_file=str(self.experiment.dataset.queries),
            spec=spec.model_dump(mode="json"),
            extra={**self._preflight_context(), **context},
        )
        write = self.report_worker.write_reports if self.report_worker is not None else write_reports
        # the protocol's plain strings: write_reports checks the detail (check_detail), a trial passes
        # pr_curve "keep" or None
        paths = write(
            result,
            out_dir,
            context=ctx,
            config_snapshot=config_snapshot,
            detail=cast("Detail", detail),
            markdown="slim",
            pr_curve=cast("PrCurve | None", pr_curve),
        )
        written = {k: Path(v) for k, v in _fields(paths).items() if v is not None}
        if pr_curve is None and written != self.report_paths(result, out_dir, detail=detail):
            raise EvaluationError(
                f"report files {sorted(map(str, written.values()))} differ from the paths recorded on the trial;"
                " update LiveEvaluator.report_paths to tuner.report's naming"
            )
        return written

    def close(self) -> None:
        """End the report helper process, if one was started."""
        if self.report_worker is not None:
            self.report_worker.close()

    def _preflight_context(self) -> dict[str, Any]:
        if self.preflight is None:
            return {}
        return {"preflight": self.preflight.for_reports()}


def _fields(obj: Any) -> dict[str, Any]:
    if hasattr(obj, "_asdict"):
        return dict(obj._asdict())
    if hasattr(obj, "__dataclass_fields__"):
        return {k: getattr(obj, k) for k in obj.__dataclass_fields__}
    return dict(obj)


def spec_fingerprint(spec: Any) -> str:
    """The evaluation settings that change a result: request body and path, response
    mapping, top_k, gains. Host and port are left out (``port: auto`` picks a new one
    each run, and a resumed study must still hit its cache), and so are concurrency,
    timeouts and retries (they change how fast, not what is measured)."""
    from urllib.parse import urlsplit

    data = spec.model_dump(mode="json")
    url = urlsplit(data["request"]["url"])
    data["request"]["url"] = url.path + (f"?{url.query}" if url.query else "")
    for key in (
        "concurrency",
        "timeout_s",
        "retries",
        "max_failed_queries",
        "backoff_s",
        "backoff_max_s",
        "deadline_s",
        "max_response_bytes",
    ):
        data.pop(key, None)
    data["request"].pop("secret_fields", None)  # which values are redacted in records, not what is sent
    return json.dumps(data, sort_keys=True)
