"""Importers: public test collections -> the service's corpus + the tuner's query set and labels.

Each importer returns a :class:`Dataset`; :func:`write_dataset` writes it as a bundle
(``corpus.jsonl``, ``NAME.queries.jsonl``, ``NAME.qrels.txt``, ``manifest.json``, with
``named=True``) and :func:`ready_files` renders the ready ``config.yaml``, ``space.yaml``
and ``experiment.yaml``. Command line (writes both):
``python -m fusion_backend.importers cranfield|cacm|trec|beir|files ... --out DIR``.
"""

from .beir import import_beir
from .cacm import import_cacm
from .cranfield import import_cranfield
from .dataset import Dataset, Document, Judgment, Query, write_dataset
from .errors import DataFormatError
from .files import import_files
from .grades import CLEVERDON, GradeMap, auto_grade_map, parse_grade_map
from .ready import ready_files
from .trec import import_trec

__all__ = [
    "CLEVERDON",
    "DataFormatError",
    "Dataset",
    "Document",
    "GradeMap",
    "Judgment",
    "Query",
    "auto_grade_map",
    "import_beir",
    "import_cacm",
    "import_cranfield",
    "import_files",
    "import_trec",
    "parse_grade_map",
    "ready_files",
    "write_dataset",
]
