"""Markdown stripped to its text, the way Gitea reads a body for issue references.

Gitea's `modules/markup/mdstripper` (`StripMarkdownBytes`) renders only the text nodes of
the parsed Markdown: fenced and indented code blocks, inline code, HTML blocks and comments,
raw inline HTML and the text of links never reach `modules/references`, so `Closes #3`
inside a code block or an HTML comment is no reference. Text nodes that do not follow one
another are kept apart by a line break (a keyword and a number split by emphasis do not
join). markdown-it parses CommonMark as goldmark does.
"""

from __future__ import annotations

from collections.abc import Sequence

from markdown_it import MarkdownIt
from markdown_it.token import Token

_PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])


def strip_markdown(text: str) -> str:
    """The text nodes of `text`, one paragraph after another."""
    out: list[str] = []
    for token in _PARSER.parse(text):
        if token.type == "inline" and token.children:
            _text_of(token.children, out)
    return "".join(out)


def _text_of(children: Sequence[Token], out: list[str]) -> None:
    in_link = 0
    joined = False  # the previous node was text: goldmark coalesces the two
    for child in children:
        if child.type == "link_open":
            in_link += 1
        elif child.type == "link_close":
            in_link -= 1
        elif child.type == "text" and not in_link:
            if not joined and out:
                out.append("\n")
            out.append(child.content)
            joined = True
            continue
        elif child.type in ("softbreak", "hardbreak"):
            out.append("\n")
        joined = False
