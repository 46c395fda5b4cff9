"""The demo catalog's vocabulary: what products exist and the words used for them.

Every attribute value has a canonical name and several surface forms (synonyms and
paraphrases: "sofa" / "couch" / "settee", "navy" / "dark blue" / "midnight blue").
Listings and queries pick surface forms independently, so a query word is often
absent from a relevant listing: BM25 misses it, while the dense space (LSA on the
corpus) can bridge forms that share contexts or appear together. Brands, features,
shades, model codes and reference numbers are rare exact words that BM25 matches and
the dense space blurs. Themes, designers, workshops and review words are copy that is
never graded: realistic noise that costs the dense space dimensions.

Changing anything here changes the generated catalog for every seed; bump
``VOCABULARY_VERSION`` (it is recorded in the manifest).
"""

from __future__ import annotations

from dataclasses import dataclass

VOCABULARY_VERSION = 2


@dataclass(frozen=True)
class ProductType:
    name: str
    category: str
    forms: tuple[str, ...]  # first = canonical
    materials: tuple[str, ...]
    features: tuple[str, ...]  # flavour text, never graded
    parts: tuple[str, ...]  # what the copy talks about: topical words of the type
    uses: tuple[str, ...]


@dataclass(frozen=True)
class Category:
    name: str
    rooms: tuple[str, ...]  # scenario words shared by the category's products
    brands: tuple[str, ...]
    qualities: tuple[str, ...]
    care: tuple[str, ...]


# Each brand sells in one department; its name and model codes are rare exact tokens.
CATEGORIES: dict[str, Category] = {
    c.name: c
    for c in (
        Category(
            "living room furniture",
            ("living room", "lounge", "family room"),
            ("Nordvik", "Castellan", "Hartwell", "Ashgrove", "Bramley", "Osterby", "Calloway", "Pemberton"),
            ("sturdy", "generous", "supportive", "well proportioned", "solidly built", "space saving"),
            (
                "Assembly takes about twenty minutes with the included tools.",
                "Wipe with a damp cloth and keep out of direct sunlight.",
                "Felt pads protect wooden floors from scratches.",
            ),
        ),
        Category(
            "bedroom",
            ("bedroom", "guest room", "master suite"),
            ("Solberg", "Dunmore", "Halden", "Brisa", "Moravia", "Kettering", "Selwyn", "Auden"),
            ("restful", "quiet", "calming", "roomy", "soft to the touch", "sleep friendly"),
            (
                "Fits standard mattress sizes; check the size guide before ordering.",
                "Air the room and vacuum the slats now and then.",
                "Underbed clearance leaves room for storage boxes.",
            ),
        ),
        Category(
            "apparel",
            ("everyday wear", "weekend outfits", "office wear"),
            ("Marlowe", "Kestrel", "Fennick", "Tidewell", "Hollis", "Varga", "Linnet", "Rowntree"),
            ("breathable", "lightweight", "tailored", "easy to layer", "true to size", "soft handle"),
            (
                "Machine wash cold and hang to dry.",
                "The model is 185 cm tall and wears size M.",
                "Cut for a regular fit through the shoulders and chest.",
            ),
        ),
        Category(
            "footwear",
            ("city walking", "weekend trips", "daily commute"),
            ("Corvane", "Pellow", "Stridewell", "Trekka", "Fairstep", "Ambler", "Kinross", "Dashwood"),
            ("grippy", "flexible", "cushioned", "supportive", "all day comfortable", "hard wearing"),
            (
                "Runs true to size; go half a size up for wide feet.",
                "Brush off dirt and use a protector spray before the first wear.",
                "Removable insoles can be replaced with orthotics.",
            ),
        ),
        Category(
            "home textiles",
            ("cosy corners", "reading nook", "window seat"),
            ("Lumora", "Veldmark", "Quillon", "Woolsey", "Threadly", "Marisol", "Hearthly", "Tamsin"),
            ("cosy", "tactile", "heavyweight", "textured", "softly draped", "warm"),
            (
                "Dry clean or gentle machine wash at thirty degrees.",
                "Shake out and air regularly to keep the fibres lofty.",
                "Colours may vary slightly between dye lots.",
            ),
        ),
        Category(
            "kitchen",
            ("home cooking", "breakfast table", "dinner parties"),
            ("Brightwater", "Ravenna", "Okapi", "Copperleaf", "Saltbox", "Emberly", "Fenwick", "Grainger"),
            ("durable", "easy to clean", "heat resistant", "well balanced", "food safe", "chip resistant"),
            (
                "Hand wash recommended to keep the finish bright.",
                "Suitable for gas, electric and induction hobs where noted.",
                "Free from lead and cadmium.",
            ),
        ),
        Category(
            "lighting",
            ("ambient lighting", "reading light", "evening glow"),
            ("Arbor", "Lanterna", "Glimmer", "Lucet", "Halo", "Beacon", "Wickham", "Solace"),
            ("warm", "glare free", "dimmable", "diffused", "focused", "energy efficient"),
            (
                "Takes an E27 bulb up to 40 watts; LED recommended.",
                "Dust the shade with a soft brush.",
                "Supplied with a two metre fabric cable.",
            ),
        ),
        Category(
            "dining and office",
            ("dining room", "home office", "study"),
            ("Trestle", "Harbourne", "Workwell", "Ledger", "Alcove", "Fairbank", "Quorum", "Deskwise"),
            ("ergonomic", "stable", "wipe clean", "extendable", "height adjustable", "compact"),
            (
                "Tighten the fixings after the first month of use.",
                "Protect the surface from hot dishes with coasters.",
                "Weight capacity 120 kg; see the assembly guide for details.",
            ),
        ),
        Category(
            "bath and decor",
            ("bathroom", "hallway", "entrance"),
            ("Softwater", "Mirabel", "Tidepool", "Vessel", "Lumen", "Cloister", "Fernleigh", "Aquila"),
            ("absorbent", "quick drying", "decorative", "eye catching", "spa like", "sculptural"),
            (
                "Wash at forty degrees before first use.",
                "Fix to a solid wall with the supplied brackets.",
                "Wipe with a soft dry cloth; avoid abrasive cleaners.",
            ),
        ),
    )
}

# What a listing suggests pairing it with ("Pairs well with ..."): real product copy
# names other products, which makes BM25 match the wrong type on a shared word.
COMPANIONS: dict[str, tuple[str, ...]] = {
    "living room furniture": ("home textiles", "lighting", "living room furniture"),
    "bedroom": ("home textiles", "lighting", "bedroom"),
    "apparel": ("footwear", "apparel"),
    "footwear": ("apparel", "footwear"),
    "home textiles": ("living room furniture", "bedroom", "home textiles"),
    "kitchen": ("kitchen", "home textiles"),
    "lighting": ("living room furniture", "bedroom", "lighting"),
    "dining and office": ("kitchen", "lighting", "dining and office"),
    "bath and decor": ("home textiles", "bath and decor"),
}

_T = ProductType
PRODUCT_TYPES: dict[str, ProductType] = {
    t.name: t
    for t in (
        _T(
            "sofa",
            "living room furniture",
            ("sofa", "couch", "settee"),
            ("velvet", "leather", "linen"),
            (
                "three-seat frame",
                "deep seat cushions",
                "removable covers",
                "chaise end",
                "pull-out bed",
                "reclining seats",
            ),
            ("seat cushions", "backrest", "armrests", "hardwood frame", "pocket springs", "tapered legs"),
            ("movie nights", "afternoon naps", "entertaining guests", "stretching out"),
        ),
        _T(
            "armchair",
            "living room furniture",
            ("armchair", "accent chair", "lounge chair"),
            ("velvet", "leather", "rattan", "linen"),
            ("padded arms", "high back", "swivel base", "matching footstool", "rocking base", "wingback sides"),
            ("seat pad", "wingback", "armrests", "lumbar cushion", "splayed legs", "curved back"),
            ("reading by the fire", "a quiet corner", "morning coffee", "conversation"),
        ),
        _T(
            "coffee table",
            "living room furniture",
            ("coffee table", "cocktail table", "centre table"),
            ("oak", "walnut", "marble", "steel"),
            ("lower shelf", "rounded corners", "lift top", "hidden storage", "nesting set", "glass inlay"),
            ("tabletop", "lower shelf", "drawer", "bevelled edge", "pedestal base", "hairpin legs"),
            ("board games", "serving snacks", "stacking magazines", "displaying books"),
        ),
        _T(
            "bookcase",
            "living room furniture",
            ("bookcase", "bookshelf", "shelving unit"),
            ("oak", "walnut", "steel"),
            ("five shelves", "adjustable shelves", "wall anchor", "glass doors", "ladder design", "cupboard base"),
            ("shelves", "uprights", "back panel", "cubbies", "crown moulding", "plinth"),
            ("paperbacks", "vinyl records", "plants", "display pieces"),
        ),
        _T(
            "bed frame",
            "bedroom",
            ("bed frame", "bedstead", "platform bed"),
            ("oak", "walnut", "velvet", "steel"),
            (
                "slatted base",
                "upholstered headboard",
                "storage drawers",
                "gas lift storage",
                "canopy posts",
                "low profile",
            ),
            ("headboard", "footboard", "sprung slats", "side rails", "centre support", "mattress platform"),
            ("a king size mattress", "lazy sundays", "guest stays", "reading in bed"),
        ),
        _T(
            "dresser",
            "bedroom",
            ("dresser", "chest of drawers", "bureau"),
            ("oak", "walnut", "rattan"),
            (
                "six drawers",
                "soft-close runners",
                "anti-tip kit",
                "mirror attached",
                "lockable drawer",
                "tall boy design",
            ),
            ("drawers", "drawer pulls", "dovetail joints", "carcass", "top surface", "kick plate"),
            ("folded knitwear", "socks and scarves", "a vanity mirror", "extra storage"),
        ),
        _T(
            "duvet cover",
            "bedroom",
            ("duvet cover", "comforter cover", "quilt cover"),
            ("linen", "cotton", "velvet"),
            (
                "button closure",
                "corner ties",
                "stonewashed finish",
                "zip closure",
                "reversible print",
                "embroidered edge",
            ),
            ("pillowcases", "thread count", "envelope closure", "hem", "weave", "duvet insert"),
            ("warm nights", "layering with throws", "a crisp hotel look", "all seasons"),
        ),
        _T(
            "shirt",
            "apparel",
            ("shirt", "button-down", "button-up"),
            ("linen", "cotton", "denim"),
            ("chest pocket", "relaxed fit", "mother-of-pearl buttons", "short sleeves", "grandad collar", "slim fit"),
            ("collar", "cuffs", "placket", "yoke", "shirttail hem", "sleeves"),
            ("tucking into chinos", "rolling the sleeves", "smart casual days", "summer evenings"),
        ),
        _T(
            "trousers",
            "apparel",
            ("trousers", "pants", "slacks"),
            ("linen", "cotton", "wool"),
            ("pleated front", "tapered leg", "elastic waist", "wide leg", "cargo pockets", "drawstring waist"),
            ("waistband", "inseam", "belt loops", "turn-ups", "fly", "back pockets"),
            ("the commute", "wearing with loafers", "smart occasions", "travel days"),
        ),
        _T(
            "jacket",
            "apparel",
            ("jacket", "coat", "overcoat"),
            ("wool", "leather", "denim", "cotton"),
            (
                "two-button front",
                "quilted lining",
                "hidden hood",
                "waterproof shell",
                "double-breasted front",
                "shearling collar",
            ),
            ("lapels", "lining", "zip", "storm flap", "cuff tabs", "inner pocket"),
            ("chilly mornings", "layering over knitwear", "windy days", "autumn walks"),
        ),
        _T(
            "sweater",
            "apparel",
            ("sweater", "jumper", "pullover"),
            ("wool", "cashmere", "cotton"),
            ("ribbed cuffs", "crew neck", "cable knit", "roll neck", "v neck", "half zip"),
            ("neckline", "ribbing", "knit gauge", "hem", "raglan sleeves", "yarn"),
            ("cold days", "layering over shirts", "cabin weekends", "winter evenings"),
        ),
        _T(
            "dress",
            "apparel",
            ("dress", "frock", "gown"),
            ("linen", "cotton", "silk"),
            ("midi length", "tie waist", "side pockets", "wrap front", "puff sleeves", "open back"),
            ("bodice", "neckline", "skirt", "hemline", "straps", "waist seam"),
            ("garden parties", "weddings", "summer holidays", "date nights"),
        ),
        _T(
            "sneakers",
            "footwear",
            ("sneakers", "trainers", "running shoes"),
            ("leather", "canvas", "suede"),
            ("cushioned sole", "padded collar", "lace-up front", "slip-on design", "reflective trim", "high top"),
            ("outsole", "midsole", "toe cap", "eyelets", "heel counter", "tongue"),
            ("jogging", "gym sessions", "running errands", "country walks"),
        ),
        _T(
            "boots",
            "footwear",
            ("boots", "ankle boots", "chelsea boots"),
            ("leather", "suede"),
            ("stacked heel", "pull tab", "lug sole", "side zip", "shearling lining", "waterproof membrane"),
            ("shaft", "elastic gussets", "welt", "heel", "toe box", "leather upper"),
            ("rainy days", "muddy trails", "winter outings", "nights out"),
        ),
        _T(
            "rug",
            "home textiles",
            ("rug", "carpet", "area rug"),
            ("wool", "jute", "cotton"),
            ("hand-knotted weave", "low pile", "non-slip backing", "shaggy pile", "washable weave", "tasselled ends"),
            ("pile", "fringe", "border", "underlay", "weave", "knots"),
            ("bare floorboards", "zoning an open plan room", "muffling footsteps", "under a dining table"),
        ),
        _T(
            "curtains",
            "home textiles",
            ("curtains", "drapes", "window panels"),
            ("linen", "velvet", "cotton"),
            ("blackout lining", "eyelet header", "floor length", "pencil pleat", "sheer voile", "thermal lining"),
            ("header tape", "lining", "tiebacks", "pleats", "drop", "curtain pole"),
            ("bay windows", "darkening a bedroom", "draughty rooms", "privacy at night"),
        ),
        _T(
            "cushion",
            "home textiles",
            ("cushion", "throw pillow", "scatter cushion"),
            ("velvet", "linen", "wool"),
            ("feather filling", "hidden zip", "piped edge", "bolster shape", "tufted buttons", "pom pom trim"),
            ("cover", "insert", "piping", "zip", "filling", "tassels"),
            ("propping up on the sofa", "styling a bed", "window seats", "adding colour"),
        ),
        _T(
            "throw blanket",
            "home textiles",
            ("throw blanket", "throw", "afghan"),
            ("wool", "cashmere", "cotton"),
            ("fringed edges", "waffle weave", "oversized", "chunky knit", "sherpa backing", "heated wires"),
            ("fringe", "weave", "blanket stitch", "selvedge", "knit", "border"),
            ("snuggling on the couch", "picnics", "chilly evenings", "draping over a bed end"),
        ),
        _T(
            "mug",
            "kitchen",
            ("mug", "cup", "beaker"),
            ("ceramic", "glass", "enamel"),
            ("large handle", "dishwasher safe", "speckled glaze", "double wall", "travel lid", "stackable shape"),
            ("handle", "rim", "glaze", "base", "capacity", "saucer"),
            ("morning coffee", "herbal tea", "hot chocolate", "gifting"),
        ),
        _T(
            "kettle",
            "kitchen",
            ("kettle", "tea kettle", "water boiler"),
            ("steel", "copper", "enamel"),
            (
                "whistling spout",
                "rapid boil",
                "keep-warm base",
                "temperature control",
                "gooseneck spout",
                "cordless base",
            ),
            ("spout", "lid", "handle", "water window", "limescale filter", "base"),
            ("brewing tea", "pour over coffee", "instant noodles", "the stove top"),
        ),
        _T(
            "frying pan",
            "kitchen",
            ("frying pan", "skillet", "sauté pan"),
            ("cast iron", "steel", "copper"),
            ("pour spouts", "oven safe", "induction base", "non-stick coating", "helper handle", "glass lid"),
            ("cooking surface", "handle", "rivets", "base", "sloped sides", "lid"),
            ("searing steak", "frying eggs", "pancakes", "stir frying"),
        ),
        _T(
            "dinner plates",
            "kitchen",
            ("dinner plates", "dinnerware set", "plate set"),
            ("ceramic", "glass", "enamel"),
            ("set of four", "reactive glaze", "stackable", "gold rim", "microwave safe", "hand painted"),
            ("rim", "glaze", "well", "foot ring", "side plates", "bowls"),
            ("family dinners", "everyday meals", "hosting friends", "holiday tables"),
        ),
        _T(
            "table lamp",
            "lighting",
            ("table lamp", "desk lamp", "bedside light"),
            ("brass", "ceramic", "glass", "rattan"),
            ("fabric shade", "dimmer switch", "inline switch", "touch control", "usb port", "adjustable arm"),
            ("lampshade", "bulb holder", "base", "switch", "stem", "cable"),
            ("bedside reading", "a home office", "a console table", "late night study"),
        ),
        _T(
            "floor lamp",
            "lighting",
            ("floor lamp", "standing lamp", "torchiere"),
            ("brass", "steel", "rattan"),
            ("arched arm", "foot switch", "tripod legs", "reading light arm", "marble base", "smart bulb"),
            ("pole", "weighted base", "shade", "arm", "foot switch", "uplighter"),
            ("lighting a sofa corner", "reading chairs", "dark hallways", "tall ceilings"),
        ),
        _T(
            "pendant light",
            "lighting",
            ("pendant light", "hanging lamp", "ceiling pendant"),
            ("glass", "rattan", "brass", "ceramic"),
            ("adjustable cord", "globe shade", "ceiling rose", "cluster of three", "dome shade", "pleated shade"),
            ("shade", "ceiling rose", "suspension cord", "canopy", "diffuser", "bulb"),
            ("kitchen islands", "dining tables", "stairwells", "hallways"),
        ),
        _T(
            "side table",
            "living room furniture",
            ("side table", "end table", "accent table"),
            ("oak", "walnut", "marble", "rattan"),
            ("drawer", "round top", "magazine rack", "tray top", "folding legs", "charging shelf"),
            ("tabletop", "apron", "stretcher", "splayed legs", "shelf", "top surface"),
            ("resting a drink", "a reading lamp", "remote controls", "potted plants"),
        ),
        _T(
            "dining table",
            "dining and office",
            ("dining table", "kitchen table", "dinner table"),
            ("oak", "walnut", "marble", "glass"),
            ("extending leaf", "seats six", "pedestal base", "trestle legs", "round top", "bench included"),
            ("tabletop", "leaves", "trestle", "apron", "pedestal", "edge profile"),
            ("family meals", "sunday lunch", "homework", "dinner parties"),
        ),
        _T(
            "dining chair",
            "dining and office",
            ("dining chair", "kitchen chair", "side chair"),
            ("oak", "walnut", "rattan", "velvet"),
            ("set of two", "upholstered seat", "spindle back", "stackable frame", "armrests", "cane seat"),
            ("seat", "backrest", "spindles", "stretchers", "seat pad", "chair legs"),
            ("leisurely dinners", "breakfast nooks", "extra guests", "kitchen islands"),
        ),
        _T(
            "desk",
            "dining and office",
            ("desk", "writing desk", "workstation"),
            ("oak", "walnut", "steel"),
            ("cable tray", "standing mechanism", "keyboard drawer", "hutch top", "corner shape", "monitor shelf"),
            ("desktop", "drawers", "modesty panel", "legs", "cable grommet", "work surface"),
            ("working from home", "homework", "writing letters", "gaming setups"),
        ),
        _T(
            "office chair",
            "dining and office",
            ("office chair", "desk chair", "task chair"),
            ("mesh", "leather", "velvet"),
            ("lumbar support", "headrest", "adjustable arms", "tilt lock", "swivel castors", "footrest"),
            ("seat", "backrest", "gas lift", "castors", "armrests", "five star base"),
            ("video calls", "home offices", "study sessions", "gaming"),
        ),
        _T(
            "wardrobe",
            "bedroom",
            ("wardrobe", "armoire", "closet"),
            ("oak", "walnut", "rattan"),
            ("hanging rail", "mirrored door", "sliding doors", "shoe rack", "internal drawers", "double doors"),
            ("doors", "hanging rail", "hinges", "cornice", "internal shelves", "plinth base"),
            ("hanging coats", "storing suits", "seasonal clothes", "a guest room"),
        ),
        _T(
            "nightstand",
            "bedroom",
            ("nightstand", "bedside table", "night table"),
            ("oak", "walnut", "rattan", "marble"),
            ("single drawer", "open shelf", "wireless charger", "wall mounted", "two drawers", "cupboard door"),
            ("drawer", "top surface", "shelf", "legs", "back panel", "handle"),
            ("a bedside lamp", "night time reading", "an alarm clock", "a glass of water"),
        ),
        _T(
            "scarf",
            "apparel",
            ("scarf", "muffler", "wrap"),
            ("wool", "cashmere", "silk", "cotton"),
            ("fringed ends", "oversized", "checked pattern", "reversible", "skinny cut", "blanket weight"),
            ("fringe", "weave", "selvedge", "hem", "knit", "border"),
            ("cold commutes", "winter walks", "travel", "gifting"),
        ),
        _T(
            "sandals",
            "footwear",
            ("sandals", "sliders", "flip flops"),
            ("leather", "suede", "canvas"),
            ("ankle strap", "cork footbed", "platform sole", "buckle fastening", "cross straps", "water resistant"),
            ("footbed", "straps", "sole", "buckle", "toe post", "heel cup"),
            ("beach days", "summer holidays", "poolside", "city heat"),
        ),
        _T(
            "bath towel",
            "bath and decor",
            ("bath towel", "towel", "bath sheet"),
            ("cotton", "linen", "bamboo"),
            ("extra large", "quick dry", "hanging loop", "jacquard border", "hotel weight", "set of two"),
            ("pile", "border", "hem", "loop", "weave", "weight"),
            ("after showers", "spa days", "the gym", "guest bathrooms"),
        ),
        _T(
            "bath mat",
            "bath and decor",
            ("bath mat", "shower mat", "bath rug"),
            ("cotton", "bamboo", "jute"),
            ("non-slip backing", "memory foam", "tufted pile", "machine washable", "quick dry", "reversible"),
            ("pile", "backing", "edge", "tufts", "underside", "border"),
            ("stepping out of the shower", "cold tiles", "guest bathrooms", "family bathrooms"),
        ),
        _T(
            "vase",
            "bath and decor",
            ("vase", "flower vase", "bud vase"),
            ("ceramic", "glass", "brass"),
            ("fluted neck", "crackle glaze", "set of three", "wide mouth", "handmade finish", "ribbed body"),
            ("neck", "body", "base", "rim", "glaze", "opening"),
            ("fresh flowers", "dried stems", "mantelpieces", "console tables"),
        ),
        _T(
            "wall mirror",
            "bath and decor",
            ("wall mirror", "mirror", "looking glass"),
            ("brass", "oak", "rattan", "steel"),
            ("arched shape", "bevelled glass", "round frame", "full length", "sunburst frame", "shelf below"),
            ("frame", "glass", "hanging wire", "backing", "edge", "bracket"),
            ("hallways", "getting ready", "small rooms", "bathroom walls"),
        ),
    )
}

# Copy every listing may carry: spread over all products, it blurs the dense space a
# little and gives long queries words that match everything in BM25.
MARKETING: tuple[str, ...] = (
    "Thoughtfully made to last for years.",
    "Our designers tested dozens of samples before choosing this one.",
    "A quiet favourite with our customers.",
    "Made in small batches by a family run workshop.",
    "Finished by hand, so every piece is a little different.",
    "A modern take on a design classic.",
    "Built with responsibly sourced materials.",
    "Simple, honest and easy to live with.",
    "Versatile enough for almost any space.",
    "Great value without cutting corners.",
)

# The "broad category" of the Weakly tier: what a shopper would accept as the same kind
# of thing for the same job (seating, lamps, cookware ...).
FAMILIES = {
    "seating": ("sofa", "armchair"),
    "tables and shelving": ("coffee table", "side table", "bookcase"),
    "bedroom storage": ("dresser", "wardrobe", "nightstand"),
    "beds and bedding": ("bed frame", "duvet cover", "throw blanket"),
    "tops": ("shirt", "sweater", "jacket"),
    "bottoms and dresses": ("trousers", "dress"),
    "accessories": ("scarf",),
    "shoes": ("sneakers", "boots", "sandals"),
    "dining": ("dining table", "dining chair"),
    "office": ("desk", "office chair"),
    "bath": ("bath towel", "bath mat"),
    "decor": ("vase", "wall mirror"),
    "soft furnishings": ("rug", "curtains", "cushion"),
    "drinkware": ("mug", "kettle"),
    "cookware and tableware": ("frying pan", "dinner plates"),
    "lamps": ("table lamp", "floor lamp", "pendant light"),
}
FAMILY = {t: family for family, types in FAMILIES.items() for t in types}


COLOURS: dict[str, tuple[str, ...]] = {
    "navy": ("navy", "dark blue", "midnight blue"),
    "grey": ("grey", "gray", "charcoal"),
    "beige": ("beige", "oatmeal", "sand"),
    "green": ("green", "olive", "sage"),
    "red": ("red", "crimson", "scarlet"),
    "white": ("white", "ivory", "off-white"),
    "black": ("black", "jet black", "ebony"),
    "mustard": ("mustard", "ochre", "golden yellow"),
    "pink": ("pink", "blush", "dusty rose"),
    "brown": ("brown", "tan", "chocolate"),
    "teal": ("teal", "petrol", "blue green"),
    "burgundy": ("burgundy", "wine", "oxblood"),
    "orange": ("orange", "rust", "burnt orange"),
    "lilac": ("lilac", "lavender", "pale purple"),
    "cream": ("cream", "ecru", "natural white"),
    "sky blue": ("sky blue", "powder blue", "light blue"),
    "forest green": ("forest green", "bottle green", "deep green"),
    "terracotta": ("terracotta", "clay", "brick red"),
}

# A colourway's colour is a base colour, often with a shade ("dusty pink"). The dense
# space hardly tells shades apart (the shade words occur with every colour), BM25
# matches them exactly: a shopper asking for "dusty pink" gets exact hits from BM25.
SHADES: tuple[str, ...] = ("pale", "dusty", "deep", "bright", "muted", "warm")


def colour_name(shade: str | None, base: str) -> str:
    return f"{shade} {base}" if shade else base


def colour_forms(colour: str) -> tuple[str, ...]:
    """Surface forms of a colour name: the shade (if any) plus each form of the base."""
    shade, _, base = colour.partition(" ") if colour.split(" ", 1)[0] in SHADES else ("", "", colour)
    return tuple(colour_name(shade, form) for form in COLOURS[base])


MATERIALS: dict[str, tuple[str, ...]] = {
    "velvet": ("velvet", "velour", "plush velvet"),
    "leather": ("leather", "full-grain hide", "nappa"),
    "linen": ("linen", "flax", "washed linen"),
    "rattan": ("rattan", "wicker", "cane"),
    "oak": ("oak", "solid oak", "oak wood"),
    "walnut": ("walnut", "walnut veneer", "dark walnut"),
    "marble": ("marble", "marble top", "stone"),
    "steel": ("steel", "stainless steel", "metal"),
    "cotton": ("cotton", "organic cotton", "cotton percale"),
    "denim": ("denim", "chambray", "jean fabric"),
    "wool": ("wool", "merino", "lambswool"),
    "cashmere": ("cashmere", "cashmere blend", "pashmina"),
    "silk": ("silk", "satin silk", "mulberry silk"),
    "canvas": ("canvas", "cotton canvas", "duck canvas"),
    "suede": ("suede", "brushed suede", "nubuck"),
    "jute": ("jute", "natural fibre", "sisal"),
    "ceramic": ("ceramic", "stoneware", "porcelain"),
    "glass": ("glass", "borosilicate glass", "clear glass"),
    "enamel": ("enamel", "enamelled steel", "enamelware"),
    "copper": ("copper", "hammered copper", "copper-clad"),
    "cast iron": ("cast iron", "cast-iron", "seasoned iron"),
    "brass": ("brass", "brushed brass", "antique brass"),
    "mesh": ("mesh", "breathable mesh", "knit mesh"),
    "bamboo": ("bamboo", "bamboo fibre", "bamboo viscose"),
}

STYLES: dict[str, tuple[str, ...]] = {
    "mid-century": ("mid-century", "retro", "fifties-inspired"),
    "minimalist": ("minimalist", "clean-lined", "understated"),
    "rustic": ("rustic", "farmhouse", "country"),
    "industrial": ("industrial", "loft-style", "warehouse"),
    "scandinavian": ("scandinavian", "nordic", "scandi"),
    "bohemian": ("bohemian", "boho", "eclectic"),
    "classic": ("classic", "traditional", "timeless"),
    "coastal": ("coastal", "beach house", "seaside style"),
    "art deco": ("art deco", "deco", "jazz age"),
    "japandi": ("japandi", "japanese inspired", "zen style"),
    "maximalist": ("maximalist", "bold", "statement"),
    "victorian": ("victorian", "period", "heritage"),
}

# Review snippets: varied everyday words spread at random over all listings. They are
# noise to both retrievers, and they cost the dense space the dimensions it would
# otherwise spend on fine attribute distinctions (like real, messy product copy).
REVIEW_ADJECTIVES: tuple[str, ...] = tuple(
    """
lovely gorgeous practical handy charming elegant chunky slim bold subtle bright muted airy snug
solid neat tidy smart stylish quirky playful sleek rugged refined gentle crisp fresh cheerful
sturdy delicate hefty nimble roomy compact plush silky smooth rough earthy zesty vivid calm
cosy graceful honest humble pretty sharp striking tasteful unfussy vibrant warmhearted wholesome
""".split()
)
REVIEW_WHAT: tuple[str, ...] = tuple(
    """
gift purchase surprise bargain delight treat keeper upgrade favourite find staple addition centrepiece
""".split()
)
REVIEW_WHO: tuple[str, ...] = tuple(
    """
neighbour sister brother friend partner daughter son grandmother flatmate colleague teacher godson
""".split()
)
REVIEW_WHERE: tuple[str, ...] = tuple(
    """
flat house cottage apartment studio loft cabin bungalow terrace townhouse houseboat farmhouse
""".split()
)
REVIEW_TEMPLATES: tuple[str, ...] = (
    "Reviewers call it {a1} and {a2}, a real {what}.",
    "Chosen as a {what} for a {who} and loved for being {a1}.",
    "Rated {a1} by shoppers wanting a {a2} piece for the {where}.",
    "A {a1} {what} that feels {a2} in any {where}.",
)

# Seasonal themes of the copy ("coastal", "alpine", ...): each listing belongs to one.
# They are ungraded, so to retrieval they are structured noise; the dense space spends
# dimensions on them that it would otherwise give to colours and materials.
THEMES: dict[str, tuple[str, ...]] = {
    "coastal": ("driftwood", "seaside", "breeze", "harbour", "shells", "salt air"),
    "alpine": ("chalet", "snowfall", "pine", "fireside", "mountain", "timber cabin"),
    "parisian": ("boulevard", "cafe", "balcony", "bistro", "atelier", "rooftops"),
    "desert": ("dunes", "sunbaked", "cactus", "terracotta", "canyon", "mesa"),
    "tropical": ("palm", "monstera", "humid", "jungle", "lagoon", "hibiscus"),
    "urban": ("skyline", "subway", "rooftop bar", "street art", "downtown", "neon"),
    "cottage": ("hedgerow", "wildflowers", "garden gate", "orchard", "kitchen garden", "hollyhocks"),
    "nautical": ("anchor", "sailing", "rope", "lighthouse", "deck", "captain"),
    "japandi": ("tatami", "wabi sabi", "zen", "bonsai", "shoji", "tea ceremony"),
    "art deco": ("gatsby", "jazz age", "geometric", "ballroom", "cocktail hour", "gilded"),
    "tuscan": ("olive grove", "vineyard", "piazza", "cypress", "villa", "sunlit"),
    "nordic winter": ("hygge", "candlelight", "fjord", "aurora", "frost", "reindeer"),
    "english country": ("manor", "hunting lodge", "tweed", "labrador", "stables", "croquet"),
    "moroccan": ("souk", "riad", "lantern", "spice market", "mosaic", "courtyard"),
    "californian": ("surf", "canyon road", "sunset strip", "avocado", "beach house", "golden hour"),
    "industrial loft": ("exposed brick", "factory", "girders", "concrete", "warehouse district", "rivet"),
    "botanical": ("fern", "greenhouse", "conservatory", "herbarium", "leafy", "potting shed"),
    "retro diner": ("jukebox", "milkshake", "chrome", "checkerboard", "neon glow", "roadside"),
    "gallery": ("curator", "exhibition", "sculpture", "plinth", "white cube", "vernissage"),
    "campfire": ("s'mores", "tent", "lakeside", "kindling", "starry night", "canoe"),
    "harvest": ("pumpkins", "hayride", "apple picking", "cider", "bonfire", "maple"),
    "riviera": ("yacht", "promenade", "limoncello", "cliffside", "espadrilles", "marina"),
    "safari": ("savannah", "acacia", "binoculars", "watering hole", "khaki tents", "sundowner"),
    "library": ("leather bound", "reading room", "first editions", "ladder", "archive", "quill"),
    "orchard": ("blossom", "pear trees", "beehives", "wicker baskets", "jam jars", "meadow"),
    "rainforest": ("canopy walk", "waterfall", "orchids", "mist", "toucan", "vines"),
    "highlands": ("heather", "loch", "tartan", "glen", "stags", "peat fire"),
    "mediterranean": ("whitewashed", "bougainvillea", "olive oil", "fishing boats", "azure", "siesta"),
    "midcentury modern": ("atomic", "starburst", "space age", "boomerang", "sputnik", "cocktail bar"),
    "scandi summer": ("midsummer", "archipelago", "sauna", "berries", "white nights", "jetty"),
    "winter market": ("mulled wine", "chestnuts", "fairy lights", "gingerbread", "ice rink", "carols"),
    "studio pottery": ("kiln", "wheel thrown", "slip", "potter", "clay dust", "firing"),
    "boathouse": ("oars", "regatta", "river bank", "rowing", "clinker", "moorings"),
    "vineyard": ("grapevines", "harvest table", "wine cellar", "barrels", "terroir", "tasting"),
    "seaside town": ("pier", "fish and chips", "gulls", "beach huts", "promenade lights", "rock pools"),
    "mountain lodge": ("antlers", "snowshoes", "timber beams", "stone hearth", "ski boots", "cocoa"),
    "artist loft": ("easel", "canvas stacks", "skylight", "paint splatters", "charcoal sketches", "turpentine"),
    "garden party": ("bunting", "lemonade", "croquet lawn", "roses", "picnic rug", "string quartet"),
    "desert bloom": ("agave", "sagebrush", "adobe", "sunrise", "wild poppies", "arroyo"),
    "city break": ("boutique hotel", "tram", "rooftop terrace", "flea market", "gallery hop", "espresso"),
}
THEME_TEMPLATES: tuple[str, ...] = (
    "Inspired by {w1} and {w2}.",
    "Think {w1}, {w2} and {w3}.",
    "Part of our {theme} story: {w1} meets {w2}.",
    "It brings a little {theme} mood home, all {w1} and {w2}.",
    "Picture {w1} at dusk with {w2} nearby.",
    "Our {theme} edit was shot among {w1} and {w3}.",
    "A nod to {w1}, {w2} and lazy afternoons.",
    "Styled for the {theme} look with hints of {w3}.",
)

# Who designed a piece and where it is made: many rare names, each a small cluster
# of listings, the way a large real catalog has thousands of unrelated proper nouns.
DESIGNERS: tuple[str, ...] = tuple(
    """
Aalto Abeni Adair Ahlberg Alcott Almeida Amaro Anselm Arden Asher Baird Balfour Barrow Beaumont
Bellamy Bexley Birch Blythe Bonnard Brandt Caius Calder Carrow Castell Cavell Cleary Colfax Corin
Dacre Dalby Delphine Devlin Dorrit Dresden Eames Ellery Elsworth Emrys Esmond Farrow Fenwright Finlay
Garnier Gideon Glenister Greaves Hadley Halloran Harlow Hawthorne Ilsley Imogen Ingram Ivers Jansen
Jarrow Juno Keeling Kendrick Kilbride Lachlan Lavelle Leighton Lindqvist Lorimer Madoc Malory Merrow
Nyberg Oakes Orsino Pascoe Quentin Radley Rennick Sandell Thackery Ulverston Vance Wexley Yardley
""".split()
)
WORKSHOPS: tuple[str, ...] = tuple(
    """
Porto Lisbon Valencia Bruges Ghent Lyon Turin Bologna Krakow Brno Tallinn Riga Vilnius Bergen
Aarhus Malmo Tampere Galway Cork Leeds Bristol Glasgow Kyoto Nagoya Busan Hanoi Oaxaca Puebla
Cusco Mendoza Marrakech Fez Izmir Tbilisi Kochi Jaipur Chiang Mai Bandung Hobart Dunedin
""".split()
)
