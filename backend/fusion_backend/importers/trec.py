"""TREC collections: topics, qrels, optional documents and run files.

* Topics: the classic ``<top> <num> Number: 301 <title> ... <desc> Description: ...
  <narr> ...</top>`` layout (closing tags optional), or a TSV ``qid<TAB>text`` file.
* Qrels: ``qid iter docno rel`` (or the other forms qrelfiles reads); codes mapped to
  grades 0..3 by ``--grade-map`` (default: auto, see grades.auto_grade_map). Topics
  with no judgment at all follow ``--unjudged`` (default drop, see unjudged.py).
* Documents (optional): TREC SGML files ``<DOC><DOCNO>..</DOCNO> ... </DOC>``, plain or
  .gz; title from HEADLINE/TITLE/HEAD, text from TEXT, date from DATE when it parses.
  Without documents the corpus lists every doc id seen in qrels and runs with empty
  text, which is enough to fuse ``run`` sources but not to serve bm25 or dense.
* Runs (optional, TREC / JSONL / JSON, see runfiles.py): validated and rewritten into
  ``runs/<name>.run`` in canonical form (sorted by query, score descending, ties by
  docno descending as trec_eval breaks them, ranks renumbered from 1, scores at full
  precision), ready for the service's ``data.runs``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .dataset import Dataset, Document, Judgment, Query, Scope
from .errors import DataFormatError
from .grades import GradeMap, auto_grade_map
from .qrelfiles import RawQrel, parse_qrels
from .querytypes import length_type
from .runfiles import convert_runs
from .textfile import decode, read_bytes, split_lines
from .unjudged import Policy, apply_policy

QueryField = Literal["title", "desc", "title+desc"]
SHORT_MAX_WORDS = 6

_TOPIC_TAGS = ("num", "title", "desc", "narr")
_TAG = re.compile(r"<(/?)([a-z]+)>", re.IGNORECASE)  # every tag ends the field before it
_FIELD_PREFIX = re.compile(r"^\s*(Number|Topic|Description|Narrative)\s*:\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Topic:
    topic_id: str
    title: str
    desc: str
    line: int

    def text(self, field: QueryField) -> str:
        if field == "title":
            return self.title
        if field == "desc":
            return self.desc
        return f"{self.title} {self.desc}".strip()


# ---------------------------------------------------------------- topics


def parse_topics(path: Path) -> list[Topic]:
    text = decode(read_bytes(path))
    if "<top>" in text.lower():
        return _parse_sgml_topics(path, text)
    return _parse_tsv_topics(path, split_lines(text))


def _parse_sgml_topics(path: Path, text: str) -> list[Topic]:
    topics: list[Topic] = []
    fields: dict[str, str] = {}
    open_tag: str | None = None
    start = 0
    top_line = 0

    def flush(end: int) -> None:
        if open_tag is not None and open_tag in _TOPIC_TAGS:
            body = " ".join(text[start:end].split())
            fields[open_tag] = _FIELD_PREFIX.sub("", body)

    for match in _TAG.finditer(text):
        closing, tag = match.group(1) == "/", match.group(2).lower()
        line = text.count("\n", 0, match.start()) + 1
        flush(match.start())
        open_tag = None if closing else tag
        start = match.end()
        if tag == "top" and not closing:
            fields, top_line = {}, line
        elif tag == "top" and closing:
            topics.append(_topic(path, top_line, fields))
            fields = {}
    if fields:
        raise DataFormatError.at(path, top_line, "topic opened with <top> is never closed", "add the missing </top>")
    return topics


def _topic(path: Path, line: int, fields: dict[str, str]) -> Topic:
    number = fields.get("num", "").split()
    if not number:
        raise DataFormatError.at(path, line, "topic has no <num>", "add '<num> Number: <id>' to the topic")
    title, desc = fields.get("title", ""), fields.get("desc", "")
    if not title and not desc:
        raise DataFormatError.at(
            path, line, f"topic {number[0]} has neither <title> nor <desc> text", "add a <title> line"
        )
    return Topic(number[0], title, desc, line)


def _parse_tsv_topics(path: Path, lines: list[str]) -> list[Topic]:
    topics = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        topic_id, sep, text = line.partition("\t")
        if not sep or not text.strip():
            raise DataFormatError.at(
                path,
                number,
                "expected 'qid<TAB>query text' (or SGML <top> topics)",
                "separate the id and the text with one tab",
            )
        topics.append(Topic(topic_id.strip(), " ".join(text.split()), "", number))
    return topics


# ---------------------------------------------------------------- qrels


def grade_qrels(path: Path, raw: list[RawQrel], grade_map: GradeMap | None) -> tuple[list[Judgment], GradeMap]:
    grade_map = grade_map or auto_grade_map((q.code for q in raw), path)
    return [Judgment(q.query_id, q.doc_id, grade_map.grade(q.code, path, q.line)) for q in raw], grade_map


# ---------------------------------------------------------------- documents

_DOC = re.compile(r"<DOC>(.*?)</DOC>", re.IGNORECASE | re.DOTALL)
_TITLE_TAGS = ("HEADLINE", "TITLE", "HEAD", "HL")


def _element(body: str, tag: str) -> str | None:
    match = re.search(rf"<{tag}\b[^>]*>(.*?)</{tag}>", body, re.IGNORECASE | re.DOTALL)
    if match is None:
        return None
    return " ".join(re.sub(r"<[^>]+>", " ", match.group(1)).split())


def parse_date(value: str | None) -> str | None:
    """ISO ``YYYY-MM-DD``, ``YYYYMMDD`` or TREC's ``YYMMDD`` (19YY); anything else -> None."""
    if not value:
        return None
    digits = re.search(r"\b(\d{4})-(\d{2})-(\d{2})\b", value)
    if digits:
        year, month, day = digits.groups()
    else:
        compact = re.search(r"\b(\d{8}|\d{6})\b", value)
        if not compact:
            return None
        raw = compact.group(1)
        year, month, day = (raw[:4], raw[4:6], raw[6:]) if len(raw) == 8 else ("19" + raw[:2], raw[2:4], raw[4:])
    if not (1 <= int(month) <= 12 and 1 <= int(day) <= 31):
        return None
    return f"{year}-{month}-{day}"


def parse_documents(path: Path) -> list[Document]:
    text = decode(read_bytes(path))
    documents = []
    for match in _DOC.finditer(text):
        body = match.group(1)
        docno = _element(body, "DOCNO")
        if not docno:
            line = text.count("\n", 0, match.start()) + 1
            raise DataFormatError.at(path, line, "<DOC> without a <DOCNO>", "give every document a <DOCNO>")
        title = next((t for t in (_element(body, tag) for tag in _TITLE_TAGS) if t), "")
        documents.append(Document(docno, title, _element(body, "TEXT") or "", parse_date(_element(body, "DATE"))))
    if not documents:
        raise DataFormatError.at(
            path, None, "no <DOC>...</DOC> records found", "pass TREC SGML document files to --docs"
        )
    return documents


# ---------------------------------------------------------------- import


def topic_queries(
    topics: Path, query_field: QueryField, short_max_words: int, source: str, scope: Scope = "in"
) -> list[Query]:
    """The topics of ``topics`` (SGML or TSV) as queries, refusing duplicate ids."""
    seen: dict[str, int] = {}
    queries = []
    for topic in parse_topics(topics):
        if topic.topic_id in seen:
            raise DataFormatError.at(
                topics,
                topic.line,
                f"topic {topic.topic_id} already defined on line {seen[topic.topic_id]}",
                "keep one definition per topic",
            )
        seen[topic.topic_id] = topic.line
        text = topic.text(query_field)
        if not text:
            raise DataFormatError.at(
                topics, topic.line, f"topic {topic.topic_id} has no {query_field} text", "choose another --query-field"
            )
        query_type = length_type(text, short_max_words) if scope == "in" else "off_topic"
        queries.append(Query(topic.topic_id, text, query_type, source, scope=scope))
    return queries


def import_trec(
    topics: Path,
    qrels: Path,
    *,
    docs: list[Path] | None = None,
    runs: list[str] | None = None,
    query_field: QueryField = "title",
    grade_map: GradeMap | None = None,
    short_max_words: int = SHORT_MAX_WORDS,
    source: str = "trec",
    unjudged: Policy = "drop",
) -> tuple[Dataset, dict[str, str]]:
    """The bundle plus its extra files (``runs/<name>.run`` -> text)."""
    queries = topic_queries(topics, query_field, short_max_words, source)
    judgments, used_map = grade_qrels(qrels, parse_qrels(qrels), grade_map)
    kept = apply_policy(queries, judgments, unjudged, qrels)
    converted = convert_runs(runs or [], [q.query_id for q in queries])
    documents = _documents(docs, judgments, converted.doc_ids)
    manifest = {
        "source": {"topics": str(topics), "qrels": str(qrels), "docs": [str(d) for d in docs or []]},
        "grade_mapping": {"name": used_map.name, "codes": used_map.describe()},
        "query_field": query_field,
        "query_type_rule": f"short: <= {short_max_words} words, else long_tail",
        "unjudged": kept.manifest(),
        "corpus_stub": not docs,
        "runs": converted.paths,
    }
    return Dataset(source, documents, kept.queries, judgments, manifest), converted.files


def _documents(docs: list[Path] | None, judgments: list[Judgment], run_doc_ids: list[str]) -> list[Document]:
    if docs:
        return [doc for path in docs for doc in parse_documents(path)]
    ids = dict.fromkeys([j.doc_id for j in judgments] + run_doc_ids)
    return [Document(doc_id, "", "") for doc_id in ids]
