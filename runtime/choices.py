"""The names of modes, schedules and verification rules, in a module that imports nothing, so that the
CLI can offer them as choices without loading the runtime (runtime/session.py, pearl.py and
verification.py implement them)."""

MODES = ("auto", "ar", "self", "model", "head", "lookup", "hier")
SCHEDULES = ("sequential", "pearl")
VERIFY_RULES = ("exact", "specdec")
