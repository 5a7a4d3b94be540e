"""Fenced code blocks of the READMEs, with their language and location."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .common import ROOT, CheckFailed


@dataclass
class Block:
    file: str
    line: int  # of the first line inside the fence
    lang: str
    text: str

    @property
    def name(self) -> str:
        stem = self.file.removesuffix(".md").lower().replace("/", "-")
        return re.sub(r"[^a-z0-9-]", "-", f"{stem}-l{self.line}")

    @property
    def where(self) -> str:
        last = self.line + self.text.count("\n") - 1
        return f"{self.file}:{self.line}-{last}"


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


def extract_blocks(relative: str) -> list[Block]:
    """Fenced code blocks of one Markdown file, with their language."""
    lines = (ROOT / relative).read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        info = opening["info"].strip().split()
        lang = info[0].lower() if info else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped.startswith(fence) and set(stripped) <= {fence[0]}:
                break
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        if j == len(lines):
            raise CheckFailed(f"{relative}:{i + 1}: code fence never closed")
        blocks.append(Block(relative, i + 2, lang, "\n".join(body) + "\n"))
        i = j + 1
    return blocks
