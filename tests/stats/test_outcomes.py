"""The verdict outcomes as one type (workbench.stats.outcomes): its words are written there
only, and what the reports read from it (labels, badges, what decides) stays as shipped."""

from __future__ import annotations

import json
import re
from pathlib import Path

from workbench.stats.outcomes import CEILING_LABEL, DECIDED, Outcome

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "workbench" / "stats" / "outcomes.py"
# An outcome's words as a literal: quoted on their own ("holds"), or starting a quoted label
# ('holds (only A learned)'); a CSS rule (.does-not-hold) or Markdown bold (**holds**).
WORDS = "|".join(re.escape(o.value) for o in Outcome)
# torch.div(..., rounding_mode="floor") names a rounding, not the outcome.
LITERAL = re.compile(rf"""(?<!rounding_mode=)["']({WORDS})(["']| \()|\.({'|'.join(o.css_class for o in Outcome)}) \{{|\*\*({WORDS})\*\*""")


def test_every_outcome_word_is_written_in_the_type_only():
    sources = [*(ROOT / "workbench").rglob("*.py"), *(ROOT / "plugins").rglob("*.py"),
               *(ROOT / "workbench" / "report" / "templates").iterdir()]
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in sources
             if path != HOME
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if LITERAL.search(line)]
    assert not found, "outcome words outside workbench/stats/outcomes.py:\n" + "\n".join(found)


def test_the_shipped_outcomes_keep_their_words_and_what_decides():
    assert [str(o) for o in Outcome] == ["holds", "does not hold", "inconclusive", "not tested", "equivalent",
                                         "ceiling", "floor", "identical", "not reached"]
    assert DECIDED == (Outcome.HOLDS, Outcome.DOES_NOT_HOLD, Outcome.EQUIVALENT)
    assert [o for o in Outcome if not o.final] == [Outcome.INCONCLUSIVE]
    assert json.dumps([Outcome.NOT_TESTED]) == '["not tested"]' and Outcome("not tested") is Outcome.NOT_TESTED


def test_a_label_carries_the_reason_only_where_the_outcome_has_one():
    assert Outcome.INCONCLUSIVE.label("the interval contains 0") == "inconclusive (the interval contains 0)"
    assert Outcome.HOLDS.label("the difference lies above 0") == "holds"
    assert Outcome.CEILING.label("both at the best value") == CEILING_LABEL + " (both at the best value)"
    assert CEILING_LABEL == "ceiling: the task does not separate them"
    assert Outcome.FLOOR.label("both at 0") == "floor: the task does not separate them (both at 0)"
    assert Outcome.DOES_NOT_HOLD.css_class == "does-not-hold"
