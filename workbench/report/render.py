"""A `Report` as an HTML page (autoescaped jinja2) and as Markdown (for code-hosting sites).

Both open without a server: figures are relative PNG links next to the page, the CSS is
inline, nothing is fetched from the network.
"""

from __future__ import annotations

import re
from functools import lru_cache

import jinja2

from workbench.report.document import Report
from workbench.stats.outcomes import Outcome


# Characters Markdown would read as markup inside running text.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]#|~])")


def md_text(text: object) -> str:
    """Plain text for Markdown: markup characters backslash-escaped, HTML neutralised
    (code-hosting sites render inline HTML), line breaks kept as breaks."""
    s = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return s.replace("\n", "  \n")


def md_cell(text: object) -> str:
    """A table cell: like md_text, on one line (a newline would end the table row)."""
    return md_text(str(text).replace("\n", " ")).replace("  \n", " ")


@lru_cache(maxsize=2)
def _environment(markdown: bool) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("workbench.report", "templates"),
        autoescape=not markdown,  # HTML: every {{ }} is escaped, study text included
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["md"] = md_text
    env.filters["cell"] = md_cell
    return env


def render_html(report: Report) -> str:
    return _environment(False).get_template("report.html.j2").render(report=report,
                                                                      outcomes=Outcome)


def render_markdown(report: Report) -> str:
    text = _environment(True).get_template("report.md.j2").render(report=report)
    text = re.sub(r"\n{3,}", "\n\n", text)  # the template's blocks leave runs of blank lines
    return text.strip() + "\n"
