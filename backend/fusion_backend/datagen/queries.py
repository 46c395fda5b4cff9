"""Demo queries: in-scope intents drawn from real listings, written as shoppers type them.

Each in-scope query starts from a listing (so a Fully relevant listing exists, except
for "this week": nothing went live this week, the latest drop holds Mostly ones) and
states some of its attributes. The types lean on different retrievers:

* ``short``: a type and one attribute ("dusty pink sofa", "curtains with blackout lining");
* ``attribute_heavy``: three or four attributes (brand, colour, material, style, feature);
* ``paraphrase``: the less common surface forms only ("midnight blue settee");
* ``long_tail``: a chatty request whose context words belong to another department;
* ``exact``: a model code or a reference number: rare exact tokens;
* ``temporal``: a type and an attribute "this week / this month ..." with
  ``date_hint_days`` and a fixed ``now`` (extra request fields passed to the service).

Out-of-scope queries are customer-service requests (order tracking, returns, refunds,
account, password, shipping); a few name a product, so in the dense space they look
like product searches, and a few share a word with the catalog by accident.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from .catalog import NOW, Product
from .draw import Draw
from .labels import Intent
from .vocabulary import CATEGORIES, MATERIALS, PRODUCT_TYPES, STYLES, colour_forms


@dataclass(frozen=True)
class DemoQuery:
    text: str
    query_type: str
    scope: Literal["in", "oos"]
    intent: Intent | None  # None for out-of-scope queries
    extra: dict[str, object]


# The mix was tuned with the grid in tests/backend_data/test_demo_meaningful.py.
QUERY_COUNTS = {
    "short": 30,
    "attribute_heavy": 30,
    "paraphrase": 35,
    "long_tail": 30,
    "exact": 80,
    "temporal": 45,
}
QUERY_FORM_WEIGHTS = (0.6, 0.25, 0.15)  # how shoppers name attributes (same spread as listings)
QUERY_TYPE_FORM_WEIGHTS = (0.85, 0.1, 0.05)  # ... and product types (mostly the usual word)
SHORT_ATTRS = ("colour", "material", "style", "feature", "feature")
EXACT_KINDS = ("model", "model", "ref")  # brands appear in attribute_heavy queries

_FORMS = {"material": MATERIALS, "style": STYLES}

LONG_TAIL_TEMPLATES = (
    "gift for {who} who loves {use}: a {colour} {type} with {feature}",
    "{colour} {type} with {feature} to go with the {place}",
    "we need a {style} {colour} {type} with {feature}, our evenings are all about {use}",
)


def _common(draw: Draw, forms: tuple[str, ...]) -> str:
    """The everyday form most of the time (what most shoppers type)."""
    return forms[draw.weighted(QUERY_FORM_WEIGHTS[: len(forms)])]


def _rare(draw: Draw, forms: tuple[str, ...]) -> str:
    """One of the less common forms."""
    return forms[1 + draw.index(len(forms) - 1)]


def _words(product: Product, draw: Draw, pick: Callable[[Draw, tuple[str, ...]], str]) -> dict[str, str]:
    words = {attr: pick(draw, table[getattr(product, attr)]) for attr, table in _FORMS.items()}
    words["colour"] = pick(draw, colour_forms(product.colour))
    forms = PRODUCT_TYPES[product.type].forms
    words["type"] = pick(draw, forms) if pick is _rare else forms[draw.weighted(QUERY_TYPE_FORM_WEIGHTS)]
    return words


def _short(p: Product, draw: Draw) -> tuple[str, Intent]:
    w = _words(p, draw, _common)
    attr = draw.pick(SHORT_ATTRS)
    if attr == "feature":
        return f"{w['type']} with {p.feature}", Intent(p.type, feature=p.feature)
    return f"{w[attr]} {w['type']}", Intent(p.type, **{attr: getattr(p, attr)})


def _attribute_heavy(p: Product, draw: Draw) -> tuple[str, Intent]:
    """Four stated attributes: only listings matching (nearly) all of them are Fully or Mostly."""
    w = _words(p, draw, _common)
    template = draw.pick(
        (
            "{brand} {colour} {material} {type} with {feature}",
            "{style} {colour} {material} {type} with {feature}",
            "{colour} {material} {type}, {style} style, {feature}",
            "{brand} {style} {type} in {colour} with {feature}",
        )
    )
    stated = {
        attr: getattr(p, attr)
        for attr in ("brand", "colour", "material", "style", "feature")
        if "{" + attr + "}" in template
    }
    return template.format(brand=p.brand, feature=p.feature, **w), Intent(p.type, **stated)


def _paraphrase(p: Product, draw: Draw) -> tuple[str, Intent]:
    w = _words(p, draw, _rare)
    attrs = draw.sample(("colour", "material", "style"), 1 + draw.index(2))
    words = " ".join(w[a] for a in ("style", "colour", "material") if a in attrs)
    return f"{words} {w['type']}", Intent(p.type, **{a: getattr(p, a) for a in attrs})


def _long_tail(p: Product, draw: Draw) -> tuple[str, Intent]:
    """A chatty request: the product plus context about another part of the home or life.

    The context words are real catalog words of another department, so they pull the
    dense query vector away from the product, while BM25 still weighs the rare product
    words highest.
    """
    w = _words(p, draw, _common)
    other = draw.pick([c for c in CATEGORIES if c != p.category])
    other_type = draw.pick([t for t in PRODUCT_TYPES.values() if t.category == other])
    context = {
        "place": draw.pick(CATEGORIES[other].rooms),
        "use": draw.pick(other_type.uses),
        "part": draw.pick(other_type.parts),
        "who": draw.pick(("my sister", "my dad", "our new flat", "a housewarming", "my partner")),
    }
    template = draw.pick(LONG_TAIL_TEMPLATES)
    text = template.format(feature=p.feature, **context, **w)
    style = p.style if "{style}" in template else None
    return text, Intent(p.type, colour=p.colour, feature=p.feature, style=style)


def _exact(p: Product, draw: Draw) -> tuple[str, Intent]:
    """A model code (the line, any colourway) or a reference number (one colourway)."""
    line = Intent(p.type, material=p.material, style=p.style, feature=p.feature, brand=p.brand, model=p.model)
    if draw.pick(EXACT_KINDS) == "model":
        return draw.pick((p.model, f"{p.brand} {p.model}")), line
    colourway = replace(line, colour=p.colour)
    return draw.pick((f"ref {p.ref}", p.ref, f"{p.brand} {p.ref}")), colourway


# "this week" is 7 days: no listing went live in the last DAYS_AFTER_LAST_DROP days.
_TEMPORAL = (
    (7, "new {attr} {type} this week"),
    (7, "{attr} {type} listed in the past week"),
    (14, "{attr} {type} added in the last two weeks"),
    (30, "new arrivals {attr} {type} this month"),
    (90, "latest {attr} {type} this season"),
)


def _temporal(products: list[Product], draw: Draw) -> tuple[str, Intent, dict[str, object]]:
    hint, template = _TEMPORAL[draw.index(len(_TEMPORAL))]
    # Draw from listings a shopper could mean: inside the hint, or for an empty week the latest drop.
    horizon = hint if hint > (NOW - max(x.date for x in products)).days else 2 * hint
    recent = [x for x in products if (NOW - x.date).days <= horizon]
    p = recent[draw.index(len(recent))]
    attr = draw.pick(("colour", "material"))
    w = _words(p, draw, _common)
    text = template.format(attr=w[attr], type=w["type"])
    intent = Intent(p.type, date_hint_days=hint, **{attr: getattr(p, attr)})
    return text, intent, {"date_hint_days": hint, "now": NOW.isoformat()}


_MAKERS: dict[str, Callable[[Product, Draw], tuple[str, Intent]]] = {
    "short": _short,
    "attribute_heavy": _attribute_heavy,
    "paraphrase": _paraphrase,
    "long_tail": _long_tail,
    "exact": _exact,
}


def in_scope_queries(products: list[Product], draw: Draw) -> list[DemoQuery]:
    queries: list[DemoQuery] = []
    seen: set[str] = set()
    for query_type, count in QUERY_COUNTS.items():
        made = 0
        while made < count:
            extra: dict[str, object] = {}
            if query_type == "temporal":
                text, intent, extra = _temporal(products, draw)
            else:
                text, intent = _MAKERS[query_type](products[draw.index(len(products))], draw)
            if text in seen:  # the same text twice would be one query with two ids: redraw
                continue
            seen.add(text)
            queries.append(DemoQuery(text, query_type, "in", intent, extra))
            made += 1
    return queries


# Customer-service requests the search service should hand off. Most use no catalog
# words at all; one template in four intents names a product (a realistic hard case:
# in the dense space it looks like a product search).
_OOS_TEMPLATES: dict[str, tuple[str, ...]] = {
    "order_tracking": (
        "where is my order",
        "track my order {number}",
        "order status for order number {number}",
        "has my parcel been dispatched yet",
        "tracking link says label created for days",
        "which courier is bringing my order",
        "my {product} order has not arrived yet",
    ),
    "returns": (
        "how do i start a return",
        "i need a returns label",
        "what is your returns policy",
        "return an item bought as a gift",
        "can i return something after 30 days",
        "where can i send a return",
        "return label for the {product} i bought",
    ),
    "refunds": (
        "when will i get my refund",
        "refund not received for order {number}",
        "i was charged twice",
        "when do refunds appear on my statement",
        "partial refund instead of a replacement",
        "refund to another card",
        "money back for a faulty {product}",
    ),
    "account": (
        "change the email address on my account",
        "delete my account",
        "update my billing address",
        "how do i cancel my account",
        "merge my accounts",
        "unsubscribe me from the newsletter",
        "where are my invoices",
        "my account shows the wrong name",
    ),
    "password": (
        "reset my password",
        "forgot password cannot log in",
        "password reset link expired",
        "change my password",
        "locked out after too many login attempts",
        "verification code never arrives",
        "how do i sign in with a new email",
        "reset email went to spam",
    ),
    "shipping": (
        "how long does delivery take",
        "do you ship to ireland",
        "delivery missed who do i contact",
        "can i change my delivery address",
        "is express delivery available",
        "shipping costs to scotland",
        "why is my {product} delivery delayed",
    ),
}


def out_of_scope_queries(products: list[Product], draw: Draw) -> list[DemoQuery]:
    """Every template once, placeholders filled from the catalog (so the count is fixed)."""
    queries = []
    for intent_name, templates in _OOS_TEMPLATES.items():
        for template in templates:
            p = products[draw.index(len(products))]
            product = f"{_common(draw, colour_forms(p.colour))} {_common(draw, PRODUCT_TYPES[p.type].forms)}"
            text = template.format(product=product, number=100000 + draw.index(900000))
            queries.append(DemoQuery(text, intent_name, "oos", None, {}))
    return queries
