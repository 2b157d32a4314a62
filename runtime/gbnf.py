"""`guided_decoding.ebnf`: which grammar it is, and a GBNF grammar as llama.cpp reads it, for
llguidance's converter. Stdlib only: the input reader runs it on the device.

llguidance's GBNF-to-Lark converter reads `\\uXXXX` and `\\UXXXXXXXX` escapes wrongly (it drops
their leading zeros) and takes `.` for Lark's, which stops at a newline, where llama.cpp's `.` is
any character; and it guesses a Lark grammar that begins `?start:` to be GBNF. So the format is
chosen here (GBNF has `::=`), and a GBNF grammar's escapes and dots are written the way the
converter reads them before it is given the text."""
from __future__ import annotations

import re

ANY = '([^\\x00] | "\\x00")'  # (llama.cpp's `.`: any character, a newline too)
_NOT_RULES = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|#[^\n]*|//[^\n]*', re.DOTALL)


def is_gbnf(text: str) -> bool:
    """Whether an `ebnf` grammar is GBNF (its rules `name ::= ...`) rather than Lark (`name: ...`):
    by `::=` outside its strings and comments."""
    return "::=" in _NOT_RULES.sub("", text)


def llama_cpp(text: str) -> str:
    """A GBNF grammar with its \\u and \\U escapes as literal characters (\\xNN below 0x80, where a
    character may be special) and each `.` outside strings and classes as any character."""
    out, i, state = [], 0, None  # state: None, '"' (a string), "[" (a class), "#" (a comment)
    while i < len(text):
        c = text[i]
        if state in ('"', "[") and c == "\\" and i + 1 < len(text):
            width = {"u": 4, "U": 8}.get(text[i + 1])
            digits = text[i + 2:i + 2 + width] if width else ""
            if width and len(digits) == width and all(d in "0123456789abcdefABCDEF" for d in digits):
                code = int(digits, 16)
                if code < 0x80:
                    out.append(f"\\x{code:02X}")
                elif code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF:
                    out.append(chr(code))
                else:  # (no character: llguidance says so)
                    out.append(text[i:i + 2 + width])
                i += 2 + width
                continue
            out.append(text[i:i + 2])
            i += 2
            continue
        if state is None:
            if c == ".":
                out.append(ANY)
                i += 1
                continue
            state = {'"': '"', "[": "[", "#": "#"}.get(c)
        elif (state == '"' and c == '"') or (state == "[" and c == "]") or (state == "#" and c == "\n"):
            state = None
        out.append(c)
        i += 1
    return "".join(out)
