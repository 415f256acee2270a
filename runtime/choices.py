"""The names of modes, schedules and verification rules, in a module that imports nothing, so that the
CLI can offer them as choices without loading the runtime. MODES is the one list of modes: the decoder's
drafters (runtime/assemble.py), the plan's tables (runtime/plan.py) and the batch scheduler's modes are
checked against it (tests/test_plan.py). Its order is the order the bench runs and reports them in."""

MODES = ("ar", "self", "model", "head", "lookup", "hier", "auto")
SCHEDULES = ("sequential", "pearl")
VERIFY_RULES = ("exact", "specdec")
