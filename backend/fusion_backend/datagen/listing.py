"""Listing copy: the title and description of a product, as a shop would write them.

The copy is where lexical and dense retrieval come apart (measured in docs/data.md):

* attribute words vary between surface forms ("navy", "dark blue", "midnight blue"),
  the description often naming an attribute a second way, so the dense space learns
  that forms belong together while BM25 only matches the literal one;
* most descriptive words are shared by the whole department and every listing
  carries theme and review sentences, which spend the dense space's dimensions on
  structure that is not graded, so it blurs rare exact words (features, brands,
  shades, model and reference numbers) that BM25 matches exactly;
* cross-sell sentences name other products ("Pairs well with a walnut bookshelf"),
  which BM25 takes literally and the dense space mostly ignores.

The constants below were tuned with the grid of tests/backend_data/test_demo_meaningful.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from .catalog import Product
from .draw import Draw
from .vocabulary import (
    CATEGORIES,
    COLOURS,
    COMPANIONS,
    DESIGNERS,
    MARKETING,
    MATERIALS,
    PRODUCT_TYPES,
    REVIEW_ADJECTIVES,
    REVIEW_TEMPLATES,
    REVIEW_WHAT,
    REVIEW_WHERE,
    REVIEW_WHO,
    STYLES,
    THEME_TEMPLATES,
    THEMES,
    WORKSHOPS,
    colour_forms,
)

FORM_WEIGHTS = (0.6, 0.25, 0.15)  # how often a listing uses each surface form
SECOND_FORM_P = 0.5  # chance the description names an attribute with another form
OWN_WORDS_P = 0.2  # chance a copy slot uses the type's own words, not the department's
THEME_SENTENCES = 5
REVIEWS = 2
CROSS_SELL_P = 0.6


def _form(draw: Draw, forms: Sequence[str]) -> int:
    return draw.weighted(FORM_WEIGHTS[: len(forms)])


def _other(draw: Draw, forms: Sequence[str], first: int) -> str:
    """A second mention: another form with probability SECOND_FORM_P, else the same one."""
    if draw.chance(SECOND_FORM_P):
        return forms[(first + 1 + draw.index(len(forms) - 1)) % len(forms)]
    return forms[first]


def _article(word: str) -> str:
    return "An" if word[0] in "aeiou" else "A"


def render(product: Product, draw: Draw) -> tuple[str, str]:
    """Title and description of one listing, with paraphrased attribute mentions."""
    ptype = PRODUCT_TYPES[product.type]
    forms = {
        "type": ptype.forms,
        "colour": colour_forms(product.colour),
        "material": MATERIALS[product.material],
        "style": STYLES[product.style],
    }
    chosen = {key: _form(draw, values) for key, values in forms.items()}
    first = {key: forms[key][i] for key, i in chosen.items()}
    second = {key: _other(draw, forms[key], i) for key, i in chosen.items()}
    title = f"{product.brand} {first['style']} {first['colour']} {first['material']} {first['type']}".title()
    category = CATEGORIES[product.category]
    room = draw.pick(category.rooms)
    # Most copy words are shared by the department (a sofa and an armchair both have
    # armrests and suit movie nights), so the dense space confuses types within one.
    parts = draw.sample(ptype.parts if draw.chance(OWN_WORDS_P) else _department(product.category, "parts"), 3)
    uses = draw.sample(ptype.uses if draw.chance(OWN_WORDS_P) else _department(product.category, "uses"), 2)
    qualities = draw.sample(category.qualities, 2)
    sentences = [
        f"{_article(second['style'])} {second['style']} {second['type']} in {second['colour']} "
        f"{second['material']}, made for the {room}.",
        f"The {parts[0]} and {parts[1]} are {qualities[0]}, and the {parts[2]} is {qualities[1]}.",
        f"Perfect for {uses[0]} and {uses[1]}.",
        f"It comes with {product.feature}.",
        draw.pick(MARKETING),
        draw.pick(category.care),
        f"Designed by {draw.pick(DESIGNERS)} and made in {draw.pick(WORKSHOPS)}.",
        f"Model {product.model} from {product.brand}, ref {product.ref}.",
    ]
    sentences[1:1] = _theme(draw)
    sentences += [_review(draw) for _ in range(REVIEWS)]
    if draw.chance(CROSS_SELL_P):
        sentences.append(_cross_sell(product, draw))
    return title, " ".join(sentences)


def _theme(draw: Draw) -> list[str]:
    theme = draw.pick(list(THEMES))
    out = []
    for template in draw.sample(THEME_TEMPLATES, THEME_SENTENCES):
        w1, w2, w3 = draw.sample(THEMES[theme], 3)
        out.append(template.format(theme=theme, w1=w1, w2=w2, w3=w3))
    return out


def _cross_sell(product: Product, draw: Draw) -> str:
    category = draw.pick(COMPANIONS[product.category])
    others = [t for t in PRODUCT_TYPES.values() if t.category == category and t.name != product.type]
    other = others[draw.index(len(others))]
    colour = COLOURS[draw.pick(list(COLOURS))]
    material = MATERIALS[draw.pick(other.materials)]
    colour_word = colour[_form(draw, colour)]
    return (
        f"Pairs well with {_article(colour_word).lower()} {colour_word} {material[_form(draw, material)]} "
        f"{other.forms[_form(draw, other.forms)]}."
    )


def _department(category: str, field: str) -> list[str]:
    words = [w for t in PRODUCT_TYPES.values() if t.category == category for w in getattr(t, field)]
    return list(dict.fromkeys(words))


def _review(draw: Draw) -> str:
    a1, a2 = draw.sample(REVIEW_ADJECTIVES, 2)
    return draw.pick(REVIEW_TEMPLATES).format(
        a1=a1, a2=a2, what=draw.pick(REVIEW_WHAT), who=draw.pick(REVIEW_WHO), where=draw.pick(REVIEW_WHERE)
    )
